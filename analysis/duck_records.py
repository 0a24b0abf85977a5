"""records.jsonl through DuckDB's JSON reader: the fast path of analysis.read_records.read_records_file.

DuckDB parses only the keys the analysis uses, with about half the CPU time of pyarrow's JSON reader on the records
the harness writes (README: the report's figures). Its conversions are looser than the line-by-line reader's
(analysis.read_records._read_slow, which reports a value of the wrong JSON type as a bad line): it reads 1.5 in an integer
field as 2, "40" and true as numbers, any value as text. So scalars are read as their JSON text and converted here,
in the same query, with a check per value; integer lists are read as doubles and checked here. A value of another
JSON type, a fraction in an integer field, a list element that is not an integer below 2^53, a non-finite
meta_info number, a line that is not an object (it reads as a row of nulls, as an empty object does) each mark the
file, and so does an error of DuckDB's (a truncated line, invalid UTF-8, a key given twice): such a file is left to
the line-by-line reader, which names each bad line. One looseness stays: inside the integer lists (chunk_us,
chunk_tokens, the histograms) a string of digits or a boolean reads as its number ("2" as 2, true as 1); the
harness writes neither, and the line-by-line reader (build_report(force_slow_reader=True)) reports both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

EXACT = 2**53  # a double holds every integer below it exactly (2^53 + 1 reads as 2^53)


@dataclass(frozen=True)
class Fields:
    """The keys read, by the type the analysis gives them (analysis.load's field groups)."""

    strings: tuple[str, ...]
    ints: tuple[str, ...]
    floats: tuple[str, ...]
    bools: tuple[str, ...]
    lists: tuple[str, ...]  # lists of integers
    meta_floats: tuple[str, ...]  # keys of the meta_info object
    meta_lists: tuple[str, ...]


class Reader:
    """One DuckDB database for the files of a load (opening one costs about 20 ms); each read goes through a cursor
    of its own, so that threads may read side by side."""

    def __init__(self, fields: Fields):
        self.fields = fields
        self.query, self.columns = _query(fields)
        self.db = duckdb.connect(config={"threads": 1, "autoinstall_known_extensions": False})

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.close()

    def read(self, path: Path) -> pa.Table | None:
        """The file's records (the fields' columns, then a `meta_info` struct), or None when the file must be read
        line by line (a row the checks doubt, or an error of DuckDB's). The integer lists of `Fields.lists` stay
        list<double>, each element checked to be an integer below EXACT (so exact as a double: int_lists converts
        them); the meta_info lists are list<int64>."""
        return self.read_many([path])[0]

    def read_many(self, paths: list[Path]) -> list[pa.Table | None]:
        """What `read` gives for each file, from one query over them all (a query costs about 20 ms of CPU time
        however small its file: one per file was most of a load of many small runs). Each file's table is a slice
        of the one read. A DuckDB error, a doubt or a list the checks refuse anywhere: each file is read alone, so
        that only the files at fault go to the line-by-line reader."""
        if not paths:
            return []
        with self.db.cursor() as con:
            try:
                table = con.sql(self.query, params=[[str(p) for p in paths]]).to_arrow_table()
            except duckdb.Error:
                table = None
        spans = None if table is None else _file_spans(table.column("_file"), [str(p) for p in paths])
        whole = None if table is None or spans is None else self._finish(table)
        if whole is None or spans is None:
            return [None] if len(paths) == 1 else [self.read(p) for p in paths]
        return [whole.slice(start, stop - start) for start, stop in spans]

    def _finish(self, table: pa.Table) -> pa.Table | None:
        """The query's rows as `read` returns them, or None when a row is doubted or a list is not of integers."""
        if table.num_rows and pc.any(table.column("_doubt")).as_py():
            return None
        f = self.fields
        lists = {name: _checked_list(table.column(name)) for name in f.lists}
        meta_lists = [_int_list(table.column(f"_m_{n}")) for n in f.meta_lists]
        if any(v is None for v in [*lists.values(), *meta_lists]):
            return None
        meta = pa.StructArray.from_arrays(
            [one_array(table.column(f"_m_{n}")) for n in f.meta_floats] + meta_lists,
            names=[*f.meta_floats, *f.meta_lists],
            mask=one_array(table.column("_m_null")),
        )
        out = table.select(list(self.columns))
        for name in f.lists:
            out = out.set_column(out.schema.get_field_index(name), name, lists[name])
        return out.append_column("meta_info", meta)


def _file_spans(files: pa.ChunkedArray, paths: list[str]) -> list[tuple[int, int]] | None:
    """(first row, end row) of each of `paths` in the query's `filename` column (a file of no records: an empty
    span), or None unless every row names one of `paths` and each file's rows are together, in the order given."""
    encoded = one_array(files).dictionary_encode()
    names = encoded.dictionary.to_pylist()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.diff(codes, prepend=-1)) if len(codes) else np.zeros(0, np.int64)
    order = [names[c] for c in codes[starts]]
    at = {p: i for i, p in enumerate(paths)}
    if len(set(order)) != len(order) or any(name not in at for name in order):
        return None
    if [at[name] for name in order] != sorted(at[name] for name in order):
        return None
    ends = [*starts[1:].tolist(), len(codes)] if len(starts) else []
    bounds = dict(zip(order, zip(starts.tolist(), ends, strict=True), strict=True))
    spans: list[tuple[int, int]] = []
    for p in paths:
        end = spans[-1][1] if spans else 0
        spans.append(bounds.get(p, (end, end)))
    return spans


