"""The `jsonl` workload: custom items, validated line by line with line numbers in the errors."""

from __future__ import annotations

import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # the Parquet variant goes through `datasets`
os.environ["HF_HUB_OFFLINE"] = "1"

import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from workloads import WorkloadConfig, WorkloadError, load_workload  # noqa: E402
from workloads.hashing import rows_sha256  # noqa: E402

GOOD = [
    {"id": 7, "prompt": "What is 6 times 7? Put the answer in \\boxed{}.", "answer": 42, "category": "arith"},
    {
        "id": 9,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}],
        "category": "chat",
    },
    {"id": 12, "prompt": "Half of one?", "answer": "\\frac{1}{2}", "meta": {"source": "me"}},
]


def write(tmp_path: Path, lines: list[Any], name: str = "items.jsonl") -> Path:
    """Each entry is a JSON-able object, or a str written verbatim as the line."""
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def cfg_for(path: Path, **kw: Any) -> WorkloadConfig:
    return WorkloadConfig(kind="jsonl", path=str(path), cache_dir=str(path.parent / "cache"), **kw)


def test_valid_file(tmp_path: Path) -> None:
    w = load_workload(cfg_for(write(tmp_path, GOOD)))
    assert [i.item_id for i in w.items] == ["7", "9", "12"]
    assert [i.seed_offset for i in w.items] == [7, 9, 12]  # integer ids are the seed offsets
    first, chat, half = w.items
    assert first.messages == [{"role": "user", "content": first.prompt}] and first.answer == "42"
    assert chat.prompt == "Be brief.\n\nSay hi." and chat.messages == GOOD[1]["messages"]
    assert chat.answer is None and chat.category == "chat" and half.category is None
    assert w.sha256 == rows_sha256(GOOD) and w.dataset_id == "file:items.jsonl"


def test_scoring_of_custom_answers(tmp_path: Path) -> None:
    w = load_workload(cfg_for(write(tmp_path, GOOD)))
    first, chat, half = w.items
    assert w.score(first, "\\boxed{42}").correct is True
    assert w.score(chat, "hi").correct is None
    assert w.score(half, "so \\boxed{0.5}").correct is True
    assert w.score(half, "so \\boxed{1}").correct is False


def test_string_ids_use_positions(tmp_path: Path) -> None:
    rows = [{"id": "alpha", "prompt": "a"}, {"id": "beta", "prompt": "b"}, {"id": "3", "prompt": "c"}]
    w = load_workload(cfg_for(write(tmp_path, rows)))
    assert [i.seed_offset for i in w.items] == [0, 1, 2]


def test_blank_lines_are_skipped_and_line_numbers_stay_true(tmp_path: Path) -> None:
    path = write(tmp_path, [GOOD[0], "", "   ", {"id": 2}])
    with pytest.raises(WorkloadError, match=r"items\.jsonl: line 4: needs 'prompt' \(text\) or 'messages'"):
        load_workload(cfg_for(path))


