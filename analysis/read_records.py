"""The records reader: `records.jsonl` and `scores.jsonl` of one run, as Arrow tables typed as harness.contract
declares them.

Records are parsed by DuckDB's JSON reader (analysis/duck_records.py: only the keys the analysis uses, each value
checked against its JSON type); a file that this fast path cannot parse or doubts (a truncated last line, a field of
an unexpected type) is read again line by line with `json`, and every line that could not be used is kept as a
`BadLine` for the audit. scores.jsonl (two keys) is parsed by pyarrow's JSON reader against an explicit schema, with
the same fallback. analysis.load finds the files and lays the tables out flat.
"""

from __future__ import annotations

import json
import math
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from analysis import duck_records
from harness.contract import Record, ScoreLine, base_type

_BLOCK_BYTES = 16 << 20  # pyarrow parses one block per thread; a record must fit in one block


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


_FLOAT_MAX = sys.float_info.max


# The fields of harness.contract.Record the analysis parses, typed as the Record declares them. Fields that no
# figure or check uses are not parsed (each parsed key costs reading time): prompt_tokens, n_chunks,
# output_text, reference_answer, category (the campaign's item list is the source of categories), and
# meta_info but for the keys below.
PARSED = (
    "schema_version",
    "campaign_id",
    "run_id",
    "arm",
    "base_seed",
    "repeat",
    "request_index",
    "item_id",
    "seed_offset",
    "request_seed",
    "warmup",
    "completion_tokens",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "max_new_tokens",
    "finish_reason",
    "hit_cap",
    "t_scheduled",
    "t_sent",
    "t_first_token",
    "t_end",
    "chunk_us",
    "chunk_tokens",
    "error",
)


# counts read as float64, so that a missing one is NaN in the arrays the metrics compute on
AS_FLOAT = ("completion_tokens", "spec_verify_ct", "spec_num_correct_drafts", "max_new_tokens")


_RECORD_TYPES = {name: base_type(tp) for name, tp in typing.get_type_hints(Record).items()}


def _parsed_of(kind: type) -> tuple[str, ...]:
    return tuple(n for n in PARSED if _RECORD_TYPES[n] is kind and n not in AS_FLOAT)


STR_FIELDS = _parsed_of(str)


INT_FIELDS = _parsed_of(int)


FLOAT_FIELDS = (*AS_FLOAT, *_parsed_of(float))


BOOL_FIELDS = (*_parsed_of(bool), "correct")  # `correct`: schema 1 records only (schema 2: scores.jsonl)


LIST_FIELDS = _parsed_of(list)  # schema 2: per-chunk arrival offsets (us) and output tokens


# the keys a record may have: the Record's, and schema 1's scoring keys (schema 2 moved them to scores.jsonl); any
# other is a bad line (an edit, a writer that is not ours)
RECORD_KEYS = frozenset((*_RECORD_TYPES, "correct", "answer", "score_fallback"))


# JSON has no NaN or Infinity; Python's json module reads and writes them as these words
NONFINITE_WORDS = (b"NaN", b"Infinity")


META_FLOAT_FIELDS = ("spec_accept_length", "spec_num_proposed_drafts")


META_HIST_FIELDS = ("spec_correct_drafts_histogram", "spec_accept_histogram")  # new name, old alias


META_TYPE = pa.struct(
    [(f, pa.float64()) for f in META_FLOAT_FIELDS] + [(f, pa.list_(pa.int64())) for f in META_HIST_FIELDS]
)


RECORD_SCHEMA = pa.schema(
    [(f, pa.string()) for f in STR_FIELDS]
    + [(f, pa.int64()) for f in INT_FIELDS]
    + [(f, pa.float64()) for f in FLOAT_FIELDS]
    + [(f, pa.bool_()) for f in BOOL_FIELDS]
    + [(f, pa.list_(pa.int64())) for f in LIST_FIELDS]
    + [("meta_info", META_TYPE)]
)


_DOUBLE_LISTS_SCHEMA = pa.schema(
    [pa.field(f.name, pa.list_(pa.float64())) if f.name in LIST_FIELDS else f for f in RECORD_SCHEMA]
)


DUCK_FIELDS = duck_records.Fields(
    STR_FIELDS, INT_FIELDS, FLOAT_FIELDS, BOOL_FIELDS, LIST_FIELDS, META_FLOAT_FIELDS, META_HIST_FIELDS
)


SCORE_SCHEMA = pa.schema(
    [
        (name, {int: pa.int64(), bool: pa.bool_()}[base_type(typing.get_type_hints(ScoreLine)[name])])
        for name in ("request_index", "correct")
    ]
)


@dataclass(frozen=True)
class BadLine:
    """A records line the analysis could not use as it is."""

    path: str
    line: int
    reason: str


