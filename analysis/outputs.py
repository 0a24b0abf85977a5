"""Output identity: did the arms produce the same responses? For each arm against the baseline, the paired
requests (same campaign, base seed, repeat and item; both used by the figures) whose completion text and token ids
are identical, n/N, and for the first differing ones the first position where they part.

A change that claims to alter nothing but speed (a verify-probability builder, a kernel, under deterministic
inference) declares `experiment.expect: identical_outputs`; then any difference fails the audit, naming the requests.
Elsewhere the figure is information: sampled drafts verified another way draw other tokens.

The texts and ids are read here, not by the records reader (which skips them: most figures need neither), through
DuckDB, which hashes them (MD5) as it parses, so the comparison costs one pass over the files and the hashes; the
few requests listed as differing are read again in full to find their first differing position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd

from analysis.check import FAIL, INFO, OK, Check
from analysis.load import Loaded

LISTED = 10  # differing requests named per arm pair
_EMPTY = pd.DataFrame(columns=["filename", "item_id", "text_md5", "ids_md5"])
_COLUMNS = "{item_id: 'VARCHAR', warmup: 'BOOLEAN', output_text: 'VARCHAR', output_ids: 'BIGINT[]'}"
_HASHES = (
    "SELECT filename, item_id, md5(output_text) AS text_md5, md5(CAST(output_ids AS VARCHAR)) AS ids_md5 FROM "
    f"read_json(?, format='newline_delimited', records=true, filename=true, columns={_COLUMNS}) "
    "WHERE NOT coalesce(warmup, false)"
)
_FULL = (
    f"SELECT item_id, output_text, output_ids FROM read_json(?, format='newline_delimited', records=true, "
    f"columns={_COLUMNS}) WHERE NOT coalesce(warmup, false)"
)


@dataclass(frozen=True)
class Differing:
    """One paired request whose outputs differ, and where."""

    campaign: str
    base_seed: int
    repeat: int
    item_id: str
    where: str  # e.g. "token 17 (token: 56 tokens, block: 96)", "character 52 (token: 80 characters, block: 80: one
    # is the other's start)": the baseline's length first

    def __str__(self) -> str:
        return f"{self.campaign} seed {self.base_seed} repeat {self.repeat} item {self.item_id}: first differs at {self.where}"


@dataclass(frozen=True)
class Identity:
    """One arm's outputs against the baseline's."""

    arm: str
    baseline: str
    pairs: int  # paired requests, both used
    identical: int
    with_ids: int  # pairs whose token ids both sides recorded (the rest compare text alone)
    unrecorded: int  # pairs where a side recorded no text (client.store_output_text=false)
    differing: tuple[Differing, ...]  # the first LISTED
    unreadable: tuple[str, ...] = ()  # records files DuckDB could not read (the audit's parsing check names why)

    @property
    def compared(self) -> str:
        """What equality means here, in words."""
        if self.pairs and self.with_ids == self.pairs:
            return "text and token ids"
        if self.with_ids:
            return f"text, and token ids in {self.with_ids} of them"
        return "text (no token ids recorded)"

    @property
    def complete(self) -> bool:
        """Every pair was compared."""
        return not self.unrecorded and not self.unreadable and self.pairs > 0

    def doc(self) -> dict[str, object]:
        """For summary.json."""
        return {
            "arm": self.arm,
            "baseline": self.baseline,
            "pairs": self.pairs,
            "identical": self.identical,
            "compared": self.compared,
            "pairs_with_token_ids": self.with_ids,
            "pairs_without_text": self.unrecorded,
            "differing": [
                {
                    "campaign": d.campaign,
                    "base_seed": d.base_seed,
                    "repeat": d.repeat,
                    "item_id": d.item_id,
                    "first_difference": d.where,
                }
                for d in self.differing
            ],
            "unreadable_files": list(self.unreadable),
        }

    def line(self) -> str:
        if not self.pairs:
            return f"{self.arm} vs {self.baseline}: no paired requests to compare"
        gaps = f"; {self.unrecorded} pair(s) without a recorded text" if self.unrecorded else ""
        gaps += f"; {len(self.unreadable)} records file(s) unreadable" if self.unreadable else ""
        return f"{self.arm} vs {self.baseline}: {self.identical}/{self.pairs} identical ({self.compared}){gaps}"


def _connect(threads: int = 1) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(config={"threads": threads, "autoinstall_known_extensions": False})


def _hashes(paths: list[str]) -> pd.DataFrame | None:
    """Per measured record of the files, in file order: its file, item_id and the MD5 of its text and ids (None: a
    file DuckDB cannot read)."""
    try:
        with _connect(threads=2) as con:
            # (one thread per file keeps each file's rows in order; preserve_insertion_order does across files)
            return con.execute(_HASHES, [paths]).df()
    except duckdb.Error:
        return None


def _used_keys(data: Loaded, used: np.ndarray) -> pd.DataFrame:
    """The used records' (run, item_id), with their run's campaign, arm, base seed and repeat."""
    rec = data.records.loc[used, ["_run", "item_id"]].rename(columns={"_run": "run"})
    runs = data.runs[["run", "campaign", "arm", "base_seed", "repeat", "records_path"]]
    return rec.merge(runs, on="run", how="left")


def _with_hashes(keys: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`keys` with the text and ids hashes of each record (the first measured record of its item in its file, as the
    audit chooses); the files that could not be read."""
    files = keys[["run", "records_path"]].drop_duplicates("run")
    paths = [str(p) for p in files["records_path"] if p]
    found = _hashes(paths) if paths else None
    unreadable: list[str] = []
    if found is None and paths:  # one bad file fails the whole read: read each alone, to keep the others
        parts = [(p, _hashes([p])) for p in paths]
        unreadable = [p for p, part in parts if part is None]
        found = pd.concat([part for _, part in parts if part is not None] or [_EMPTY], ignore_index=True)
    hashes = (found if found is not None else _EMPTY).drop_duplicates(["filename", "item_id"])
    hashes = hashes.merge(files.rename(columns={"records_path": "filename"}), on="filename").drop(columns="filename")
    return keys.merge(hashes, on=["run", "item_id"], how="left"), unreadable


