"""A campaign made by older code still resumes, and sits in one sweep table with newer ones: every config key added
since has its neutral value in harness.contract.ADDED_KEYS, checked against each published campaign's stored config
(results/published, made by the code of its day) and the current schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from analysis.sweep import swept_keys
from harness.contract import ADDED_KEYS, unmeasured, with_added_keys
from harness.runner.config import BenchConfig
from harness.runner.folder import config_differences
from harness.server.config import ArmConfig

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = sorted((ROOT / "results" / "published").rglob("campaign.json"))
ARMS = "experiment.arms"


def defaults(schema: type) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(schema), throw_on_missing=False)  # type: ignore[return-value]


def dotted(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; an arm's keys as `experiment.arms.KEY`; dicts with content kept whole too."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        out[name] = value
        if name == ARMS:
            for arm in value or []:
                out.update(dotted(arm, f"{ARMS}."))
        elif isinstance(value, dict):
            out.update(dotted(value, f"{name}."))
    return out


def schema_keys() -> dict[str, Any]:
    keys = dotted(defaults(BenchConfig))
    keys.update({f"{ARMS}.{k}": v for k, v in defaults(ArmConfig).items()})
    return {k: v for k, v in keys.items() if not unmeasured(k)}


def test_there_are_older_campaigns_to_check():
    assert len(PUBLISHED) >= 10


@pytest.mark.parametrize("path", PUBLISHED, ids=[str(p.relative_to(ROOT / "results" / "published")) for p in PUBLISHED])
def test_every_key_added_since_a_published_campaign_has_its_neutral_value(path):
    stored = json.loads(path.read_text())["config"]
    have = dotted(with_added_keys(stored))
    missing = sorted(set(schema_keys()) - set(have))
    assert not missing, f"{path}: add these keys with their neutral values to harness.contract.ADDED_KEYS: {missing}"


def test_the_neutral_values_are_the_schema_defaults():
    """A key filled in for an older campaign means what the current default means (else a resume would compare
    against a value the new code never sets by default)."""
    keys = schema_keys()
    assert {k: keys[k] for k in ADDED_KEYS} == ADDED_KEYS


def test_an_older_campaign_compares_equal_to_itself_with_the_keys_added_since():
    stored = json.loads(PUBLISHED[0].read_text())["config"]
    filled = with_added_keys(stored)
    assert filled["client"]["extra_body"] == {} and filled["server"]["command"] == []
    assert config_differences(filled, with_added_keys(filled)) == []
    newer = json.loads(json.dumps(filled))
    assert swept_keys([stored, newer]) == []  # (not the keys added since: their neutral values where absent)
    newer["client"]["extra_body"] = {"cache_prompt": False}
    assert swept_keys([stored, newer]) == ["client.extra_body.cache_prompt"]