def files_with_other_keys(paths: list[Path], keys: frozenset[str], reader: Reader) -> set[Path]:
    """The files among `paths` that have a line with a key outside `keys`, by one query over them all; where DuckDB
    fails on one, each file is asked alone (has_other_keys)."""
    if not paths:
        return set()
    query = (
        "SELECT DISTINCT filename FROM read_ndjson_objects(?, filename=true) WHERE NOT list_has_all(?, json_keys(json))"
    )
    try:
        with reader.db.cursor() as con:
            named = {row[0] for row in con.sql(query, params=[[str(p) for p in paths], sorted(keys)]).fetchall()}
    except duckdb.Error:
        return {p for p in paths if has_other_keys(p, keys, reader)}
    odd = {p for p in paths if str(p) in named}
    if len(odd) != len(named):  # a name DuckDB gave that is none of the paths: ask each file alone
        return {p for p in paths if has_other_keys(p, keys, reader)}
    return odd


def has_other_keys(path: Path, keys: frozenset[str], reader: Reader | None = None) -> bool:
    """Whether a line of the file has a key outside `keys` (each line's keys read by DuckDB: about 3% of a read's
    time)."""
    query = "SELECT count(*) FROM read_ndjson_objects(?) WHERE NOT list_has_all(?, json_keys(json))"
    params = [str(path), sorted(keys)]
    try:
        if reader is not None:
            with reader.db.cursor() as con:
                return con.sql(query, params=params).fetchall()[0][0] > 0
        with duckdb.connect(config={"threads": 1, "autoinstall_known_extensions": False}) as con:
            return con.sql(query, params=params).fetchall()[0][0] > 0
    except duckdb.Error:
        return True  # the line-by-line reader names what is wrong


def int_lists(table: pa.Table, names: tuple[str, ...]) -> pa.Table:
    """`table` with its list<double> columns `names` (as Reader.read leaves them: integers below EXACT) as
    list<int64>."""
    for name in names:
        ints = pc.cast(table.column(name), pa.list_(pa.int64()))
        table = table.set_column(table.schema.get_field_index(name), name, ints)
    return table


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its only chunk as it is (combine_chunks copies even one chunk: the chunk lists of a
    large campaign, 0.6 GB of fresh pages), else the chunks combined."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _checked_list(column: pa.ChunkedArray) -> pa.ListArray | None:
    """A list<double> column as one array, or None when an element is null, not an integer, or of EXACT or more (its
    double may not be the integer written; the line-by-line reader reads it exactly)."""
    lists = one_array(column)
    if lists.values.null_count:
        return None
    return lists if _integral(lists.values.to_numpy()) else None


