"""The subset of a split's candidate items that a workload sends: category filter, placeholders, seeded subsample.

Order: category filter -> placeholder refusal (or skipping, counted) -> subsample. The subsample keeps
the `k` items whose `sha256("<subsample_seed>:<item_id>")` is smallest, in the dataset's order: it
depends on nothing but the seed and the ids (no library's random stream), and a larger `k` keeps
every item of a smaller one.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from workloads.base import Item, WorkloadError
from workloads.config import WorkloadConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """An item before the subset is taken, with the categories the filter matches and its placeholder flag."""

    item: Item
    categories: tuple[str, ...] = ()
    placeholder: bool = False


@dataclass(frozen=True)
class Subset:
    """The items a workload sends, and how many placeholder items were skipped on the way."""

    items: list[Item]
    skipped_placeholders: int


def take_subset(
    cfg: WorkloadConfig, candidates: Sequence[Candidate], placeholder_help: str = "", what: str = "the workload"
) -> Subset:
    """Apply `workload.categories`, `workload.skip_placeholders` and `workload.subsample` (`what`: the source, as
    errors name it)."""
    check_unique(candidates, what)
    kept = filter_categories(cfg, candidates)
    kept, skipped = drop_placeholders(cfg, kept, placeholder_help)
    items = [c.item for c in kept]
    if cfg.subsample is not None:
        items = subsample(items, cfg.subsample, cfg.subsample_seed)
    return Subset(items=items, skipped_placeholders=skipped)


def check_unique(candidates: Sequence[Candidate], what: str = "the workload") -> None:
    """Refuse duplicate item ids or seed offsets (two requests would share a seed), naming both rows of `what`."""
    for attr in ("item_id", "seed_offset"):
        seen: dict[object, int] = {}
        for n, c in enumerate(candidates, start=1):
            value = getattr(c.item, attr)
            if value in seen:
                raise WorkloadError(
                    f"{what}: rows {seen[value]} and {n} have the same {attr} {value!r} (ids such as "
                    "'007' and 7 give one seed_offset); ids must be unique"
                )
            seen[value] = n


def filter_categories(cfg: WorkloadConfig, candidates: Sequence[Candidate]) -> list[Candidate]:
    """Keep candidates with a category in `workload.categories` (all when it is empty)."""
    if not cfg.categories:
        return list(candidates)
    valid = sorted({cat for c in candidates for cat in c.categories})
    unknown = [cat for cat in cfg.categories if cat not in valid]
    if unknown:
        raise WorkloadError(
            f"workload.categories has unknown categories {unknown}; this data has: {', '.join(valid) or 'none'}"
        )
    wanted = set(cfg.categories)
    return [c for c in candidates if wanted.intersection(c.categories)]


def drop_placeholders(
    cfg: WorkloadConfig, candidates: Sequence[Candidate], help_text: str
) -> tuple[list[Candidate], int]:
    """Refuse placeholder rows, or drop them and count them when `workload.skip_placeholders`."""
    bad = [c for c in candidates if c.placeholder]
    if not bad:
        return list(candidates), 0
    if not cfg.skip_placeholders:
        examples = ", ".join(c.item.item_id for c in bad[:3])
        raise WorkloadError(
            f"workload {cfg.kind}: {len(bad)} of the {len(candidates)} selected rows are placeholders, "
            f"not prompts (e.g. ids {examples}). {help_text}"
        )
    kept = [c for c in candidates if not c.placeholder]
    log.warning(
        "workload %s: skipped %d placeholder rows (workload.skip_placeholders=true); %d rows left",
        cfg.kind,
        len(bad),
        len(kept),
    )
    if not kept:
        raise WorkloadError(f"workload {cfg.kind}: every selected row is a placeholder; nothing to run")
    return kept, len(bad)


def subsample(items: Sequence[Item], k: int, seed: int) -> list[Item]:
    """`k` of `items` chosen by seed (see the module docstring), in their original order."""
    if k > len(items):
        raise WorkloadError(f"workload.subsample={k} but only {len(items)} items are selected")
    ranked = sorted(range(len(items)), key=lambda i: _rank(seed, items[i].item_id))
    return [items[i] for i in sorted(ranked[:k])]


def _rank(seed: int, item_id: str) -> str:
    return hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()
