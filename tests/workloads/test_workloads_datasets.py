"""AIME 2025 and SPEED-Bench through the real `datasets` code paths, on fixtures written here.

The fixtures have the real datasets' columns and types with invented contents, in every local form
the loader accepts: Parquet, JSONL, `save_to_disk` directories and a copy of a hub repository.
Nothing is downloaded: HF_DATASETS_OFFLINE=1 and each load uses its own cache directory.
"""

from __future__ import annotations

import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported anywhere in this process
os.environ["HF_HUB_OFFLINE"] = "1"

import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import datasets  # noqa: E402
import huggingface_hub.constants  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from workloads import WorkloadConfig, WorkloadError, load_workload  # noqa: E402
from workloads.hashing import rows_sha256  # noqa: E402
from workloads.prompts import MATHARENA_AIME_TEMPLATE  # noqa: E402
from workloads.speed_bench import PLACEHOLDER  # noqa: E402

PLACEHOLDER_TEXT = PLACEHOLDER + " USING SPECDEC_BENCH"

AIME_SCHEMA = pa.schema(
    [
        ("problem_idx", pa.int64()),
        ("problem", pa.string()),
        ("answer", pa.int64()),
        ("problem_type", pa.list_(pa.string())),
    ]
)
AIME_ROWS: list[dict[str, Any]] = [
    {
        "problem_idx": 1,
        "problem": "How many ordered pairs $(a,b)$ of positive integers satisfy $a+b=12$?",
        "answer": 11,
        "problem_type": ["Combinatorics"],
    },
    {"problem_idx": 2, "problem": "Find $x$ if $x^2 - 1176 x = -345744$.", "answer": 588, "problem_type": ["Algebra"]},
    {
        "problem_idx": 3,
        "problem": "Find the least $n$ with $n \\equiv 7 \\pmod{9}$ and $n > 60$.",
        "answer": 70,
        "problem_type": ["Number Theory"],
    },
    {
        "problem_idx": 4,
        "problem": "A square of area $25$ has side $s$. Find $s$.",
        "answer": 5,
        "problem_type": ["Geometry", "Algebra"],
    },
    {
        "problem_idx": 5,
        "problem": "Find the remainder of $10^{10}$ modulo $10$.",
        "answer": 0,
        "problem_type": ["Number Theory"],
    },
    {
        "problem_idx": 6,
        "problem": "Find the largest three-digit integer.",
        "answer": 999,
        "problem_type": ["Combinatorics"],
    },
]

SPEED_SCHEMA = pa.schema(
    [
        ("question_id", pa.string()),
        ("category", pa.string()),
        ("sub_category", pa.string()),
        ("turns", pa.list_(pa.string())),
        ("source", pa.string()),
        ("src_id", pa.string()),
        ("difficulty", pa.string()),
        ("multiturn", pa.bool_()),
    ]
)
PLACEHOLDER_IDS = {"qa": 3, "coding": 1}  # how many rows of each category are placeholders


def _speed_rows() -> list[dict[str, Any]]:
    rows = []
    for category in ("coding", "math", "qa"):
        for k in range(5):
            placeholder = k < PLACEHOLDER_IDS.get(category, 0)
            turns = (
                [f"{PLACEHOLDER_TEXT}\n\n{{question}}"]
                if placeholder
                else [f"({category} {k}) Please explain topic number {k} in detail.", "Now summarise it."]
            )
            rows.append(
                {
                    "question_id": hashlib.md5(f"{category}-{k}".encode()).hexdigest()[:20],
                    "category": category,
                    "sub_category": f"{category}-sub",
                    "turns": turns,
                    "source": "invented/source" if placeholder else "invented/inline",
                    "src_id": f"{category}_{k}",
                    "difficulty": "easy",
                    "multiturn": len(turns) > 1,
                }
            )
    return rows


SPEED_ROWS = _speed_rows()
N_PLACEHOLDERS = sum(PLACEHOLDER_IDS.values())


# --- writing the fixtures ------------------------------------------------------------------------


