"""Fixtures shared by the test modules, and how the suite is spread over pytest-xdist workers.

The tests mirror the packages (analysis/, runner/, engine/, micro/, verify/, workloads/, host/), with conformance/
(SGLang's and llama.cpp's own code), e2e/ (whole campaigns, faults, signals) and support/ (helpers on sys.path).

- `clean_campaign`: a private copy of the clean golden campaign (tests/fixtures/analysis), to corrupt or edit.
- `run_bench`: runs `python -m harness.bench` (or a Hydra multirun of it) as a real subprocess, with its
  results under this test's own tmp_path.
- Every test that uses a module- or session-scoped fixture (a server, a campaign, a built wheel that several
  tests only read) joins the xdist group of its module, so that the fixture is made once, on one worker
  (`make test` runs `--dist loadgroup`); every other test goes to whichever worker is free.
- torch runs one intra-op thread in the tests and every process they start (OMP_NUM_THREADS=1 unless set):
  two xdist workers already fill two cores, and torch's second thread spinning beside them cost about 7 % of
  the suite's CPU (measured on runner_e2e and spec_stats) without making any test faster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "analysis"
CLEAN = FIXTURES / "ratio_vs_mean" / "golden" / "golden-c1"

BenchRunner = Callable[..., subprocess.CompletedProcess]
SHARED_SCOPES = ("module", "package", "session")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any test module imports torch (see the docstring)
sys.path.insert(0, str(Path(__file__).parent / "support"))  # the shared helpers (serverutil, mountns, ...)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist declares this marker itself; declared here too so that the suite also runs without it
    config.addinivalue_line("markers", "xdist_group(name): tests of one group run on one xdist worker")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else []
        # the project's own fixtures only (a plugin's, such as tmp_path_factory, have an empty baseid)
        if any(d[-1].scope in SHARED_SCOPES and d[-1].baseid for d in defs if d):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid))


def bench_process(
    results: Path, *overrides: str, multirun: bool = False, timeout: float = 400
) -> subprocess.CompletedProcess:
    """`python -m harness.bench [-m] results_dir=RESULTS OVERRIDES...`, captured (`-m` goes first)."""
    cmd = [sys.executable, "-m", "harness.bench", *(["-m"] if multirun else []), f"results_dir={results}", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def clean_campaign(tmp_path: Path) -> Path:
    """A copy of the clean golden campaign at tmp_path/golden/c1."""
    return Path(shutil.copytree(CLEAN, tmp_path / "golden" / "c1"))


@pytest.fixture
def run_bench(tmp_path: Path) -> BenchRunner:
    """run_bench(*overrides, multirun=False, timeout=400): the runner on results_dir=tmp_path."""

    def run(*overrides: str, multirun: bool = False, timeout: float = 400) -> subprocess.CompletedProcess:
        return bench_process(tmp_path, *overrides, multirun=multirun, timeout=timeout)

    return run
