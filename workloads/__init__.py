"""Workloads: what the runner sends, with stable ids, reference answers and scoring.

`load_workload(cfg)` picks the loader of `cfg.kind` (synthetic | aime25 | speed_bench | jsonl) and
returns a `Workload`: its items, the dataset's id, revision and SHA256, and `score(item, text)`.
"""

from __future__ import annotations

from collections.abc import Callable

from workloads import aime, custom, speed_bench, synthetic
from workloads.base import Item, Score, Workload
from workloads.config import WorkloadConfig
from workloads.errors import WorkloadConfigError, WorkloadError

__all__ = [
    "Item",
    "Score",
    "Workload",
    "WorkloadConfig",
    "WorkloadConfigError",
    "WorkloadError",
    "load_workload",
    "loaders",
]

Loader = Callable[[WorkloadConfig], Workload]


def loaders() -> dict[str, Loader]:
    """The loader of every workload kind."""
    return {
        "synthetic": synthetic.load,
        "aime25": aime.load,
        "speed_bench": speed_bench.load,
        "jsonl": custom.load,
    }


def load_workload(cfg: WorkloadConfig) -> Workload:
    """Load, freeze-check and take the subset of the workload that `cfg` describes.

    Raises WorkloadError (a ValueError) with what to do when the data cannot be used as configured:
    unknown kind, missing or unreadable data, hash mismatch, placeholders, invalid rows.
    """
    table = loaders()
    if cfg.kind not in table:
        raise WorkloadError(f"workload.kind={cfg.kind!r} is not valid; choose one of: {', '.join(table)}")
    return table[cfg.kind](cfg)
