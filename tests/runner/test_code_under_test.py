"""Code under test: every run records what its server ran (asked of the server's interpreter), and arms can
come straight from git refs.

A temporary git repository holds a copy of this project's `harness/` package; branch `change` differs from
`main` by one observable line (the embedded server's ready line). A campaign of two source arms runs end to
end on it; its manifests, its report's audit, and tampered copies of it are checked.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from code_repos import CHANGED, READY, SERVICE, arms, git, make_repo, squash
from conftest import bench_process

from analysis.code import CHECK_NAME
from analysis.report import build_report
from harness.backends.launch import build_launch
from harness.runner.sources import materialise, resolve, worktree_commit
from harness.server.config import ArmConfig, ServerConfig
from harness.server.provenance import ProvenanceError, probe_server_code
from harness.validation import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "server.model_path=embedded:mini",
    "workload.n_items=3",
    "sampling.max_new_tokens=16",
    "experiment.warmup.requests=1",
    "experiment.warmup.max_new_tokens=4",
    "client.concurrency=3",
    "load_sample_s=0.05",
    "experiment.base_seeds=[3,4]",
]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the repository, the campaign folder) of one code A/B campaign of its main and change branches."""
    tmp = tmp_path_factory.mktemp("code_ab")
    repo = make_repo(tmp)
    proc = bench_process(
        tmp / "results", "experiment=embedded_code_ab", *arms(repo), *SMALL, f"source_cache={tmp / 'cache'}"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (root,) = (tmp / "results" / "embedded_code_ab").iterdir()
    return repo, root


def manifests(root: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "manifest.json").read_text()) for d in sorted((root / "runs").iterdir())}


def code_check(root: Path):
    return next(c for c in build_report([root]).audit.checks if c.name == CHECK_NAME)


def test_each_arm_runs_its_commit_and_the_audit_passes(campaign):
    repo, root = campaign
    doc = json.loads((root / "campaign.json").read_text())
    sources = {a["name"]: a["source"] for a in doc["arms"]}
    assert sources["base"]["commit"] == git(repo, "rev-parse", "main")
    assert sources["change"]["commit"] == git(repo, "rev-parse", "change")
    assert "harness/engine/service.py | 2 +-" in doc["source_diff_stat"]["change"]
    for run_id, man in manifests(root).items():
        src, code = sources[man["arm"]], man["server_code"]
        assert code["checkout"] == {
            "kind": "snapshot",
            "root": src["snapshot"],
            "repo": str(repo),
            "commit": src["commit"],
            "branch": None,
            "dirty": False,
            "diff_sha256": None,
            "untracked": [],
            "content_sha256": src["content_sha256"],
        }, run_id
        assert code["module"] == "harness.engine" and code["module_origin"] == f"{src['snapshot']}/harness"
        assert code["distribution"] is None  # not the editable specbench install
        assert code["packages"]["torch"] == code["torch"] and len(code["packages_sha256"]) == 64
        assert man["env"]["PYTHONPATH"].split(":")[0] == src["snapshot"]
        log = (root / "runs" / run_id / "server.log").read_text()
        assert ("ready to roll! (arm change)" in log) == (man["arm"] == "change"), run_id
    report = (root / "report.md").read_text()
    assert "Audit: PASSED" in report and "## Code under test" in report
    assert "The arms' interpreters hold the same packages" in report
    assert f"ref `change` = `{sources['change']['commit'][:12]}`" in report
    check = code_check(root)
    assert check.status == "ok" and "4 of 4 runs recorded" in check.summary


def test_a_tampered_commit_or_a_foreign_import_fails_the_audit(campaign, tmp_path):
    _, root = campaign
    for what, edit, says in (
        ("commit", lambda code: code["checkout"].update(commit="0" * 40), "but arm change's source 'change' resolved"),
        ("origin", lambda code: code.update(module_origin="/elsewhere/harness"), "outside its arm's source"),
        ("content", lambda code: code["checkout"].update(content_sha256="0" * 64), "it was edited after it was made"),
    ):
        copy = Path(shutil.copytree(root, tmp_path / what / root.name))
        path = next(
            p for p in sorted(copy.glob("runs/*/manifest.json")) if json.loads(p.read_text())["arm"] == "change"
        )
        man = json.loads(path.read_text())
        edit(man["server_code"])
        path.write_text(json.dumps(man))
        check = code_check(copy)
        assert check.status == "fail" and any(says in d for d in check.details), (what, check)


