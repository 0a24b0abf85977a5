"""Output identity between the arms: measured in every report, and a failure of the audit where the experiment
declares that the outputs must be identical (a builder or kernel change): a server that alters one token of one
response is caught, named, with the position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.outputs import first_difference

pytestmark = pytest.mark.slow

FAULTY = Path(__file__).resolve().parents[1] / "fixtures" / "servers"
SMALL = [
    "experiment=embedded_verify_probs",
    "workload.n_items=4",
    "experiment.base_seeds=[1]",
    "experiment.warmup.requests=2",
    "sampling.max_new_tokens=24",
]


def flat(text: str) -> str:
    return " ".join(text.split())


def only(root: Path) -> Path:
    (campaign,) = [p for p in root.iterdir() if p.is_dir()]
    return campaign


def test_identical_outputs_pass_and_one_altered_token_fails(run_bench, tmp_path):
    proc = run_bench(*SMALL, f"results_dir={tmp_path / 'same'}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    camp = only(tmp_path / "same" / "embedded_verify_probs")
    doc = json.loads((camp / "summary.json").read_text())
    assert doc["expect"] == "identical_outputs"
    assert doc["output_identity"] == [
        {
            "arm": "topk_first",
            "baseline": "full_vocab",
            "pairs": 4,
            "identical": 4,
            "compared": "text and token ids",
            "pairs_with_token_ids": 4,
            "pairs_without_text": 0,
            "differing": [],
            "unreadable_files": [],
        }
    ]
    assert (
        "**Outputs** (expected identical: `experiment.expect: identical_outputs`): topk_first vs full_vocab: 4/4 "
        "identical (text and token ids)." in (camp / "pr.md").read_text()
    )
    assert "outputs: topk_first vs full_vocab: 4/4 identical" in flat(proc.stdout)

    # arm topk_first's server alters the last token of its 3rd finished request (the first measured one)
    fault = [
        "server.module=faulty_engine",
        f"+server.env.PYTHONPATH={FAULTY}",
        "+experiment.arms.1.env.FAULTY_ENGINE=one_token",
        "+experiment.arms.1.env.FAULTY_NTH='3'",
    ]
    proc = run_bench(*SMALL, *fault, f"results_dir={tmp_path / 'one'}")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    camp = only(tmp_path / "one" / "embedded_verify_probs")
    doc = json.loads((camp / "summary.json").read_text())
    (ident,) = doc["output_identity"]
    assert (ident["pairs"], ident["identical"]) == (4, 3)
    (diff,) = ident["differing"]
    assert diff["base_seed"] == 1 and diff["first_difference"].startswith(
        "token 23 (full_vocab: 24 tokens, topk_first: 24)"
    )
    assert "Outputs identical across arms, as the experiment expects" in doc["audit"]["failed"]
    report = flat((camp / "report.md").read_text())
    assert f"item {diff['item_id']}: first differs at token 23 (full_vocab: 24 tokens, topk_first: 24)" in report
    assert "AUDIT FAILED" in proc.stdout and "3/4 identical" in flat(proc.stdout)


def test_first_difference_names_the_position():
    assert (
        first_difference([1, 2, 3], [1, 2, 4, 5], "token", ("token", "block")) == "token 2 (token: 3 tokens, block: 4)"
    )
    assert (
        first_difference("abc", "ab", "character", ("token", "block"))
        == "character 2 (token: 3 characters, block: 2: one is the other's start)"
    )
