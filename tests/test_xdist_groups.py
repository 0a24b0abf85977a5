"""The suite's xdist groups take effect: a test using a module fixture runs in its module's group.

`make test` runs `--dist loadgroup`, and tests/conftest.py puts every test that uses a shared (module,
package or session) fixture of the project into its module's group, so that the fixture (often a server or
a campaign) is made once, on one worker. pytest-xdist marks a grouped test by suffixing its node id on the
worker with `@<group>`; when that suffix is missing the groups are lost (pytest 9 with pytest-xdist 3.8) and
each worker builds every shared fixture again.
"""

import pytest


@pytest.fixture(scope="module")
def shared() -> list[str]:
    return []


def test_a_test_with_a_module_fixture_is_in_its_modules_group(
    shared: list[str], request: pytest.FixtureRequest
) -> None:
    marks = [m.args[0] for m in request.node.iter_markers("xdist_group")]
    assert marks == [__name__]
    if hasattr(request.config, "workerinput") and request.config.getvalue("loadgroup"):
        assert request.node.nodeid.endswith(f"@{__name__}"), (
            f"node id {request.node.nodeid!r} lacks its xdist group: --dist loadgroup does not group tests "
            "with this pytest / pytest-xdist pair (see pyproject.toml's dev extra)"
        )


def test_a_test_without_shared_fixtures_is_in_no_group(request: pytest.FixtureRequest) -> None:
    assert not list(request.node.iter_markers("xdist_group"))