def test_interpreters_that_differ_in_a_package_fail_unless_declared(campaign, tmp_path):
    """Two installs that also differ in torch compare more than the declared difference."""
    _, root = campaign
    copy = Path(shutil.copytree(root, tmp_path / "pkg" / root.name))
    for path in copy.glob("runs/*/manifest.json"):
        man = json.loads(path.read_text())
        if man["arm"] == "change":
            man["server_code"]["packages"]["torch"] = "9.9.9"
            path.write_text(json.dumps(man))
    check = code_check(copy)
    assert check.status == "fail" and any(
        d.startswith("package torch differs") and "change 9.9.9" in d for d in check.details
    ), check
    doc = json.loads((copy / "campaign.json").read_text())
    doc["config"]["experiment"]["packages_may_differ"] = ["torch"]
    (copy / "campaign.json").write_text(json.dumps(doc))
    assert code_check(copy).status == "ok"


def test_the_probe_reads_the_servers_own_environment(tmp_path):
    """A distribution only the server's PYTHONPATH holds shows in its package list; a module the interpreter
    cannot find is an error naming it."""
    extra = tmp_path / "extra" / "onlyinserver-1.2.dist-info"
    extra.mkdir(parents=True)
    (extra / "METADATA").write_text("Metadata-Version: 2.1\nName: onlyinserver\nVersion: 1.2\n")
    server = ServerConfig(model_path="embedded:mini")
    plain = build_launch(server, ArmConfig(name="a"), port=1, base_seed=None, gpu=None, log_path=tmp_path / "l")
    other = build_launch(
        server,
        ArmConfig(name="b", env={"PYTHONPATH": str(tmp_path / "extra")}),
        port=1,
        base_seed=None,
        gpu=None,
        log_path=tmp_path / "l",
    )
    assert "onlyinserver" not in probe_server_code(plain).packages
    code = probe_server_code(other)
    assert code.packages["onlyinserver"] == "1.2" and code.module_origin == str(ROOT / "harness")
    assert code.checkout is not None and code.checkout.kind == "git" and code.checkout.root == str(ROOT)
    assert code.distribution == "specbench"  # the editable install (or its egg-info in the checkout)
    missing = build_launch(
        ServerConfig(model_path="x", module="no_such_module.server"),
        ArmConfig(name="a"),
        port=1,
        base_seed=None,
        gpu=None,
        log_path=tmp_path / "l",
    )
    with pytest.raises(ProvenanceError, match="no_such_module"):
        probe_server_code(missing)


