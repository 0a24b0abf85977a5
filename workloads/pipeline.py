"""The steps every kind shares: hash and check the rows, turn them into candidates, take the subset."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from workloads.base import Workload, WorkloadError
from workloads.config import WorkloadConfig
from workloads.hashing import check_frozen, rows_sha256
from workloads.read_split import SplitRows
from workloads.scoring import Scorer
from workloads.subset import Candidate, take_subset

RowsToCandidates = Callable[[list[dict[str, Any]]], list[Candidate]]


def materialise(
    cfg: WorkloadConfig,
    src: SplitRows,
    to_candidates: RowsToCandidates,
    placeholder_help: str = "",
) -> Workload:
    """Freeze-check `src`, convert its rows with `to_candidates`, take the subset, and build the Workload."""
    if not src.rows:
        raise WorkloadError(f"workload {cfg.kind}: {src.label} has no rows")
    sha = rows_sha256(src.rows, src.label)
    check_frozen(cfg, sha, src.label, warn_unpinned=src.origin != "generated")
    subset = take_subset(cfg, to_candidates(src.rows), placeholder_help, src.label)
    return Workload(
        name=cfg.kind,
        dataset_id=src.dataset_id,
        revision=src.revision,
        sha256=sha,
        items=subset.items,
        skipped_placeholders=subset.skipped_placeholders,
        scorer=Scorer(mode=cfg.scoring, fallback_last_integer=cfg.fallback_last_integer),
        origin=src.origin,
    )


def require_columns(rows: Sequence[Mapping[str, Any]], required: Sequence[str], what: str) -> None:
    """Refuse rows that lack a required column, naming the columns that are there."""
    present = set(rows[0]) if rows else set()
    missing = [c for c in required if c not in present]
    if missing:
        raise WorkloadError(
            f"{what}: missing columns {missing}; found {sorted(present)}. Is this the right file/config?"
        )


def numeric_ids(ids: Sequence[object]) -> list[int] | None:
    """The ids as integers when every one is an int or a decimal string, else None."""
    out: list[int] = []
    for v in ids:
        if isinstance(v, bool):
            return None
        if isinstance(v, int):
            out.append(v)
        elif isinstance(v, str) and v.strip().isdecimal():
            out.append(int(v))
        else:
            return None
    return out


def seed_offsets(ids: Sequence[object]) -> list[int]:
    """Seed offsets: the ids themselves when all are integers, else each row's 0-based position."""
    return numeric_ids(ids) or list(range(len(ids)))
