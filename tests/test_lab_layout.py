"""The lab notebook stays out of the product (issue 47): scripts/ holds what make and CI run, results/published/
the published result sets; probe, tune and profile scripts and their logs live in lab/ (lab/README.md). And
every path the docs and the published sets' READMEs name still resolves after the move."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published"
PRODUCT_SCRIPTS = {"install.py", "slurm_local.sh"}  # the Makefile's installs; make test-slurm
# a set's own records, kept with it: the runner's server logs and console, the device call's output, the GPU tests
# run with the set's code
SET_RECORDS = {"server.log", "console.log", "device.log", "gpu_tests.log"}
MAX_BYTES = 2 * 1024 * 1024
# a file or folder name in prose: name.ext, or a folder with its trailing slash (globs allowed)
NAMED = re.compile(
    r"(?<![\w./-])((?:\.\./|[\w.-]+/)*[\w*.-]*[\w*-]\.(?:log|patch|txt|md|jsonl|json|png|tgz)"
    r"|(?:\.\./|[\w.-]+/)*[\w*.-]+/)(?![\w/])"
)
LAB_POINTER = re.compile(r"((?:\.\./)+lab/results/[\w.-]+/)")
SCRIPT = re.compile(r"(?<![\w./-])((?:lab/)?scripts/[\w.-]+\.(?:py|sh))")
TEST_FILE = re.compile(r"(?<![\w./-])(tests/(?:[\w-]+/)*test_\w+\.py)")


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_scripts_holds_only_what_the_product_runs():
    # (Python's __pycache__, written when a test imports install.py, is no script)
    extra = {p.name for p in (ROOT / "scripts").iterdir() if p.name != "__pycache__"} - PRODUCT_SCRIPTS
    assert not extra, f"{sorted(extra)} in scripts/: probe, tune and profile scripts go to lab/scripts/ (lab/README.md)"


def test_published_sets_hold_no_lab_notebook():
    """No tuning, probe or profile log, no trial patch, no runner lock file under results/published/."""
    stray = [
        str(p.relative_to(ROOT))
        for p in files_under(PUBLISHED)
        if p.suffix == ".patch" or p.name.startswith(".lock.") or (p.suffix == ".log" and p.name not in SET_RECORDS)
    ]
    assert not stray, f"lab files in results/published (move them to lab/results/<set>/): {stray}"


@pytest.mark.parametrize("folder", ["results", "lab"])
def test_no_file_over_2_mib(folder):
    big = [str(p.relative_to(ROOT)) for p in files_under(ROOT / folder) if p.stat().st_size > MAX_BYTES]
    assert not big, big


def readmes() -> list[Path]:
    found = [*PUBLISHED.rglob("*.md"), *(ROOT / "lab").rglob("*.md")]
    return sorted(p for p in found if p.name in ("README.md", "NOTE.md", "NOTES.md"))


def resolves(readme: Path, text: str, name: str) -> bool:
    """A name resolves under the README's folder (at any depth: a set's README names its subfolders' files), under a
    lab folder the README points to (../../../lab/results/<set>/), or from the repository root."""
    pattern = name.rstrip("/")
    homes = [readme.parent, *((readme.parent / m).resolve() for m in LAB_POINTER.findall(text))]
    return any(any(home.glob("**/" + pattern)) for home in homes) or any(ROOT.glob(pattern))


@pytest.mark.parametrize("readme", readmes(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_a_set_readme_names_exists(readme):
    text = readme.read_text()
    missing = sorted({m for m in NAMED.findall(text) if not resolves(readme, text, m)})
    assert not missing, f"{readme.relative_to(ROOT)} names files that are not there: {missing}"


def documents() -> list[Path]:
    """Where scripts are named for people to run: the docs, the Makefile, the tests, the lab, the sets' READMEs.
    Recorded files (manifests, logs, patches) name the paths of their day and are left as they were."""
    found = [
        ROOT / "README.md",
        ROOT / "Makefile",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "scripts").iterdir(),
        *(ROOT / "lab").rglob("*.py"),
        *(ROOT / "lab").rglob("*.sh"),
        *readmes(),
    ]
    return sorted(p for p in found if p.is_file())


def test_every_script_named_exists():
    dangling = sorted(
        {
            f"{p.relative_to(ROOT)}: {m}"
            for p in documents()
            for m in SCRIPT.findall(p.read_text())
            if not (ROOT / m).is_file()
        }
    )
    assert not dangling, dangling


def test_every_test_file_named_exists():
    """A test module named by its path (tests/<package>/test_x.py) where people read how to run things exists there.
    The published sets' READMEs and the lab's logs record the commands of their day and are left as they were."""
    named = [
        ROOT / "README.md",
        ROOT / "Makefile",
        ROOT / "lab" / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "configs").rglob("*.yaml"),
        *(ROOT / "lab" / "scripts").iterdir(),
    ]
    dangling = sorted(
        {
            f"{p.relative_to(ROOT)}: {m}"
            for p in named
            for m in TEST_FILE.findall(p.read_text())
            if not (ROOT / m).is_file()
        }
    )
    assert not dangling, dangling
