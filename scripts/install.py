"""`pip install` into a virtual environment, done by uv where it can be (the Makefile's installs).

    python scripts/install.py VENV/bin/python [pip install arguments...]

pip unpacks wheels one file at a time in Python: building .venv-sglang (SGLang's import chain, torch's CUDA
build with its nvidia libraries, about 6 GB) took 105 s and 100 CPU-s on a 2-core VM, .venv 47 s. uv (from PyPI,
installed into the environment by its own pip first) installs the same packages in a fraction of that. It is told
what this machine's pip is told: `pip config list` (files and PIP_* variables) gives the index, extra indexes,
find-links folders, constraint files and certificate bundle, and indexes are searched like pip's (the best
version across all of them, `--index-strategy unsafe-best-match`), so both tools pick the same files.

pip does the install instead when uv cannot be installed, when uv fails (pip then reports what is wrong in its own
words), or when SPECBENCH_INSTALLER=pip is set.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

UV = "uv==0.13.9"
# pip's options that uv does not take (uv never warns about the environment's other packages' requirements)
PIP_ONLY = {"--no-warn-conflicts"}
# pip configuration keys (any section: global, install, :env:) -> uv's option; values are space-separated lists
CONFIG = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_config(python: str) -> list[tuple[str, str]]:
    """(key, value) of every setting pip reads on this machine, files and PIP_* variables alike."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    pairs = []
    for line in out.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            pairs.append((name.rsplit(".", 1)[-1], value.strip().strip("'\"")))
    return pairs


def uv_options(config: list[tuple[str, str]]) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment for what pip is configured with."""
    options, env = ["--index-strategy", "unsafe-best-match"], {}
    for key, value in config:
        if key == "cert":
            env["SSL_CERT_FILE"] = value
        elif key in ("timeout", "default-timeout"):
            env["UV_HTTP_TIMEOUT"] = value
        elif key == "no-index" and value.lower() in ("1", "true", "yes", "on"):
            options.append("--no-index")
        elif key in CONFIG:
            for item in value.split():
                if not _given(options, CONFIG[key], item):
                    options += [CONFIG[key], item]
    return options, env


def _given(options: list[str], flag: str, value: str) -> bool:
    return any(a == flag and b == value for a, b in zip(options, options[1:], strict=False))


def uv_of(python: str) -> Path | None:
    """The environment's uv, installed by its pip when missing; None when that fails."""
    uv = Path(python).parent / "uv"
    if not uv.exists():
        done = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", UV])
        if done.returncode != 0 or not uv.exists():
            print(f">> {UV} could not be installed into {Path(python).parents[1]}: pip installs instead", flush=True)
            return None
    return uv


def install(python: str, args: list[str]) -> int:
    uv = None if os.environ.get("SPECBENCH_INSTALLER") == "pip" else uv_of(python)
    if uv is not None:
        options, env = uv_options(pip_config(python))
        cmd = [str(uv), "pip", "install", "--python", python, *options, *[a for a in args if a not in PIP_ONLY]]
        if subprocess.run(cmd, env={**os.environ, **env}).returncode == 0:
            return 0
        print(f">> uv failed ({shlex.join(cmd)}): pip installs instead", flush=True)
    return subprocess.run([python, "-m", "pip", "install", *args]).returncode


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: python scripts/install.py VENV/bin/python [pip install arguments...]")
    sys.exit(install(sys.argv[1], sys.argv[2:]))


if __name__ == "__main__":
    main()