def compare_outputs(data: Loaded, used: np.ndarray, arms: list[str], baseline: str) -> list[Identity]:
    """One Identity per non-baseline arm."""
    keys = _used_keys(data, used)
    if keys.empty:
        return [Identity(a, baseline, 0, 0, 0, 0, ()) for a in arms if a != baseline]
    hashed, unreadable = _with_hashes(keys)
    pair_on = ["campaign", "base_seed", "repeat", "item_id"]
    base = hashed[hashed["arm"] == baseline]
    out = []
    for arm in arms:
        if arm == baseline:
            continue
        pairs = base.merge(hashed[hashed["arm"] == arm], on=pair_on, suffixes=("_b", "_a"))
        out.append(_identity(arm, baseline, pairs, tuple(unreadable)))
    return out


def _identity(arm: str, baseline: str, pairs: pd.DataFrame, unreadable: tuple[str, ...]) -> Identity:
    recorded = pairs["text_md5_b"].notna() & pairs["text_md5_a"].notna()
    with_ids = recorded & pairs["ids_md5_b"].notna() & pairs["ids_md5_a"].notna()
    same = (
        recorded
        & (pairs["text_md5_b"] == pairs["text_md5_a"])
        & (~with_ids | (pairs["ids_md5_b"] == pairs["ids_md5_a"]))
    )
    rows = sorted(
        pairs[recorded & ~same].itertuples(index=False),
        key=lambda r: (r.campaign, r.base_seed, r.repeat, _natural(str(r.item_id))),
    )[:LISTED]
    listed = tuple(_where(row, (baseline, arm)) for row in rows)
    return Identity(
        arm, baseline, len(pairs), int(same.sum()), int(with_ids.sum()), int((~recorded).sum()), listed, unreadable
    )


def _full(path: str, item_id: str) -> tuple[str | None, list[int] | None]:
    """The text and ids of the first measured record of `item_id` in the file."""
    with _connect() as con:
        rows = con.execute(_FULL + " AND item_id = ? LIMIT 1", [path, item_id]).fetchall()
    return (rows[0][1], rows[0][2]) if rows else (None, None)


def first_difference(a: list | str, b: list | str, unit: str, names: tuple[str, str] = ("a", "b")) -> str:
    """Where two sequences first part, in words; `names`: whose each is (the lengths are said by name)."""
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    lengths = f"{names[0]}: {len(a)} {unit}s, {names[1]}: {len(b)}"
    if i == n:
        return f"{unit} {i} ({lengths}: one is the other's start)"
    return f"{unit} {i} ({lengths})"


def _where(row: object, names: tuple[str, str]) -> Differing:
    text_b, ids_b = _full(str(row.records_path_b), str(row.item_id))  # type: ignore[attr-defined]
    text_a, ids_a = _full(str(row.records_path_a), str(row.item_id))  # type: ignore[attr-defined]
    if ids_a is not None and ids_b is not None and ids_a != ids_b:
        where = first_difference(ids_b, ids_a, "token", names)
    else:
        where = first_difference(text_b or "", text_a or "", "character", names)
    return Differing(str(row.campaign), int(row.base_seed), int(row.repeat), str(row.item_id), where)  # type: ignore[attr-defined]


def _natural(item_id: str) -> tuple:
    """q2 before q10: the digit runs of an id compared as numbers."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", item_id) if p)


CHECK_NAME = "Outputs identical across arms, as the experiment expects"


def check_outputs(identities: list[Identity], expect: str | None) -> Check:
    """The audit's check: information without an expectation; with `identical_outputs`, a failure when any pair
    differs or could not be compared (a claim of identical outputs that was not checked is not a pass)."""
    summary = "; ".join(i.line() for i in identities) or "no other arm"
    details = tuple(f"{i.arm} vs {i.baseline}: {d}" for i in identities for d in i.differing)
    details += tuple(f"unreadable records file: {p}" for p in sorted({p for i in identities for p in i.unreadable}))
    if expect != "identical_outputs":
        return Check(CHECK_NAME, INFO, summary + " (no expectation declared: experiment.expect)", details)
    failed = [i for i in identities if i.identical < i.pairs or not i.complete]
    if failed:
        more = sum(i.pairs - i.identical - i.unrecorded - len(i.differing) for i in failed)
        tail = (f"and {more} more differing pair(s), not listed",) if more > 0 else ()
        return Check(CHECK_NAME, FAIL, f"experiment.expect=identical_outputs, but {summary}", details + tail)
    return Check(CHECK_NAME, OK, f"experiment.expect=identical_outputs: {summary}", details)
