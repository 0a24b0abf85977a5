"""The embedded server's argv preflight from a checkout that is not installed (issue 55, item 4).

A lent GPU host runs the harness from a `git archive` copy with its packages on PYTHONPATH, no `pip install -e`:
the probe must import the harness the server would, `python -m harness.engine` from the working directory.
The interpreter here is a fresh virtual environment that cannot import `harness` at all; its third-party packages
(torch, for the engine's parser) come from this venv's site-packages through a plain .pth line, which adds the
folder but runs none of its .pth files, so the editable install's finder stays out.
"""

import shutil
import subprocess
import sysconfig
import venv
from pathlib import Path

from harness.backends.python_preflight import PlannedArgv, check_planned

ROOT = Path(__file__).resolve().parents[2]


def bare_python(where: Path) -> str:
    """A venv's interpreter with this venv's third-party packages and no harness (no editable finder)."""
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(python)


def copy_checkout(where: Path) -> Path:
    """The harness's source, as a `git archive` would give it: files only, not installed."""
    for package in ("harness", "workloads"):
        shutil.copytree(ROOT / package, where / package, ignore=shutil.ignore_patterns("__pycache__"))
    return where


def test_probe_imports_the_working_directory_harness(tmp_path):
    python = bare_python(tmp_path / "venv")
    checkout = copy_checkout(tmp_path / "checkout")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cannot = subprocess.run([python, "-c", "import harness"], cwd=elsewhere, capture_output=True, text=True)
    assert cannot.returncode != 0 and "No module named 'harness'" in cannot.stderr, "the interpreter is not bare"
    good = ("--model-path", "embedded:mini", "--port", "1")
    bad = ("--model-path", "embedded:mini", "--port", "1", "--no-such-flag")
    items = [PlannedArgv(label=n, arm="a", python=python, args=a, env=()) for n, a in (("good", good), ("bad", bad))]

    report = check_planned(items, backend="embedded", cwds={"a": checkout})

    good_outcome, bad_outcome = report.outcome_of("good"), report.outcome_of("bad")
    assert good_outcome.ok, good_outcome.line()
    assert good_outcome.version == f"harness.engine from {checkout / 'harness'}"
    assert not bad_outcome.ok and bad_outcome.flag == "--no-such-flag", bad_outcome.line()
    # From a folder without the harness the probe says so, and nothing counts as checked.
    lost = check_planned(items[:1], backend="embedded", cwds={"a": elsewhere}).outcome_of("good")
    assert not lost.ok and "cannot import harness.engine" in (lost.unchecked or ""), lost.line()


def test_engine_imports_the_same_way(tmp_path):
    """The server itself, `python -m harness.engine --help` from the copy, imports without an install: the probe
    mirrors something that works."""
    python = bare_python(tmp_path / "venv")
    checkout = copy_checkout(tmp_path / "checkout")
    done = subprocess.run([python, "-m", "harness.engine", "--help"], cwd=checkout, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
