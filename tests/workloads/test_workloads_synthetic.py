"""The synthetic workload, the registry, selection on generated items, and WorkloadConfig checks."""

from __future__ import annotations

import re

import pytest

from workloads import WorkloadConfig, WorkloadConfigError, WorkloadError, load_workload, loaders
from workloads.config import KINDS, SYNTHETIC_LEVELS
from workloads.prompts import MATHARENA_AIME_TEMPLATE
from workloads.synthetic import LEVELS, generate_rows

# seed 0, 8 items, generator arith-v1: changing the generated text or answers must change this
# (and then GENERATOR in workloads/synthetic.py).
GOLDEN_SHA256 = "d730543ceddf1b8b8ad13eda79f084a569704bc9384c4bd7825374f1c3e2a6d0"

# Recompute each answer from the numbers in the problem text, independently of the generator.
CHECKS = {
    "addition": lambda n: n[0] + n[1],
    "subtraction": lambda n: n[0] - n[1],
    "multiplication": lambda n: n[0] * n[1],
    "division": lambda n: n[0] // n[1],
    "remainder": lambda n: n[0] % n[1],
    "multi-step": lambda n: n[0] * n[1] - n[2] + n[3],
    "series": lambda n: n[1] * (n[1] + 1) // 2,
}


def test_deterministic_and_golden() -> None:
    a = load_workload(WorkloadConfig(kind="synthetic", n_items=8, seed=0))
    b = load_workload(WorkloadConfig(kind="synthetic", n_items=8, seed=0))
    assert a.items == b.items
    assert a.sha256 == b.sha256 == GOLDEN_SHA256
    assert a.dataset_id == "synthetic:arith-v1" and a.origin == "generated"


def test_seed_changes_items_and_longer_extends_shorter() -> None:
    short = load_workload(WorkloadConfig(n_items=5, seed=1)).items
    long = load_workload(WorkloadConfig(n_items=12, seed=1)).items
    other = load_workload(WorkloadConfig(n_items=5, seed=2)).items
    assert long[:5] == short
    assert [i.prompt for i in other] != [i.prompt for i in short]


@pytest.mark.parametrize("seed", [0, 1, 980406])
def test_answers_are_right_and_in_range(seed: int) -> None:
    for row in generate_rows(seed, 140):
        numbers = [int(x) for x in re.findall(r"\d+", row["problem"])]
        assert CHECKS[row["category"]](numbers) == row["answer"], row
        assert 0 <= row["answer"] <= 999


EASY_CHECKS = {
    "addition": lambda n: n[0] + n[1],
    "subtraction": lambda n: n[0] - n[1],
    "multiplication": lambda n: n[0] * n[1],
    "word-addition": lambda n: n[0] + n[1],
}


def test_the_easy_level_asks_one_digit_operations_with_right_answers() -> None:
    rows = generate_rows(980406, 200, "easy")
    assert [r["category"] for r in rows[:4]] == list(EASY_CHECKS)  # categories rotate
    for row in rows:
        numbers = [int(x) for x in re.findall(r"\d+", row["problem"])]
        assert EASY_CHECKS[row["category"]](numbers) == row["answer"], row
        assert all(n <= 18 for n in numbers) and 0 <= row["answer"] <= 81, row
    easy = load_workload(WorkloadConfig(n_items=8, level="easy"))
    assert easy.dataset_id == "synthetic:arith-easy-v1" and easy.sha256 != GOLDEN_SHA256
    assert [i.item_id for i in easy.items] == [str(k) for k in range(8)]
    assert easy.items[:4] == load_workload(WorkloadConfig(n_items=4, level="easy")).items  # longer extends shorter
    assert generate_rows(0, 8) == generate_rows(0, 8, "standard")  # the default level is unchanged (golden above)
    assert tuple(LEVELS) == SYNTHETIC_LEVELS  # the generator serves every level the config accepts
    with pytest.raises(WorkloadConfigError, match=r"workload.level='hard' is not valid; choose one of: standard, easy"):
        WorkloadConfig(level="hard")


def test_items_follow_the_interface() -> None:
    w = load_workload(WorkloadConfig(n_items=7, seed=3))
    assert len(w.items) == 7 and w.skipped_placeholders == 0
    assert [i.item_id for i in w.items] == [str(k) for k in range(7)]
    assert [i.seed_offset for i in w.items] == list(range(7))
    assert len({i.category for i in w.items}) == 7  # categories rotate
    for item in w.items:
        assert item.prompt.startswith(MATHARENA_AIME_TEMPLATE.split("{problem}")[0])
        assert item.messages == [{"role": "user", "content": item.prompt}]
        assert w.score(item, f"... so \\boxed{{{item.answer}}}").correct is True
        assert w.score(item, "\\boxed{1000}").correct is False


def test_prompt_template_override() -> None:
    w = load_workload(WorkloadConfig(n_items=1, prompt_template="Q: {problem}\nA: \\boxed{}"))
    assert w.items[0].prompt.startswith("Q: ") and w.items[0].prompt.endswith("\nA: \\boxed{}")


def test_category_filter_and_subsample() -> None:
    w = load_workload(WorkloadConfig(n_items=28, categories=["series", "remainder"]))
    assert {i.category for i in w.items} == {"series", "remainder"} and len(w.items) == 8
    sub = load_workload(WorkloadConfig(n_items=28, subsample=5, subsample_seed=7))
    again = load_workload(WorkloadConfig(n_items=28, subsample=5, subsample_seed=7))
    assert sub.items == again.items and len(sub.items) == 5
    assert sub.sha256 == load_workload(WorkloadConfig(n_items=28)).sha256  # the data, not the selection
    assert sub.items_sha256 != load_workload(WorkloadConfig(n_items=28)).items_sha256


def test_unknown_category_lists_the_valid_ones() -> None:
    with pytest.raises(WorkloadError, match=r"unknown categories \['algebra'\].*addition, division"):
        load_workload(WorkloadConfig(n_items=14, categories=["algebra"]))


def test_subsample_larger_than_items() -> None:
    with pytest.raises(WorkloadError, match="subsample=9 but only 4 items"):
        load_workload(WorkloadConfig(n_items=4, subsample=9))


def test_frozen_synthetic_hash_mismatch() -> None:
    with pytest.raises(WorkloadError, match="allow_hash_mismatch=true"):
        load_workload(WorkloadConfig(n_items=9, seed=0, sha256=GOLDEN_SHA256))


def test_registry_lists_every_kind_and_refuses_unknown() -> None:
    assert tuple(loaders()) == KINDS
    cfg = WorkloadConfig()
    cfg.kind = "gsm8k"  # bypasses __post_init__, as a later mutation would
    with pytest.raises(WorkloadError, match="synthetic, aime25, speed_bench, jsonl"):
        load_workload(cfg)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "aime"}, "workload.kind='aime' is not valid; choose one of: synthetic, aime25"),
        ({"scoring": "exact"}, "workload.scoring='exact'"),
        ({"n_items": 0}, "workload.n_items=0"),
        ({"subsample": 0}, "workload.subsample=0"),
        ({"sha256": "abc"}, "not a SHA256"),
        ({"prompt_template": "no placeholder"}, "no {problem} placeholder"),
    ],
)
def test_config_checks(kwargs: dict, message: str) -> None:
    with pytest.raises(WorkloadConfigError, match=re.escape(message)):
        WorkloadConfig(**kwargs)