def write_parquet(rows: list[dict], schema: pa.Schema, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def save_dataset(rows: list[dict], schema: pa.Schema, path: Path, split: str | None = None) -> Path:
    ds = datasets.Dataset(pa.Table.from_pylist(rows, schema=schema))
    (datasets.DatasetDict({split: ds}) if split else ds).save_to_disk(str(path))
    return path


def hub_copy(rows: list[dict], schema: pa.Schema, root: Path, config: str, split: str) -> Path:
    """A directory laid out like `hf download <id> --repo-type dataset --local-dir root`."""
    write_parquet(rows, schema, root / config / f"{split}-00000-of-00001.parquet")
    write_parquet(rows[-1:], schema, root / "other" / f"{split}-00000-of-00001.parquet")
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        f"- config_name: {config}\n  data_files:\n  - split: {split}\n    path: {config}/{split}-*\n"
        f"- config_name: other\n  data_files:\n  - split: {split}\n    path: other/{split}-*\n---\n"
    )
    return root


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline even if `datasets` was imported before this module set the environment."""
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def aime_cfg(tmp_path: Path, path: Path | None, **kw: Any) -> WorkloadConfig:
    base = dict(kind="aime25", hf_id="MathArena/aime_2025", split="train", cache_dir=str(tmp_path / "cache"))
    return WorkloadConfig(**{**base, "path": None if path is None else str(path), **kw})


def speed_cfg(tmp_path: Path, path: Path, **kw: Any) -> WorkloadConfig:
    base = dict(
        kind="speed_bench",
        hf_id="nvidia/SPEED-Bench",
        hf_config="qualitative",
        split="test",
        scoring="none",
        cache_dir=str(tmp_path / "cache"),
    )
    return WorkloadConfig(**{**base, "path": str(path), **kw})


# --- AIME 2025 -------------------------------------------------------------------------------------


def test_aime_every_local_form_gives_the_same_rows_and_hash(tmp_path: Path) -> None:
    forms = [
        write_parquet(AIME_ROWS, AIME_SCHEMA, tmp_path / "aime.parquet"),
        write_jsonl(AIME_ROWS, tmp_path / "aime.jsonl"),
        save_dataset(AIME_ROWS, AIME_SCHEMA, tmp_path / "saved"),
        save_dataset(AIME_ROWS, AIME_SCHEMA, tmp_path / "saved_dict", split="train"),
        hub_copy(AIME_ROWS, AIME_SCHEMA, tmp_path / "hub", config="default", split="train"),
    ]
    loaded = [load_workload(aime_cfg(tmp_path, p)) for p in forms]
    assert {w.sha256 for w in loaded} == {rows_sha256(AIME_ROWS)}
    assert all(w.items == loaded[0].items for w in loaded)
    assert loaded[0].dataset_id == "MathArena/aime_2025"
    assert loaded[0].origin == f"file:{forms[0].resolve()}"


def test_aime_items(tmp_path: Path) -> None:
    w = load_workload(aime_cfg(tmp_path, write_parquet(AIME_ROWS, AIME_SCHEMA, tmp_path / "a.parquet")))
    assert [i.item_id for i in w.items] == ["1", "2", "3", "4", "5", "6"]
    assert [i.seed_offset for i in w.items] == [1, 2, 3, 4, 5, 6]
    assert [i.answer for i in w.items] == ["11", "588", "70", "5", "0", "999"]
    item = w.items[3]
    assert item.category == "Geometry, Algebra"
    assert item.prompt == MATHARENA_AIME_TEMPLATE.replace("{problem}", AIME_ROWS[3]["problem"])
    assert item.messages == [{"role": "user", "content": item.prompt}]
    assert w.score(item, "<think>area 25 so \\boxed{25}?</think> side \\boxed{005}").correct is True
    assert w.score(item, "the side is 5").fallback is True


def test_aime_string_answers_compare_as_integers(tmp_path: Path) -> None:
    rows = [{**r, "answer": f"{r['answer']:03d}"} for r in AIME_ROWS]
    w = load_workload(aime_cfg(tmp_path, write_jsonl(rows, tmp_path / "str.jsonl")))
    assert w.items[0].answer == "11" and w.score(w.items[0], "\\boxed{11}").correct is True


def test_aime_category_filter_matches_any_problem_type(tmp_path: Path) -> None:
    path = write_parquet(AIME_ROWS, AIME_SCHEMA, tmp_path / "a.parquet")
    w = load_workload(aime_cfg(tmp_path, path, categories=["Algebra"]))
    assert [i.item_id for i in w.items] == ["2", "4"]


def test_aime_bad_answer_names_the_row(tmp_path: Path) -> None:
    rows = [dict(r) for r in AIME_ROWS]
    rows[1]["answer"] = "\\frac{1}{2}"
    with pytest.raises(WorkloadError, match=r"row 2 \(problem_idx 2\): answer='\\\\frac\{1\}\{2\}' is not an integer"):
        load_workload(aime_cfg(tmp_path, write_jsonl(rows, tmp_path / "bad.jsonl")))
    rows[1]["answer"] = 1000
    with pytest.raises(WorkloadError, match=r"row 2 \(problem_idx 2\): answer=1000 is outside AIME's 0 to 999"):
        load_workload(aime_cfg(tmp_path, write_jsonl(rows, tmp_path / "bad2.jsonl")))


def test_aime_wrong_file_lists_the_columns(tmp_path: Path) -> None:
    path = write_parquet(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "speed.parquet")
    with pytest.raises(WorkloadError, match=r"missing columns \['problem_idx', 'problem', 'answer'\]; found \["):
        load_workload(aime_cfg(tmp_path, path))


# --- freezing --------------------------------------------------------------------------------------


def test_unpinned_load_logs_the_hash_to_pin(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="workloads")
    w = load_workload(aime_cfg(tmp_path, write_parquet(AIME_ROWS, AIME_SCHEMA, tmp_path / "a.parquet")))
    assert f"workload.sha256={w.sha256}" in caplog.text
    assert any(r.levelno == logging.WARNING for r in caplog.records)


def test_pinned_hash_loads(tmp_path: Path) -> None:
    path = write_parquet(AIME_ROWS, AIME_SCHEMA, tmp_path / "a.parquet")
    w = load_workload(aime_cfg(tmp_path, path, sha256=rows_sha256(AIME_ROWS)))
    assert w.sha256 == rows_sha256(AIME_ROWS)


def test_changed_rows_are_refused_with_both_hashes(tmp_path: Path) -> None:
    frozen = rows_sha256(AIME_ROWS)
    rows = [dict(r) for r in AIME_ROWS]
    rows[2]["answer"] = 71
    actual = rows_sha256(rows)
    assert actual != frozen
    path = write_parquet(rows, AIME_SCHEMA, tmp_path / "edited.parquet")
    with pytest.raises(WorkloadError) as err:
        load_workload(aime_cfg(tmp_path, path, sha256=frozen))
    message = str(err.value)
    assert f"expected workload.sha256={frozen}" in message and f"actual sha256={actual}" in message
    assert "workload.allow_hash_mismatch=true" in message


def test_mismatch_override_runs_on_the_actual_rows(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows = [dict(r) for r in AIME_ROWS]
    rows[2]["answer"] = 71
    path = write_parquet(rows, AIME_SCHEMA, tmp_path / "edited.parquet")
    w = load_workload(aime_cfg(tmp_path, path, sha256=rows_sha256(AIME_ROWS), allow_hash_mismatch=True))
    assert w.sha256 == rows_sha256(rows) and w.items[2].answer == "71"
    assert "allow_hash_mismatch=true" in caplog.text


def test_hash_is_of_values_not_key_order() -> None:
    reordered = [dict(reversed(list(r.items()))) for r in AIME_ROWS]
    assert rows_sha256(reordered) == rows_sha256(AIME_ROWS)
    assert rows_sha256(AIME_ROWS[::-1]) != rows_sha256(AIME_ROWS)


# --- where the data comes from ----------------------------------------------------------------------


def test_offline_hub_miss_says_what_to_do(tmp_path: Path) -> None:
    cfg = aime_cfg(tmp_path, None, hf_id="specbench-tests/not-a-dataset", revision="abc123")
    with pytest.raises(WorkloadError) as err:
        load_workload(cfg)
    message = str(err.value)
    assert "could not load specbench-tests/not-a-dataset split train revision abc123" in message
    assert "HF_DATASETS_OFFLINE=1" in message and "workload.path=DIR" in message
    assert "--revision abc123" in message


def test_an_unreachable_hub_is_said_in_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an offline setting and without network, the loader says the hub cannot be reached (once, after a
    connection attempt of at most 3 s), instead of the hub libraries' retries for about 25 s."""
    import time  # noqa: PLC0415

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    cfg = aime_cfg(tmp_path, None, hf_id="specbench-tests/not-a-dataset")
    start = time.monotonic()
    with pytest.raises(WorkloadError) as err:
        load_workload(cfg)
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "the hub (127.0.0.1:9) cannot be reached from this machine" in message and "workload.path=DIR" in message
    assert "unset" not in message


