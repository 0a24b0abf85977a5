"""Typed configuration of a workload (Hydra group `workload/`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from workloads.errors import WorkloadConfigError

KINDS = ("synthetic", "aime25", "speed_bench", "jsonl")
SCORING_MODES = ("boxed", "none")
SYNTHETIC_LEVELS = ("standard", "easy")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass
class WorkloadConfig:
    """Which items to send. One schema for every kind; fields a kind does not use are ignored.

    kind: synthetic | aime25 | speed_bench | jsonl
    """

    kind: str = "synthetic"
    # --- synthetic: generated offline from a seed -------------------------------------------
    n_items: int = 16
    seed: int = 0
    level: str = "standard"  # standard (three-digit word problems) | easy (one-digit sums, differences, products)
    # --- datasets (Hugging Face hub / local cache / local file in the same format) -----------
    hf_id: str | None = None
    hf_config: str | None = None
    split: str = "train"
    revision: str | None = None
    path: str | None = None  # a local file (.parquet/.jsonl/.json) or directory; wins over hf_id
    cache_dir: str | None = None  # `datasets` cache; None = its default (HF_HOME / HF_DATASETS_CACHE)
    # --- selection -----------------------------------------------------------------------------
    categories: list[str] = field(default_factory=list)
    subsample: int | None = None
    subsample_seed: int = 0
    skip_placeholders: bool = False
    # --- prompt and scoring --------------------------------------------------------------------
    prompt_template: str | None = None  # math kinds: "{problem}" is replaced; None = MathArena's
    scoring: str = "boxed"  # boxed | none
    fallback_last_integer: bool = True
    # --- freezing: SHA256 of the canonical serialisation of the materialised rows -------------
    sha256: str | None = None
    allow_hash_mismatch: bool = False

    def __post_init__(self) -> None:
        _check_choice("workload.kind", self.kind, KINDS)
        _check_choice("workload.scoring", self.scoring, SCORING_MODES)
        _check_choice("workload.level", self.level, SYNTHETIC_LEVELS)
        if self.n_items < 1:
            raise WorkloadConfigError(f"workload.n_items={self.n_items} must be >= 1")
        if self.subsample is not None and self.subsample < 1:
            raise WorkloadConfigError(f"workload.subsample={self.subsample} must be >= 1, or null for all")
        if self.prompt_template is not None and "{problem}" not in self.prompt_template:
            raise WorkloadConfigError(
                f"workload.prompt_template={self.prompt_template!r} has no {{problem}} placeholder"
            )
        if self.sha256 is not None and not _SHA256.fullmatch(self.sha256):
            raise WorkloadConfigError(
                f"workload.sha256={self.sha256!r} is not a SHA256 (64 lowercase hex digits); "
                "use the value the loader prints, or null to not freeze"
            )


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise WorkloadConfigError(f"{what}={value!r} is not valid; choose one of: {', '.join(choices)}")
