"""Where the Hydra configs are, and the Hydra version base every entry point composes with.

The configs live in the checkout's top-level `configs/` folder; a wheel ships that folder inside the package
as `harness/configs` (pyproject.toml). This module finds whichever of the two is there.
"""

from __future__ import annotations

from pathlib import Path

HYDRA_VERSION_BASE = "1.3"


def config_dir() -> Path:
    """The Hydra configs: the checkout's top-level configs/ when there is one (a plain checkout, an editable
    install: it wins over anything left in harness/configs by an older tree), else the installed package's
    (a wheel ships the top-level configs/ as harness/configs)."""
    here = Path(__file__).resolve().parent
    checkout = here.parent / "configs"
    return checkout if (checkout / "bench.yaml").is_file() else here / "configs"


CONFIG_DIR = config_dir()