def _int_list(column: pa.ChunkedArray) -> pa.ListArray | None:
    """A list<double> column as list<int64>, or None where _checked_list finds it is not one of integers."""
    lists = _checked_list(column)
    return None if lists is None else pc.cast(lists, pa.list_(pa.int64()))  # as int_lists casts whole columns


_BLOCK = 1 << 16  # values checked at a time: the temporaries stay in cache rather than take fresh pages


def _integral(x: np.ndarray) -> bool:
    """Every element of the float64 array `x` an integer of magnitude below EXACT (NaN is not)."""
    buffer = np.empty(min(len(x), _BLOCK))
    for start in range(0, len(x), _BLOCK):
        block = x[start : start + _BLOCK]
        work = buffer[: len(block)]
        np.trunc(block, out=work)
        if not np.array_equal(work, block):
            return False
        if np.abs(block, out=work).max() >= EXACT:
            return False
    return True


def _query(f: Fields) -> tuple[str, tuple[str, ...]]:
    """(the query, with the list of files as its one parameter; the top-level columns it returns besides the meta parts)."""
    types: dict[str, str] = {}
    select: list[str] = []
    doubts: list[str] = []
    for name in f.strings:
        types[name] = "JSON"
        select.append(f"{_q(name)}->>'$' AS {_q(name)}")
        doubts.append(f"({_q(name)} IS NOT NULL AND NOT starts_with({_q(name)}::VARCHAR, '\"'))")
    for name in f.ints:
        types[name] = "JSON"
        text = f"{_q(name)}::VARCHAR"
        as_int = f"TRY_CAST({text} AS BIGINT)"
        select.append(f"{as_int} AS {_q(name)}")
        # DuckDB rounds '1.5' to 2: the integer must be the number the text is
        doubts.append(
            f"({text} IS NOT NULL AND ({as_int} IS NULL OR TRY_CAST({text} AS DOUBLE) IS DISTINCT FROM "
            f"{as_int}::DOUBLE))"
        )
    for name in f.floats:
        types[name] = "JSON"
        _number(_q(name), _q(name), select, doubts)
    for name in f.bools:
        types[name] = "JSON"
        text = f"{_q(name)}::VARCHAR"
        select.append(f"CASE {text} WHEN 'true' THEN true WHEN 'false' THEN false END AS {_q(name)}")
        doubts.append(f"({text} IS NOT NULL AND {text} NOT IN ('true', 'false'))")
    for name in f.lists:
        types[name] = "DOUBLE[]"
        select.append(_q(name))
    types["meta_info"] = (
        "STRUCT("
        + ", ".join([f"{_q(n)} JSON" for n in f.meta_floats] + [f"{_q(n)} DOUBLE[]" for n in f.meta_lists])
        + ")"
    )
    for name in f.meta_floats:
        _number(f"meta_info.{_q(name)}", _q(f"_m_{name}"), select, doubts, finite=True)
    for name in f.meta_lists:
        select.append(f"meta_info.{_q(name)} AS {_q(f'_m_{name}')}")
    select.append("meta_info IS NULL AS _m_null")
    # a line that is not an object reads as a row of nulls (as {} does: both left to the line-by-line reader)
    doubts.append("(" + " AND ".join(f"{_q(n)} IS NULL" for n in types) + ")")
    columns = "{" + ", ".join(f"'{n}': '{t}'" for n, t in types.items()) + "}"
    query = (
        f"SELECT {', '.join(select)}, ({' OR '.join(doubts)}) AS _doubt, filename AS _file FROM read_json(?, "
        f"format='newline_delimited', records=true, columns={columns}, filename=true)"
    )
    return query, tuple(n for n in types if n != "meta_info")


def _number(expr: str, alias: str, select: list[str], doubts: list[str], finite: bool = False) -> None:
    """A float field: NaN and infinities read as such (analysis.load nulls them, naming each) unless `finite`
    (then they are doubts: the meta_info fields, which load does not check)."""
    value = f"TRY_CAST({expr}::VARCHAR AS DOUBLE)"
    select.append(f"{value} AS {alias}")
    doubts.append(
        f"({expr} IS NOT NULL AND " + (f"NOT coalesce(isfinite({value}), false))" if finite else f"{value} IS NULL)")
    )


def _q(name: str) -> str:
    return '"' + name + '"'
