"""Typed config of the microbenchmark (`configs/micro/`, `python -m harness.micro`), registered in Hydra's
ConfigStore as `microbench_schema`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.validation import ConfigError, check_choice


@dataclass
class MicroConfig:
    """The verify-probability builder microbenchmark (`python -m harness.micro`).

    Implementation names are checked against the registry in `harness.micro.impls` at start-up.
    """

    name: str = "cpu_small"
    # logit families (harness.micro.families): each set runs every one, at every vocabulary and row count
    logits: list[str] = field(default_factory=lambda: ["iid"])
    vocab: list[int] = field(default_factory=lambda: [32000])
    rows: list[int] = field(default_factory=lambda: [16, 64, 256])
    bank: str | None = None  # the logit bank of the real families (None: the first of harness.micro.bank.SEARCH)
    top_k: int = 20
    top_p: float = 0.95
    temperature: float = 1.0
    dtype: str = "float32"  # float32 | bfloat16 | float16
    impls: list[str] = field(default_factory=lambda: ["full_vocab", "topk_first", "topk_first_torch", "sglang"])
    baseline: str = "full_vocab"  # "before": every output is compared with this one
    after: str = "topk_first"  # "after" in the report's before/after table
    padding_fraction: float = 0.0  # fraction of rows whose logits are all equal (the all-ties case)
    device: str = "auto"  # auto | cpu | cuda
    warmup: int = 3
    repeats: int = 20
    # CUDA: each timed call queued behind a GPU busy-wait of about this many ms, so that the host's launches overlap
    # GPU work as in a server (harness.micro.measure); 0: the GPU as the previous call left it
    queued_ms: float = 0.0
    min_rotate_bytes: int = 256 * 2**20  # rotate input copies until they exceed this (beats the cache)
    seed: int = 0
    out_dir: str | None = None  # write exactly here (e.g. results/published/...) instead of a timestamped dir

    def __post_init__(self) -> None:
        check_choice("micro.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        check_choice("micro.device", self.device, ("auto", "cpu", "cuda"))
        if not 0 <= self.padding_fraction <= 1:
            raise ConfigError(f"micro.padding_fraction={self.padding_fraction} must be in [0, 1]")
        if not self.vocab or any(v < 2 for v in self.vocab) or not self.rows or any(r < 1 for r in self.rows):
            raise ConfigError(
                f"micro.vocab={self.vocab} (each >= 2) and micro.rows={self.rows} (each >= 1) must be "
                "non-empty lists, e.g. micro.vocab=[32000,248320] micro.rows=[64,4096]"
            )
        if not self.logits:
            raise ConfigError("micro.logits is empty; name at least one logit family, e.g. micro.logits=[iid]")
        if self.queued_ms < 0:
            raise ConfigError(f"micro.queued_ms={self.queued_ms} must be >= 0 (0: no queueing)")
        if self.min_rotate_bytes < 0:
            raise ConfigError(f"micro.min_rotate_bytes={self.min_rotate_bytes} must be >= 0 (0: one input, no copies)")
        if self.repeats < 1 or self.warmup < 0:
            raise ConfigError(f"micro.repeats={self.repeats} must be >= 1 and micro.warmup={self.warmup} >= 0")
        if not self.impls:
            raise ConfigError("micro.impls is empty; name at least one implementation")
        if not (0 <= self.temperature < math.inf and 0 < self.top_p <= 1):  # (NaN fails both comparisons)
            raise ConfigError(
                f"micro.temperature={self.temperature} must be finite and >= 0 and micro.top_p={self.top_p} in (0, 1]"
            )
        if any(v <= self.top_k for v in self.vocab):
            raise ConfigError(
                f"micro.top_k={self.top_k} covers a whole vocabulary of micro.vocab={self.vocab}: the "
                "builders would take the whole-vocabulary path while the report says top_k "
                f"{self.top_k}; keep top_k below every vocabulary, or ask for that path with "
                "micro.top_k=-1 (SGLang's 'no top-k')"
            )


@dataclass
class MicroAppConfig:
    micro: MicroConfig = field(default_factory=MicroConfig)
    results_dir: str = "results"


def register_configs() -> None:
    """Register MicroAppConfig as `microbench_schema`, which configs/microbench.yaml lists first."""
    from hydra.core.config_store import ConfigStore  # noqa: PLC0415  (the command's, not the schema's)

    ConfigStore.instance().store(name="microbench_schema", node=MicroAppConfig)