def test_the_probe_finds_a_servers_module_without_running_its_packages_init(tmp_path):
    """SGLang's `__init__` imports torch and transformers (11 s of CPU): the probe finds `pkg.sub.server`
    through its parents' search paths without executing them; a namespace package on the way still works."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('pkg/__init__.py was executed')\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("raise SystemExit('pkg/sub/__init__.py was executed')\n")
    (tmp_path / "pkg" / "sub" / "server.py").write_text("")
    (tmp_path / "nspkg" / "inner").mkdir(parents=True)  # no __init__.py anywhere: namespace packages
    (tmp_path / "nspkg" / "inner" / "server.py").write_text("")
    for module, file in (("pkg.sub.server", "pkg/sub/server.py"), ("nspkg.inner.server", "nspkg/inner/server.py")):
        spec = build_launch(
            ServerConfig(model_path="x", module=module),
            ArmConfig(name="a", env={"PYTHONPATH": str(tmp_path)}),
            port=1,
            base_seed=None,
            gpu=None,
            log_path=tmp_path / "l",
        )
        assert probe_server_code(spec).module_file == str(tmp_path / file)


def test_worktree_is_the_checkout_as_it_is_without_touching_it(tmp_path):
    repo = make_repo(tmp_path)
    head = git(repo, "rev-parse", "HEAD")
    assert worktree_commit(repo) == head  # nothing uncommitted: the WORKTREE is HEAD
    (repo / SERVICE).write_text((repo / SERVICE).read_text() + "# edited\n")
    (repo / "harness" / "new_module.py").write_text("X = 1\n")
    status = git(repo, "status", "--porcelain")
    first = worktree_commit(repo)
    assert first != head and worktree_commit(repo) == first  # the same files make the same commit
    assert git(repo, "status", "--porcelain") == status and git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "diff", "--cached", "--name-only") == ""  # the user's index untouched
    snapshot, digest = materialise(repo, first, tmp_path / "cache")
    assert (snapshot / "harness" / "new_module.py").read_text() == "X = 1\n"
    assert (snapshot / SERVICE).read_text().endswith("# edited\n")
    assert materialise(repo, first, tmp_path / "cache") == (snapshot, digest)  # made once
    with pytest.raises(ConfigError, match="names no commit"):
        resolve(repo, "no-such-branch")


def test_a_campaign_refuses_to_resume_when_a_ref_moved(tmp_path):
    repo = make_repo(tmp_path)
    common = [
        "experiment=embedded_code_ab",
        *arms(repo),
        *SMALL,
        "experiment.base_seeds=[3]",
        f"source_cache={tmp_path / 'cache'}",
        "campaign=moving",
        "report=false",
    ]
    # the first attempt is stopped before its first run (SIGTERM at the plan): campaign.json holds its commits
    first = subprocess.Popen(
        [sys.executable, "-m", "harness.bench", f"results_dir={tmp_path / 'results'}", *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SPECBENCH_HOLD_AT": "plan"},
    )
    assert first.stderr is not None
    for line in first.stderr:
        if "holding at plan" in line:
            break
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 143
    old = git(repo, "rev-parse", "change")
    git(repo, "checkout", "-q", "change")
    (repo / "harness" / "more.py").write_text("Y = 2\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "more")
    new = git(repo, "rev-parse", "change")
    proc = bench_process(tmp_path / "results", *common)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and old in out and new in out and "now names another commit" in out, out[-2000:]


def test_a_source_arm_names_a_bad_repo_or_ref(run_bench, tmp_path):
    proc = run_bench("experiment=embedded_code_ab", f"experiment.arms.0.source.repo={tmp_path}", "dry_run=true")
    said = squash(proc.stdout)
    assert proc.returncode == 2 and squash(f"experiment.arms.0.source.repo='{tmp_path}'") in said, said
    assert squash("is not a git repository") in said
    repo = make_repo(tmp_path)
    proc = run_bench(
        "experiment=embedded_code_ab", *arms(repo, change="nope"), "dry_run=true", f"source_cache={tmp_path / 'cache'}"
    )
    said = squash(proc.stdout)
    assert proc.returncode == 2 and squash("experiment.arms.1.source.ref='nope' names no commit") in said, said
    proc = run_bench("experiment=embedded_code_ab", *arms(repo), "dry_run=true", f"source_cache={tmp_path / 'cache'}")
    assert proc.returncode == 0, proc.stdout
    said = squash(proc.stdout)
    assert said.count(squash(f"snapshot of {repo} at")) == 2 and git(repo, "rev-parse", "change") in said


def test_the_default_code_ab_runs_a_checkout_against_its_worktree(run_bench, tmp_path):
    """`experiment=embedded_code_ab` as shipped on a clone of this checkout, arm 0 at HEAD (a clean clone may have no
    local `main`), arm 1 the WORKTREE holding one uncommitted line: end to end, audit passed. Without that line the
    two refs are one code, which the command refuses before anything starts."""
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(ROOT), str(clone))
    refs = [
        f"experiment.arms.0.source.repo={clone}",
        f"experiment.arms.1.source.repo={clone}",
        "experiment.arms.0.source.ref=HEAD",
        f"source_cache={tmp_path / 'cache'}",
    ]
    same = run_bench("experiment=embedded_code_ab", *refs, "dry_run=true")
    assert same.returncode == 2 and squash("arms base and change resolve to the same launch") in squash(same.stdout)
    service = clone / SERVICE
    service.write_text(service.read_text().replace(READY, CHANGED))
    proc = run_bench("experiment=embedded_code_ab", *refs, *SMALL, "experiment.base_seeds=[3]")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (root,) = (tmp_path / "embedded_code_ab").iterdir()
    doc = json.loads((root / "campaign.json").read_text())
    assert [a["source"]["repo"] for a in doc["arms"]] == [str(clone)] * 2
    assert doc["arms"][0]["source"]["commit"] == git(clone, "rev-parse", "HEAD") != doc["arms"][1]["source"]["commit"]
    assert "Audit: PASSED" in (root / "report.md").read_text()


@pytest.mark.sglang
def test_sglang_source_arms_each_report_their_own_commit(tmp_path):
    """A git repository of SGLang 0.5.23's own Python files (from the installed package, under python/),
    branch `change` one line apart (its version string): per arm, SGLang's argv probe and the provenance
    probe report that arm's code."""
    from sglang_support import import_sglang  # noqa: PLC0415

    from configs import composed  # noqa: PLC0415
    from harness.backends.python_preflight import check_planned, planned_argv  # noqa: PLC0415
    from harness.runner.plan import planned_launches  # noqa: PLC0415
    from harness.runner.sources import resolve_sources  # noqa: PLC0415

    installed = Path(import_sglang().__file__).parent
    repo = tmp_path / "sglang"
    shutil.copytree(installed, repo / "python" / "sglang", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "SGLang 0.5.23's Python files")
    git(repo, "checkout", "-q", "-b", "change")
    version = repo / "python" / "sglang" / "_version.py"
    version.write_text(
        version.read_text().replace("__version__ = version = '0.5.23'", "__version__ = version = '0.5.23+change'")
    )
    git(repo, "commit", "-q", "-am", "one line")
    cfg = composed(
        "experiment=dflash_block_vs_token",
        "server.model_path=/models/target",
        "server.draft_model_path=/models/draft",
        f"server.python={sys.executable}",
        f"source_cache={tmp_path / 'cache'}",
        *[
            f"experiment.arms.{i}.source.{key}={value}"
            for i, ref in enumerate(("main", "change"))
            for key, value in (("repo", repo), ("ref", ref), ("package_dir", "python"))
        ],
    )
    sources = resolve_sources(cfg)
    launches = [launch for launch in planned_launches(cfg, sources) if launch.run.slot == 0]
    report = check_planned([planned_argv(launch) for launch in launches])
    assert report.ok, report.problems()
    for launch in launches:
        src = sources[launch.run.arm]
        assert report.outcome_of(launch.run.run_id).version == ("0.5.23+change" if src.ref == "change" else "0.5.23")
        code = probe_server_code(launch.launch)
        assert code.module == "sglang.launch_server" and code.checkout is not None
        assert code.checkout.kind == "snapshot" and code.checkout.commit == git(repo, "rev-parse", src.ref)
        assert code.module_origin == f"{src.snapshot}/python/sglang"
        assert code.distribution is None  # the installed sglang's files are not what it imports


