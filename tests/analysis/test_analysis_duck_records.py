"""The fast records reader (DuckDB, analysis.duck_records) against the line-by-line one: on any line, either the
same table and the same bad lines, or the file left to the line-by-line reader. One looseness is documented: a
string of digits or a boolean inside an integer list."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest

from analysis import duck_records
from analysis import load as load_mod
from analysis.read_records import DUCK_FIELDS, read_records_file, read_records_files, read_scores_file

BASE = {
    "schema_version": 2,
    "campaign_id": "c1",
    "run_id": "r0-token-100",
    "arm": "token",
    "base_seed": 100,
    "repeat": 0,
    "item_id": "q1",
    "seed_offset": 1,
    "request_seed": 101,
    "category": "algebra",
    "warmup": False,
    "prompt_tokens": 50,
    "completion_tokens": 40,
    "spec_verify_ct": 20,
    "spec_num_correct_drafts": 20,
    "max_new_tokens": 60,
    "finish_reason": "stop",
    "hit_cap": False,
    "t_scheduled": 100.0,
    "t_sent": 100.0,
    "t_first_token": 100.5,
    "t_end": 104.5,
    "n_chunks": 3,
    "error": None,
    "output_text": "so \\boxed{5}",
    "reference_answer": "5",
    "request_index": 0,
    "chunk_us": [100000, 200000, 400000],
    "chunk_tokens": [1, 3, 36],
    "meta_info": {
        "spec_accept_length": 2.0,
        "spec_num_proposed_drafts": 140,
        "spec_correct_drafts_histogram": [0, 20, 0, 0, 0, 0, 0, 0],
        "e2e_latency": 4.5,
    },
}

# a value of every JSON type, and the numbers a reader may round, clip or refuse
VALUES = [
    None,
    True,
    False,
    0,
    -0.0,
    2.0,
    1.5,
    1e3,
    2**53 + 1,
    2**63,
    -(2**63) - 1,
    10**400,
    float("nan"),
    float("inf"),
    float("-inf"),
    "40",
    "abc",
    "",
    'é "q"',
    [1],
    [],
    {"x": 1},
    {},
]
FIELDS = [
    "schema_version",
    "run_id",
    "request_seed",
    "warmup",
    "completion_tokens",
    "t_sent",
    "hit_cap",
    "error",
    "finish_reason",
    "spec_verify_ct",
]
LISTS = [
    [],
    [1.5],
    [0.5, "x"],
    [1, None],
    [2**53 + 1],
    [2**63],
    [-(2**63) - 1],
    [float("nan")],
    [float("inf")],
    [1e3],
    [-3, 0],
    "x",
    5,
    {"a": 1},
    [[1]],
]


@pytest.fixture(scope="module")
def reader():
    with duck_records.Reader(DUCK_FIELDS) as shared:  # one database for the module's reads
        yield shared


def read_both(tmp_path: Path, lines: list[str], reader: duck_records.Reader):
    path = tmp_path / "records.jsonl"
    path.write_bytes("".join(lines).encode("utf-8", "surrogatepass"))
    return read_records_file(path, reader=reader), read_records_file(path, force_slow=True)


def bad_fields(bad) -> list[tuple[int, str]]:
    """(line, the field a bad line names): the two readers word the reason of a non-finite number differently."""
    return [(b.line, b.reason.split("=")[0].split(" ")[0]) for b in bad]


def assert_same(tmp_path: Path, lines: list[str], reader: duck_records.Reader) -> bool:
    """The two readers agree on `lines`; returns whether the fast one kept the file."""
    (fast, fast_bad, fast_slow), (slow, slow_bad, _) = read_both(tmp_path, lines, reader)
    assert fast.equals(slow), (lines, fast.to_pylist(), slow.to_pylist())
    assert bad_fields(fast_bad) == bad_fields(slow_bad), (fast_bad, slow_bad)
    return not fast_slow


def line(record: dict) -> str:
    return json.dumps(record) + "\n"  # NaN and Infinity as Python's writer writes them


def test_records_as_the_harness_writes_them_stay_on_the_fast_reader(reader, tmp_path):
    floats = [0.1 + 0.2, 1e-300, 5e-324, 1.7976931348623157e308, 123456.78901234567, 1 / 3, -2.5e-7]
    lines = [
        line(
            {
                **BASE,
                "request_index": i,
                "t_end": 100.0 + f,
                "t_first_token": f,
                "meta_info": {**BASE["meta_info"], "spec_accept_length": f},
            }
        )
        for i, f in enumerate(floats)
    ]
    lines.append(line({**BASE, "meta_info": None, "request_seed": 2**63 - 1, "chunk_us": [2**53 - 1]}))
    lines.append(line({**BASE, "meta_info": {"spec_accept_histogram": [3, 1]}, "error": 'timeout: \u00e9 "q"'}))
    assert assert_same(tmp_path, lines, reader)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_value_of_any_type_in_a_scalar_field(reader, tmp_path, field, value):
    kept = assert_same(tmp_path, [line(BASE), line({**BASE, field: value}), line(BASE)], reader)
    if value is None or field in {"run_id", "error", "finish_reason"} and isinstance(value, str):
        assert kept  # the value the field declares: no reason to leave the fast reader


@pytest.mark.parametrize("field", ["chunk_us", "chunk_tokens", "spec_correct_drafts_histogram"])
@pytest.mark.parametrize("value", LISTS, ids=repr)
def test_a_list_of_anything_in_an_integer_list(reader, tmp_path, field, value):
    record = {**BASE, "meta_info": {**BASE["meta_info"]}}
    (record["meta_info"] if field.startswith("spec_") else record)[field] = value
    assert_same(tmp_path, [line(BASE), line(record)], reader)


@pytest.mark.parametrize(
    "meta",
    [
        "x",
        5,
        [],
        {},
        {"spec_accept_length": "1"},
        {"spec_num_proposed_drafts": True},
        {"spec_accept_length": float("nan")},
        {"spec_accept_histogram": None},
    ],
)
def test_meta_info_of_any_shape(reader, tmp_path, meta):
    assert_same(tmp_path, [line({**BASE, "meta_info": meta}), line(BASE)], reader)


@pytest.mark.parametrize(
    "text",
    [
        "null\n",
        "[1]\n",
        '"abc"\n',
        "5\n",
        "{}\n",
        '{"run_id": "a", "run_id": "b"}\n',
        '{"run_id": "\\ud800"}\n',
        '{"warmup": tru\n',
        "\n",
        "  \n",
    ],
)
def test_lines_that_are_no_record(reader, tmp_path, text):
    assert_same(tmp_path, [line(BASE), text, line(BASE)], reader)
    assert_same(tmp_path, [text], reader)


def test_a_truncated_last_line_and_invalid_utf8_leave_the_fast_reader(reader, tmp_path):
    assert not assert_same(tmp_path, [line(BASE), line(BASE)[:40]], reader)
    path = tmp_path / "records.jsonl"
    path.write_bytes(line(BASE).encode() + b'{"run_id": "\xff"}\n')
    (_, _, slow), (table, bad, _) = read_records_file(path), read_records_file(path, force_slow=True)
    assert slow and table.num_rows == 1 and [b.line for b in bad] == [2]


def test_the_fast_reader_refuses_what_it_would_misread(reader, tmp_path):
    """The cases DuckDB converts on its own (1.5 -> 2 in an integer field, "40" -> 40, true -> 1, anything ->
    text): the fast reader leaves each to the line-by-line one, which names the line."""
    for field, value in [
        ("request_seed", 1.5),
        ("completion_tokens", "40"),
        ("spec_verify_ct", True),
        ("run_id", 5),
        ("warmup", 1),
        ("chunk_us", [1.5, 2]),
    ]:
        assert not assert_same(tmp_path, [line(BASE), line({**BASE, field: value})], reader), (field, value)


def test_the_one_looseness_digits_and_booleans_inside_an_integer_list(reader, tmp_path):
    """Documented in analysis/duck_records.py: inside an integer list, "2" reads as 2 and true as 1 (the
    harness never writes either; the line-by-line reader reports them)."""
    lines = [line({**BASE, "chunk_tokens": ["2", True, 3]})]
    (fast, fast_bad, fast_slow), (slow, slow_bad, _) = read_both(tmp_path, lines, reader)
    assert not fast_slow and not fast_bad and fast.column("chunk_tokens").to_pylist() == [[2, 1, 3]]
    assert [b.reason for b in slow_bad] == ["chunk_tokens is not a list of integers (ignored)"]
    assert slow.column("chunk_tokens").to_pylist() == [None]


def test_values_stay_bitwise_equal_through_the_text_they_are_read_from(reader, tmp_path):
    """Scalars go through their JSON text (DuckDB's re-serialisation): every double must come back as written."""
    import random  # noqa: PLC0415

    rng = random.Random(7)
    floats = [rng.uniform(-1e6, 1e6) for _ in range(200)] + [
        math.ldexp(rng.random(), rng.randint(-1070, 1020)) for _ in range(200)
    ]
    lines = [line({**BASE, "request_index": i, "t_sent": f, "t_scheduled": -f}) for i, f in enumerate(floats)]
    (fast, _, fast_slow), _ = read_both(tmp_path, lines, reader)
    assert not fast_slow
    assert fast.column("t_sent").to_pylist() == floats and fast.column("t_scheduled").to_pylist() == [
        -f for f in floats
    ]


def test_a_score_line_beyond_64_bits_is_a_bad_line(tmp_path):
    """Found beside the records reader's checks: the line-by-line scores reader raised OverflowError on it."""
    path = tmp_path / "scores.jsonl"
    path.write_text(
        json.dumps({"request_index": 0, "correct": True})
        + "\n"
        + json.dumps({"request_index": 2**70, "correct": True})
        + "\n"
    )
    table, bad = read_scores_file(path)
    assert table.to_pylist() == [{"request_index": 0, "correct": True}] and [b.line for b in bad] == [2]


def test_keys_are_matched_case_sensitively(reader, tmp_path):
    """DuckDB's identifiers are case-insensitive; JSON keys are not: "RUN_ID" is not run_id in either reader (it is
    a key no record has: a bad line, read line by line)."""
    renamed = {k: v for k, v in BASE.items() if k not in ("run_id", "meta_info")}
    for record in [{**renamed, "RUN_ID": "x", "META_INFO": BASE["meta_info"]}, {**BASE, "Run_Id": "x"}]:
        assert not assert_same(tmp_path, [line(record)], reader)
        (_, bad, _), _ = read_both(tmp_path, [line(record)], reader)
        assert bad and {b.reason.split(":")[0] for b in bad} <= {
            f"unknown key {k!r}" for k in ("RUN_ID", "META_INFO", "Run_Id")
        }


def test_one_array_keeps_a_single_chunk_and_combines_several():
    """A column of one chunk is used as it is (combine_chunks would copy it: the chunk lists of a large campaign are
    gigabytes of fresh pages), one of several is combined, in order."""
    lists = pa.array([[1.0, 2.0], None, [3.0]])
    one = duck_records.one_array(pa.chunked_array([lists]))
    assert one.buffers()[-1].address == lists.buffers()[-1].address
    two = duck_records.one_array(pa.chunked_array([lists, pa.array([[4.0]])]))
    assert two.to_pylist() == [[1.0, 2.0], None, [3.0], [4.0]]


def test_many_files_read_as_each_alone(tmp_path: Path, reader: duck_records.Reader):
    """read_records_files reads many files in one query and splits the rows by file: each file gets what
    read_records_file gives it alone (rows, bad lines by its own physical line, fast or line by line), whatever is
    wrong with the files beside it."""

    def line(i: int, **change) -> str:
        return json.dumps({**BASE, "request_index": i, **change}) + "\n"

    files = {
        "good": [line(0), line(1, completion_tokens=7)],
        # read fast: the t_sent of 1e400 is named by its physical line, 4
        "blank_then_huge": ["\n", line(0), "\n", line(1).replace('"t_sent": 100.0', '"t_sent": 1e400')],
        "nan": [line(0), line(1, t_end=float("nan"))],
        "unknown_key": [line(0, extra=1)],
        "doubted": [line(0, run_id=5)],
        "truncated": [line(0), line(1)[:30]],
        "blank_only": ["\n", "\n"],
        "empty": [],
        "good_again": [line(i, item_id=f"q{i}") for i in range(5)],
    }
    paths = []
    for name, lines in files.items():
        path = tmp_path / name / "records.jsonl"
        path.parent.mkdir()
        path.write_text("".join(lines))
        paths.append(path)
    paths.append(tmp_path / "missing" / "records.jsonl")
    batch = read_records_files(paths, reader)
    assert len(batch) == len(paths)
    for path, (table, bad, slow) in zip(paths, batch, strict=True):
        alone_table, alone_bad, alone_slow = read_records_file(path, reader=reader)
        assert table.equals(alone_table), path
        assert (bad, slow) == (alone_bad, alone_slow), path
    slow_by_name = {path.parent.name: slow for path, (_, _, slow) in zip(paths, batch, strict=True)}
    assert not slow_by_name["good"] and not slow_by_name["good_again"] and not slow_by_name["blank_then_huge"]
    assert slow_by_name["nan"] and slow_by_name["unknown_key"] and slow_by_name["doubted"] and slow_by_name["truncated"]
    assert batch[1][1] and [b.line for b in batch[1][1]] == [4]
    assert batch[-2][0].num_rows == 5


def test_batches_keep_order_and_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """load's batches of records files: in order, at most BATCH_FILES files and BATCH_BYTES each (a larger file
    alone), one a worker where there are few files."""
    monkeypatch.setattr(load_mod, "BATCH_BYTES", 100)
    sizes = [10, 10, 200, 30, 30, 30, 30, 0]
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"{i}.jsonl"
        path.write_bytes(b"x" * size)
        paths.append(path)
    paths.append(tmp_path / "missing.jsonl")
    batches = load_mod._batches(paths, 1)
    assert [p for batch in batches for p in batch] == paths
    assert [len(batch) for batch in batches] == [2, 1, 3, 3]
    assert [len(batch) for batch in load_mod._batches(paths[:2], 2)] == [1, 1]
    monkeypatch.setattr(load_mod, "BATCH_FILES", 2)
    assert max(len(batch) for batch in load_mod._batches(paths, 1)) == 2