def test_no_source_configured(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="needs workload.hf_id .* or workload.path"):
        load_workload(aime_cfg(tmp_path, None, hf_id=None))


def test_missing_path_and_unsupported_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(aime_cfg(tmp_path, tmp_path / "nope.parquet"))
    csv = tmp_path / "aime.csv"
    csv.write_text("problem_idx,problem,answer\n1,x,2\n")
    with pytest.raises(WorkloadError, match=r"unsupported file type '\.csv'; use one of \.parquet"):
        load_workload(aime_cfg(tmp_path, csv))


def test_saved_dict_without_the_split_lists_its_splits(tmp_path: Path) -> None:
    path = save_dataset(AIME_ROWS, AIME_SCHEMA, tmp_path / "saved_dict", split="test")
    with pytest.raises(WorkloadError, match="workload.split=train is not in .*; its splits: test"):
        load_workload(aime_cfg(tmp_path, path))


# --- SPEED-Bench -----------------------------------------------------------------------------------


def test_speed_every_local_form_gives_the_same_hash(tmp_path: Path) -> None:
    forms = [
        write_parquet(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "data/speed/qualitative/test.parquet"),
        write_jsonl(SPEED_ROWS, tmp_path / "speed.jsonl"),
        save_dataset(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "saved", split="test"),
        hub_copy(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "hub", config="qualitative", split="test"),
    ]
    loaded = [load_workload(speed_cfg(tmp_path, p, skip_placeholders=True)) for p in forms]
    assert {w.sha256 for w in loaded} == {rows_sha256(SPEED_ROWS)}
    assert all(w.items == loaded[0].items for w in loaded)
    assert loaded[0].dataset_id == "nvidia/SPEED-Bench:qualitative"


