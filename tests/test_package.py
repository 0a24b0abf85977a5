"""The built wheel works outside the repository: its console scripts run a campaign and its report from an
empty folder, with the configs it ships as package data, and user experiments through --config-dir.

The wheel is installed without dependencies into a folder of its own (`pip install --target`), put first
on PYTHONPATH, so the test also proves that nothing is read from the checkout (the project's editable
install stays behind it; the test checks which copy is imported)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.hydra_setup import CONFIG_DIR

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ("specbench-bench", "specbench-report", "specbench-micro", "specbench-server")
SMALL = [
    "server.model_path=embedded:mini",
    "workload.n_items=4",
    "sampling.max_new_tokens=16",
    "experiment.warmup.requests=1",
    "experiment.base_seeds=[1,2]",
    "load_sample_s=0.05",
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(the install folder, an environment that imports from it first)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy of what the wheel is built from: setuptools leaves a build/ folder behind
    for name in ("pyproject.toml", "README.md"):
        src.mkdir(exist_ok=True)
        shutil.copy(REPO / name, src / name)
    for package in ("harness", "analysis", "workloads", "configs"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    wheel = next((tmp / "dist").glob("specbench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n for n in names if n.startswith("harness/configs/")}  # the top-level configs/, inside the package
    assert {f"harness/configs/{p.relative_to(CONFIG_DIR)}" for p in CONFIG_DIR.rglob("*.yaml")} == shipped
    target = tmp / "site"
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert inst.returncode == 0, inst.stderr
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import harness, analysis, workloads; print(harness.__file__, analysis.__file__, workloads.__file__)",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp,
    )
    assert all(p.startswith(str(target)) for p in where.stdout.split()), where.stdout
    return target, env


def script(installed, name: str, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    target, env = installed
    return subprocess.run(
        [str(target / "bin" / name), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_every_console_script_answers_help(installed, tmp_path):
    for name in SCRIPTS:
        proc = script(installed, name, "--help", cwd=tmp_path)
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
        assert "usage:" in proc.stdout[:400].lower(), (name, proc.stdout[:400])  # usage first, not a config dump


def test_the_default_campaign_and_its_report_run_from_an_empty_folder(installed, tmp_path):
    proc = script(installed, "specbench-bench", *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "audit: passed" in proc.stdout
    (root,) = (tmp_path / "results" / "embedded_block_vs_token").iterdir()
    assert (root / "report.md").exists() and len(list(root.glob("runs/*/records.jsonl"))) == 4
    again = script(installed, "specbench-report", str(root), "--out", str(tmp_path / "again"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "report.md").read_bytes() == (root / "report.md").read_bytes()
    for name in ("pr.md", "summary.json"):  # written beside report.md, their paths printed, reproducible
        assert str(root.relative_to(tmp_path) / name) in proc.stdout.replace("\n", "")
        assert (tmp_path / "again" / name).read_bytes() == (root / name).read_bytes()


def test_a_user_experiment_through_config_dir(installed, tmp_path):
    mine = tmp_path / "my_configs" / "experiment"
    mine.mkdir(parents=True)
    mine.joinpath("my_aa.yaml").write_text(
        (CONFIG_DIR / "experiment" / "embedded_aa.yaml").read_text().replace("name: embedded_aa", "name: my_aa")
    )
    proc = script(
        installed,
        "specbench-bench",
        "--config-dir",
        str(tmp_path / "my_configs"),
        "experiment=my_aa",
        "dry_run=true",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dry run of experiment my_aa" in proc.stdout
