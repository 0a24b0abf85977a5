"""scripts/install.py: the Makefile's installs go through uv told what this machine's pip is told, else pip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import install  # noqa: E402


def test_pip_settings_become_uv_options_and_pip_s_way_of_picking_across_indexes():
    config = [
        ("cert", "/etc/ca.pem"),
        ("constraint", "/etc/pip/c.txt"),
        ("extra-index-url", "file:///a/simple file:///b/simple"),
        ("find-links", "/opt/wheels"),
        ("find-links", "/opt/wheels"),
        ("default-timeout", "180"),
        ("index-url", "https://mirror/simple"),
        ("disable-pip-version-check", "1"),
        ("no-index", "false"),
    ]
    options, env = install.uv_options(config)
    assert options == [
        "--index-strategy",
        "unsafe-best-match",
        "--constraint",
        "/etc/pip/c.txt",
        "--extra-index-url",
        "file:///a/simple",
        "--extra-index-url",
        "file:///b/simple",
        "--find-links",
        "/opt/wheels",
        "--index-url",
        "https://mirror/simple",
    ]
    assert env == {"SSL_CERT_FILE": "/etc/ca.pem", "UV_HTTP_TIMEOUT": "180"}
    assert "--no-index" in install.uv_options([("no-index", "yes")])[0]


def test_pip_config_reads_files_and_pip_variables():
    env = {**os.environ, "PIP_FIND_LINKS": "/somewhere/wheels", "PIP_CONSTRAINT": "/somewhere/c.txt"}
    code = "import install, json; print(json.dumps(install.pip_config(__import__('sys').executable)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(ROOT / "scripts")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ["find-links", "/somewhere/wheels"] in json.loads(out)
    assert ["constraint", "/somewhere/c.txt"] in json.loads(out)


def run_install(python: Path | str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """An install of a requirement that no index holds (nothing is installed), from nowhere but tmp_path."""
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "install.py"), str(python), "-q", "no-such-package-xyz==1.0"],
        env=env,
        capture_output=True,
        text=True,
    )


PIP_SAYS = "No matching distribution found for no-such-package-xyz==1.0"


def test_pip_installs_when_told_to(tmp_path):
    proc = run_install(sys.executable, tmp_path, SPECBENCH_INSTALLER="pip")
    assert proc.returncode != 0 and PIP_SAYS in proc.stderr


def test_when_uv_fails_pip_installs_and_says_why(tmp_path):
    """An environment whose uv fails: the install is pip's, after a line naming uv's command."""
    venv = tmp_path / "env" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (venv / "uv").write_text("#!/bin/sh\nexit 3\n")
    (venv / "uv").chmod(0o755)
    proc = run_install(venv / "python", tmp_path)
    assert proc.returncode != 0
    assert f">> uv failed ({venv / 'uv'} pip install --python {venv / 'python'} " in proc.stdout
    assert "): pip installs instead" in proc.stdout and PIP_SAYS in proc.stderr