def test_speed_placeholders_are_refused_with_how_to_prepare(tmp_path: Path) -> None:
    path = write_parquet(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "test.parquet")
    with pytest.raises(WorkloadError) as err:
        load_workload(speed_cfg(tmp_path, path))
    message = str(err.value)
    assert f"{N_PLACEHOLDERS} of the {len(SPEED_ROWS)} selected rows are placeholders" in message
    assert "prepare_data.py --dataset speed --config qualitative" in message
    assert "workload.path=" in message and "workload.skip_placeholders=true" in message


def test_speed_placeholders_skipped_and_counted(tmp_path: Path) -> None:
    path = write_parquet(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "test.parquet")
    w = load_workload(speed_cfg(tmp_path, path, skip_placeholders=True))
    assert w.skipped_placeholders == N_PLACEHOLDERS
    assert len(w.items) == len(SPEED_ROWS) - N_PLACEHOLDERS
    assert not any(PLACEHOLDER in i.prompt for i in w.items)


def test_speed_first_turns_and_seed_offsets(tmp_path: Path) -> None:
    path = write_parquet(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "test.parquet")
    w = load_workload(speed_cfg(tmp_path, path, categories=["math"]))
    positions = {r["question_id"]: n for n, r in enumerate(SPEED_ROWS)}
    assert [i.seed_offset for i in w.items] == [positions[i.item_id] for i in w.items] == [5, 6, 7, 8, 9]
    for item, row in zip(w.items, SPEED_ROWS[5:10], strict=True):
        assert item.prompt == row["turns"][0] and item.messages == [{"role": "user", "content": row["turns"][0]}]
        assert item.category == "math" and item.answer is None
    assert w.score(w.items[0], "\\boxed{3}").correct is None


