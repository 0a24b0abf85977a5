"""Where the Hydra configs are, and the Hydra version base every entry point composes with.

The configs live in the checkout's top-level `configs/` folder; a wheel ships that folder inside the package
as `harness/configs` (pyproject.toml). This module finds whichever of the two is there.
"""

from __future__ import annotations

from pathlib import Path

HYDRA_VERSION_BASE = "1.3"


def config_dir() -> Path:
    """The Hydra configs: inside the installed package (a wheel ships the top-level configs/ as
    harness/configs), else the checkout's top-level configs/ (a plain checkout, an editable install)."""
    here = Path(__file__).resolve().parent
    packaged = here / "configs"
    return packaged if packaged.is_dir() else here.parent / "configs"


CONFIG_DIR = config_dir()