def read_records_file(
    path: Path, force_slow: bool = False, reader: duck_records.Reader | None = None, int_lists: bool = True
) -> tuple[pa.Table, list[BadLine], bool]:
    """One records.jsonl as a table of RECORD_SCHEMA; returns (table, bad lines, used the slow path). `reader`: the
    fast reader to use (one is opened for the call when None). `int_lists` False: the fast reader's LIST_FIELDS
    stay list<double> (integers below 2^53, checked: exact), for _list_parts to convert as it flattens them."""
    if force_slow:
        return _read_file(path, None, False, int_lists)
    if reader is None:
        with duck_records.Reader(DUCK_FIELDS) as own:
            return read_records_files([path], own, int_lists)[0]
    return read_records_files([path], reader, int_lists)[0]


def read_records_files(
    paths: list[Path], reader: duck_records.Reader, int_lists: bool = True
) -> list[tuple[pa.Table, list[BadLine], bool]]:
    """read_records_file of each of `paths`, the fast reader's queries made once for them all (DuckDB's cost per
    query, not per byte, was most of a load of many small runs)."""
    sized = [p for p in paths if p.is_file() and p.stat().st_size > 0]
    fast = dict(zip(sized, reader.read_many(sized), strict=True))
    candidates = [p for p in sized if fast[p] is not None and not _has_nonfinite_words(p)]
    odd = duck_records.files_with_other_keys(candidates, RECORD_KEYS, reader)
    return [_read_file(p, fast.get(p), p not in candidates or p in odd, int_lists) for p in paths]


def _read_file(
    path: Path, fast: pa.Table | None, line_checks: bool, int_lists: bool
) -> tuple[pa.Table, list[BadLine], bool]:
    """The file's result from the fast reader's table `fast` unless it is None or the file needs `line_checks`:
    then read line by line."""
    if not path.is_file() or path.stat().st_size == 0:
        return RECORD_SCHEMA.empty_table(), [], False
    if fast is not None and not line_checks:
        if int_lists:
            fast = duck_records.int_lists(fast, LIST_FIELDS)
        schema = RECORD_SCHEMA if int_lists else _DOUBLE_LISTS_SCHEMA
        table, bad = _null_nonfinite(fast.select(schema.names).cast(schema), path)
        return table, bad, False
    table, bad = _read_slow(path)
    return table, bad, True


def _null_nonfinite(table: pa.Table, path: Path) -> tuple[pa.Table, list[BadLine]]:
    """NaN and infinities in number fields (JSON has neither; Python's writer can emit them) become
    null, each one a BadLine: a figure never silently absorbs them."""
    bad: list[BadLine] = []
    for name in FLOAT_FIELDS:
        column = table.column(name)
        mask = pc.fill_null(pc.or_(pc.is_nan(column), pc.is_inf(column)), False)
        rows = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        if len(rows):
            values = column.to_numpy(zero_copy_only=False)
            numbers = line_numbers(path, [int(r) for r in rows], slow=False)
            bad += [
                BadLine(
                    str(path), number, f"{name}={float(values[r])!r} is not finite, or too large for a float (ignored)"
                )
                for r, number in zip(rows, numbers, strict=True)
            ]
            nulls = pa.nulls(len(column), pa.float64())
            table = table.set_column(table.schema.get_field_index(name), name, pc.if_else(mask, nulls, column))
    return table, bad


def line_numbers(path: Path, rows: list[int], slow: bool) -> list[int]:
    """The 1-based line of `path` that each record row (0-based, in the order read_records_file returned them) came
    from: both readers skip blank lines, and the line-by-line one (`slow`) also the lines that are not JSON objects.
    Read again for the few rows a message names."""
    wanted = set(rows)
    found: dict[int, int] = {}
    lines = json_lines(path, []) if slow else _nonblank(path)
    ordinal = -1
    for number, obj in lines:
        if slow and not isinstance(obj, dict):
            continue
        ordinal += 1
        if ordinal in wanted:
            found[ordinal] = number
            if len(found) == len(wanted):
                break
    return [found.get(r, r + 1) for r in rows]


def _nonblank(path: Path) -> Iterator[tuple[int, None]]:
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, None


def _read_slow(path: Path) -> tuple[pa.Table, list[BadLine]]:
    rows: list[dict[str, Any]] = []
    bad: list[BadLine] = []
    for number, obj in json_lines(path, bad):
        if not isinstance(obj, dict):
            bad.append(BadLine(str(path), number, "not a JSON object"))
            continue
        problems: list[str] = []
        rows.append(_coerce(obj, problems))
        problems += [
            f"unknown key {k!r}: not a key of a record (harness.contract.Record)" for k in obj.keys() - RECORD_KEYS
        ]
        problems += [
            f"{where}={value!r} is not finite" for where, value in _nonfinite(obj.get("meta_info"), "meta_info")
        ]
        bad.extend(BadLine(str(path), number, p) for p in problems)
    return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA), bad