def test_speed_numeric_question_ids_are_the_seed_offsets(tmp_path: Path) -> None:
    rows = [{**r, "question_id": str(1000 + n)} for n, r in enumerate(SPEED_ROWS)]
    path = write_parquet(rows, SPEED_SCHEMA, tmp_path / "test.parquet")
    w = load_workload(speed_cfg(tmp_path, path, categories=["math"]))
    assert [i.seed_offset for i in w.items] == [1005, 1006, 1007, 1008, 1009]


def test_speed_category_filter(tmp_path: Path) -> None:
    path = write_parquet(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "test.parquet")
    with pytest.raises(WorkloadError, match="3 of the 5 selected rows are placeholders"):
        load_workload(speed_cfg(tmp_path, path, categories=["qa"]))
    w = load_workload(speed_cfg(tmp_path, path, categories=["qa", "coding"], skip_placeholders=True))
    assert {i.category for i in w.items} == {"qa", "coding"} and w.skipped_placeholders == N_PLACEHOLDERS
    with pytest.raises(WorkloadError, match=r"unknown categories \['cooking'\]; this data has: coding, math, qa"):
        load_workload(speed_cfg(tmp_path, path, categories=["cooking"]))


def test_speed_seeded_subsample(tmp_path: Path) -> None:
    path = write_parquet(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "test.parquet")

    def ids(**kw: Any) -> list[str]:
        cfg = speed_cfg(tmp_path, path, skip_placeholders=True, **kw)
        return [i.item_id for i in load_workload(cfg).items]

    order = [r["question_id"] for r in SPEED_ROWS]
    three, six = ids(subsample=3, subsample_seed=1), ids(subsample=6, subsample_seed=1)
    assert ids(subsample=3, subsample_seed=1) == three and len(three) == 3
    assert set(three) <= set(six)
    assert three == sorted(three, key=order.index)  # the dataset's order
    assert ids(subsample=6, subsample_seed=2) != six


def test_speed_missing_turns_column(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "turns"} for r in SPEED_ROWS]
    schema = pa.schema([f for f in SPEED_SCHEMA if f.name != "turns"])
    with pytest.raises(WorkloadError, match=r"missing columns \['turns'\]"):
        load_workload(speed_cfg(tmp_path, write_parquet(rows, schema, tmp_path / "t.parquet")))


def test_speed_unselected_config_of_a_hub_copy(tmp_path: Path) -> None:
    root = hub_copy(SPEED_ROWS, SPEED_SCHEMA, tmp_path / "hub", config="qualitative", split="test")
    w = load_workload(dataclasses.replace(speed_cfg(tmp_path, root), hf_config="other"))
    assert len(w.items) == 1  # the README's other config, not the qualitative rows


def test_bad_json_line_read_through_datasets_is_a_message(tmp_path: Path) -> None:
    path = tmp_path / "aime.jsonl"
    path.write_text('{"problem_idx": 1, "problem": "x", "answer": "5"}\n{"problem_idx": 2, "problem": \n')
    with pytest.raises(WorkloadError, match=r"could not read .*aime\.jsonl .*JSON parse error.*check that every row"):
        load_workload(aime_cfg(tmp_path, path))


def test_a_file_replaced_in_place_is_read_again_not_served_from_the_cache(tmp_path: Path) -> None:
    """Same size, same modification time (cp -p, rsync -t, tar): datasets' cache would serve the old rows, and the
    frozen hash would pass over the changed file."""
    path = tmp_path / "aime.jsonl"
    path.write_text('{"problem_idx": 1, "problem": "Find x.", "answer": 11}\n')
    first = load_workload(aime_cfg(tmp_path, path))
    stat = path.stat()
    path.write_text('{"problem_idx": 1, "problem": "Find x.", "answer": 13}\n')
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(WorkloadError, match="do not match the frozen hash"):
        load_workload(aime_cfg(tmp_path, path, sha256=first.sha256))
    assert load_workload(aime_cfg(tmp_path, path)).items[0].answer == "13"


def test_an_empty_json_file_is_a_message(tmp_path: Path) -> None:
    path = tmp_path / "aime.jsonl"
    path.write_text("")
    with pytest.raises(WorkloadError, match=r"aime\.jsonl \(split train\) holds no rows"):
        load_workload(aime_cfg(tmp_path, path))
