"""configs/workload/*.yaml compose as Hydra group options onto the WorkloadConfig schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from harness.hydra_setup import CONFIG_DIR
from workloads import load_workload
from workloads.config import KINDS, WorkloadConfig
from workloads.prompts import MATHARENA_AIME_TEMPLATE

CONFIGS = CONFIG_DIR


@dataclass
class _Primary:
    defaults: list[Any] = field(default_factory=lambda: ["_self_", {"workload": "synthetic"}])
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)


def _compose(overrides: list[str]) -> WorkloadConfig:
    ConfigStore.instance().store(name="test_workloads_primary", node=_Primary)
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="test_workloads_primary", overrides=overrides)
    return OmegaConf.to_object(cfg.workload)


def test_one_option_file_per_kind() -> None:
    assert sorted(p.stem for p in (CONFIGS / "workload").glob("*.yaml")) == sorted(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_each_option_composes(kind: str) -> None:
    cfg = _compose([f"workload={kind}"])
    assert isinstance(cfg, WorkloadConfig) and cfg.kind == kind


def test_aime25_preset_is_the_protocol() -> None:
    cfg = _compose(["workload=aime25"])
    assert (cfg.hf_id, cfg.split, cfg.scoring, cfg.fallback_last_integer) == (
        "MathArena/aime_2025",
        "train",
        "boxed",
        True,
    )
    assert cfg.prompt_template == MATHARENA_AIME_TEMPLATE
    assert cfg.sha256 is None  # not frozen until computed from the real rows


def test_speed_bench_preset_and_overrides() -> None:
    cfg = _compose(["workload=speed_bench", "workload.categories=[coding,math]", "workload.subsample=20"])
    assert (cfg.hf_id, cfg.hf_config, cfg.split) == ("nvidia/SPEED-Bench", "qualitative", "test")
    assert cfg.categories == ["coding", "math"] and cfg.subsample == 20 and not cfg.skip_placeholders


def test_a_typo_fails_with_the_key_named() -> None:
    with pytest.raises(Exception, match="n_itmes"):
        _compose(["workload.n_itmes=3"])


def test_default_synthetic_preset_loads_offline() -> None:
    w = load_workload(_compose([]))
    assert len(w.items) == 16 and all(i.answer is not None for i in w.items)