BAD_LINES = [
    ("not json", '{"id": 1, "prompt": "x"', "not valid JSON"),
    ("array", "[1, 2]", "expected a JSON object, got list"),
    ("missing id", {"prompt": "x"}, "missing 'id'"),
    ("bool id", {"id": True, "prompt": "x"}, "'id' must be a non-empty string or an integer"),
    ("empty id", {"id": " ", "prompt": "x"}, "'id' must be a non-empty string or an integer"),
    ("typo", {"id": 1, "prompt": "x", "answr": 3}, "unknown keys ['answr']; allowed: id, prompt, messages"),
    ("nothing to send", {"id": 1, "answer": 3}, "needs 'prompt' (text) or 'messages' (chat)"),
    ("empty prompt", {"id": 1, "prompt": "  "}, "'prompt' must be a non-empty string"),
    ("messages not a list", {"id": 1, "messages": "hi"}, "'messages' must be a non-empty list"),
    ("bad message keys", {"id": 1, "messages": [{"role": "user", "text": "x"}]}, "messages[0] must be an object"),
    ("bad role", {"id": 1, "messages": [{"role": "bot", "content": "x"}]}, "messages[0].role='bot'; use one of"),
    ("content not text", {"id": 1, "messages": [{"role": "user", "content": 3}]}, "messages[0].content must be"),
    (
        "ends with assistant",
        {"id": 1, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        "the last message must be the user's",
    ),
    ("float answer", {"id": 1, "prompt": "x", "answer": 0.5}, "'answer' must be a string or an integer"),
    ("bool answer", {"id": 1, "prompt": "x", "answer": False}, "'answer' must be a string or an integer"),
    ("category not text", {"id": 1, "prompt": "x", "category": 3}, "'category' must be a string"),
    ("duplicate id", {"id": 7, "prompt": "again"}, "id '7' is already used ("),
    ("NaN", '{"id": 1, "prompt": "x", "meta": NaN}', "NaN is not a JSON number; write the value as text"),
    ("Infinity", '{"id": 1, "prompt": "x", "meta": {"w": -Infinity}}', "-Infinity is not a JSON number"),
    ("huge integer", '{"id": 1, "prompt": "x", "meta": ' + "9" * 5000 + "}", "an integer of more than 4,300 digits"),
    ("lone surrogate", '{"id": 1, "prompt": "bad \\ud800"}', "holds text that is not valid Unicode"),
    ("empty answer", {"id": 1, "prompt": "x", "answer": " "}, "'answer' is empty (no response could match it)"),
    (
        "empty last message",
        {"id": 1, "messages": [{"role": "user", "content": "  "}]},
        "the last message (the user's, which the model answers) has no text",
    ),
]


@pytest.mark.parametrize(("line", "message"), [c[1:] for c in BAD_LINES], ids=[c[0] for c in BAD_LINES])
def test_errors_name_the_line(tmp_path: Path, line: Any, message: str) -> None:
    path = write(tmp_path, [GOOD[0], GOOD[1], line, GOOD[2]])
    with pytest.raises(WorkloadError) as err:
        load_workload(cfg_for(path))
    assert f"items.jsonl: line 3: {message}" in str(err.value)


def test_empty_file_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no items"):
        load_workload(cfg_for(write(tmp_path, ["", ""])))
    with pytest.raises(WorkloadError, match="needs workload.path"):
        load_workload(WorkloadConfig(kind="jsonl"))


def test_parquet_rows_are_validated_with_row_numbers(tmp_path: Path) -> None:
    rows = [{"id": "a", "prompt": "x", "answer": None}, {"id": "b", "prompt": "", "answer": "1"}]
    path = tmp_path / "items.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(WorkloadError, match=r"items\.parquet \(split train\): row 2: 'prompt' must be a non-empty"):
        load_workload(cfg_for(path))
    rows[1]["prompt"] = "y"
    pq.write_table(pa.Table.from_pylist(rows), path)
    w = load_workload(cfg_for(path))
    assert [(i.item_id, i.answer) for i in w.items] == [("a", None), ("b", "1")]


def test_selection_applies_to_custom_items(tmp_path: Path) -> None:
    rows = [{"id": n, "prompt": f"q{n}", "category": "even" if n % 2 == 0 else "odd"} for n in range(20)]
    path = write(tmp_path, rows)
    w = load_workload(cfg_for(path, categories=["odd"], subsample=4, subsample_seed=3))
    assert len(w.items) == 4 and all(i.category == "odd" for i in w.items)
    assert [i.seed_offset for i in w.items] == sorted(i.seed_offset for i in w.items)


def test_non_utf8_bytes_name_the_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    path.write_bytes(json.dumps(GOOD[0]).encode() + b'\n{"id": 2, "prompt": "caf\xe9"}\n')
    with pytest.raises(
        WorkloadError,
        match=r"items\.jsonl: line 2: not UTF-8 \(byte 0xe9 at column 25\); save the "
        r"file as UTF-8",
    ):
        load_workload(cfg_for(path))


def test_a_row_without_a_json_form_is_named_not_hashed() -> None:
    """Rows of a Parquet or a hub dataset (aime25, speed_bench) may hold NaN: the hash names the row."""
    assert rows_sha256([{"a": 1}]) == rows_sha256([{"a": 1}], "x.parquet")
    with pytest.raises(WorkloadError, match=r"x\.parquet: row 1 holds a value with no JSON form \(Out of range float"):
        rows_sha256([{"a": 1}, {"a": float("nan")}], "x.parquet")
    with pytest.raises(WorkloadError, match="row 0 holds a value with no JSON form .text that is not valid Unicode"):
        rows_sha256([{"a": "\ud800"}], "x.parquet")


def test_ids_that_give_one_seed_offset_name_both_rows_and_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, [{"id": "007", "prompt": "a"}, {"id": 5, "prompt": "b"}, {"id": 7, "prompt": "c"}])
    with pytest.raises(WorkloadError, match=r"items\.jsonl: rows 1 and 3 have the same seed_offset 7"):
        load_workload(cfg_for(path))