def _has_nonfinite_words(path: Path) -> bool:
    """Whether the file has a NaN or Infinity, which only the line-by-line reader reports (by the bytes: a text
    holding the word is read line by line too, and passes). A key that is not a record's is the other thing only
    it reports (duck_records.files_with_other_keys)."""
    data = path.read_bytes()
    return any(word in data for word in NONFINITE_WORDS)


def _nonfinite(value: Any, where: str) -> Iterator[tuple[str, float]]:
    """(path, value) of each NaN or infinity inside `value` (nested objects and lists)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _nonfinite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nonfinite(item, f"{where}[{i}]")


def json_lines(path: Path, bad: list[BadLine]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) of each non-blank line; a line that is not JSON goes to `bad`."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except ValueError as err:
                bad.append(BadLine(str(path), number, f"not JSON ({err})"))


def _coerce(obj: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name in STR_FIELDS:
        row[name] = _text(name, obj.get(name), problems)
    for name in INT_FIELDS:
        row[name] = _as_number(name, obj.get(name), problems, integral=True)
    for name in FLOAT_FIELDS:
        row[name] = _as_number(name, obj.get(name), problems, integral=False)
    for name in BOOL_FIELDS:
        value = obj.get(name)
        if value is not None and not isinstance(value, bool):
            problems.append(f"{name}={value!r} is not a boolean (ignored)")
            value = None
        row[name] = value
    for name in LIST_FIELDS:
        row[name] = _int_list(name, obj.get(name), problems)
    row["meta_info"] = _coerce_meta(obj.get("meta_info"), problems)
    return row


def _text(name: str, value: Any, problems: list[str]) -> str | None:
    text = None if value is None else str(value)
    if text is not None and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the JSON)
            problems.append(f"{name}={value!r} is not valid Unicode (ignored)")
            return None
    return text


def _int_list(name: str, value: Any, problems: list[str]) -> list[int] | None:
    if value is None:
        return None
    ints = _integers(value)
    if ints is None:
        problems.append(f"{name} is not a list of integers (ignored)")
    return ints


def _integers(value: Any) -> list[int] | None:
    """`value` as a list of 64-bit integers (an integral float counts, as in the integer fields), or None."""
    if not isinstance(value, list):
        return None
    ints = [int(v) if isinstance(v, float) and v.is_integer() else v for v in value]
    if all(isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX for v in ints):
        return ints
    return None


def _as_number(name: str, value: Any, problems: list[str], integral: bool) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(f"{name}={value!r} is not a number (ignored)")
        return None
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{name}={value!r} is not finite (ignored)")
        return None
    if integral:
        if isinstance(value, float) and not value.is_integer():  # an int is one (its float may not be)
            problems.append(f"{name}={value!r} is not an integer (ignored)")
            return None
        if not INT64_MIN <= int(value) <= INT64_MAX:
            problems.append(f"{name}={value!r} is out of the 64-bit integer range (ignored)")
            return None
        return int(value)
    if abs(value) > _FLOAT_MAX:
        problems.append(f"{name}={value!r} is too large for a float (ignored)")
        return None
    return float(value)


def _coerce_meta(meta: Any, problems: list[str]) -> dict[str, Any] | None:
    if meta is None:
        return None
    if not isinstance(meta, dict):
        problems.append("meta_info is not an object (ignored)")
        return None
    out: dict[str, Any] = {}
    for name in META_FLOAT_FIELDS:
        out[name] = _as_number(f"meta_info.{name}", meta.get(name), problems, integral=False)
    for name in META_HIST_FIELDS:
        out[name] = _int_list(f"meta_info.{name}", meta.get(name), problems)
    return out


def read_scores_file(path: Path) -> tuple[pa.Table, list[BadLine]]:
    """scores.jsonl as (request_index, correct); unreadable lines become BadLines."""
    try:
        table = pj.read_json(
            path,
            read_options=pj.ReadOptions(block_size=_BLOCK_BYTES, use_threads=False),
            parse_options=pj.ParseOptions(explicit_schema=SCORE_SCHEMA, unexpected_field_behavior="ignore"),
        )
        return table.select(SCORE_SCHEMA.names).cast(SCORE_SCHEMA), []
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    rows: list[dict[str, Any]] = []
    bad: list[BadLine] = []
    for number, obj in json_lines(path, bad):
        index, correct = (obj.get("request_index"), obj.get("correct")) if isinstance(obj, dict) else (None, None)
        if (
            not isinstance(index, int)
            or isinstance(index, bool)
            or not INT64_MIN <= index <= INT64_MAX
            or not (correct is None or isinstance(correct, bool))
        ):
            bad.append(BadLine(str(path), number, "not a score line (request_index integer, correct boolean or null)"))
            continue
        rows.append({"request_index": index, "correct": correct})
    return pa.Table.from_pylist(rows, schema=SCORE_SCHEMA), bad
