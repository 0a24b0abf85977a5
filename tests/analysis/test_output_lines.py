"""The output-identity lines: whose length is whose, the differing items in order, no stray bullet."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.outputs import Differing, Identity, _identity, check_outputs


def records(path: Path, outputs: dict[str, list[int]]) -> str:
    path.write_text(
        "".join(
            json.dumps({"item_id": i, "warmup": False, "output_text": str(t), "output_ids": t}) + "\n"
            for i, t in outputs.items()
        )
    )
    return str(path)


def test_differing_items_are_listed_in_order_naming_each_sides_length(tmp_path):
    items = ["q10", "q2", "q1", "q9"]
    base = records(tmp_path / "base.jsonl", {i: [1, 2, 3] for i in items})
    arm = records(tmp_path / "arm.jsonl", {i: [1, 2, 4, 5] for i in items})
    pairs = pd.DataFrame(
        {
            "campaign": "c",
            "base_seed": 1,
            "repeat": 0,
            "item_id": items,
            "records_path_b": base,
            "records_path_a": arm,
            "text_md5_b": "x",
            "text_md5_a": "y",
            "ids_md5_b": "x",
            "ids_md5_a": "y",
        }
    )
    ident = _identity("block", "token", pairs, ())
    assert [d.item_id for d in ident.differing] == ["q1", "q2", "q9", "q10"]
    assert str(ident.differing[0]) == "c seed 1 repeat 0 item q1: first differs at token 2 (token: 3 tokens, block: 4)"


def test_pairs_not_listed_are_said_in_words_not_a_stray_bullet():
    listed = tuple(Differing("c", 1, 0, f"q{i}", "token 0 (token: 1 tokens, block: 1)") for i in range(10))
    ident = Identity("block", "token", pairs=15, identical=2, with_ids=15, unrecorded=0, differing=listed)
    details = check_outputs([ident], "identical_outputs").details
    assert details[-1] == "and 3 more differing pair(s), not listed"
    assert not any(d.startswith(("; ", "-", ";")) for d in details)