def test_two_installs_that_differ_in_a_package_fail_the_audit_and_the_report_shows_it(run_bench, tmp_path):
    """Arm b's server sees one more distribution (on its PYTHONPATH, as a second install would hold it): its
    manifest says so, the audit fails naming the package, the report's Code under test lists it."""
    extra = tmp_path / "site" / "onlyinb-2.0.dist-info"
    extra.mkdir(parents=True)
    (extra / "METADATA").write_text("Metadata-Version: 2.1\nName: onlyinb\nVersion: 2.0\n")
    proc = run_bench(
        "experiment=embedded_aa",
        "experiment.aa=false",
        f"+experiment.arms.1.env.PYTHONPATH={tmp_path / 'site'}",
        *SMALL,
        "experiment.base_seeds=[3]",
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    (root,) = (tmp_path / "embedded_aa").iterdir()
    check = code_check(root)
    assert check.status == "fail" and any(
        "package onlyinb differs" in d and "a (absent), b 2.0" in d for d in check.details
    ), check
    report = (root / "report.md").read_text()
    assert "Packages that differ between the arms' interpreters" in report and "|onlyinb|(absent)|2.0|" in squash(
        report
    )


def test_a_dry_run_fails_when_an_arms_code_cannot_be_read(run_bench):
    """The dry run asks each arm's interpreter as the real run will; one that cannot answer is a non-zero
    exit (the real run would fail before its server starts), unless server.preflight=skip says the dry run
    is made where the servers' installs are not."""
    proc = run_bench("experiment=embedded_aa", "server.module=no_such_module.server", "dry_run=true")
    said = squash(proc.stdout)
    assert proc.returncode == 2 and squash("code under test unknown for arm(s)") in said, proc.stdout[-2000:]
    assert "no_such_module" in said
    proc = run_bench(
        "experiment=embedded_aa", "server.module=no_such_module.server", "dry_run=true", "server.preflight=skip"
    )
    assert proc.returncode == 0 and squash("not counted in the exit code") in squash(proc.stdout), proc.stdout[-2000:]
