"""Read campaigns: find them, read `campaign.json` and the run manifests (each key checked against its declared
type), and lay every run's records out in flat tables (`Loaded`): the analysis reads nothing else.

The layout is the one in `docs/records.md`. The files of each run are read by analysis.read_records (DuckDB's JSON
reader, a line-by-line fallback that names each bad line), side by side.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analysis import duck_records
from analysis.read_records import (
    DUCK_FIELDS,
    FLOAT_FIELDS,
    INT64_MAX,
    INT64_MIN,
    INT_FIELDS,
    LIST_FIELDS,
    META_FLOAT_FIELDS,
    META_HIST_FIELDS,
    RECORD_SCHEMA,
    STR_FIELDS,
    BadLine,
    read_records_file,
    read_records_files,
    read_scores_file,
)
from harness.contract import (
    SCHEMA_VERSIONS,
    CampaignDoc,
    Manifest,
    PlannedRun,
    flag_value,
    json_types,
    nested,
)


class InputError(Exception):
    """The inputs cannot be read as campaigns (the message says which file and why)."""


@dataclass(frozen=True)
class CampaignDir:
    """One campaign directory as the analysis reads it: its `campaign.json` and the run directories found
    under `runs/` (the runner's harness.runner.runs.Campaign is the writing side)."""

    path: Path
    meta: dict[str, Any]
    run_dirs: dict[str, Path]
    manifests: dict[str, dict[str, Any]]

    @property
    def campaign_id(self) -> str:
        return str(self.meta.get("campaign_id") or self.path.name)

    @property
    def experiment(self) -> str:
        return str(self.meta.get("experiment") or self.path.parent.name)

    @property
    def label(self) -> str:
        """`experiment/campaign`: how the report names the campaign (independent of the cwd)."""
        return f"{self.path.parent.name}/{self.path.name}"

    @property
    def baseline(self) -> str:
        return str(self.meta.get("baseline") or "")

    @property
    def arms(self) -> list[dict[str, Any]]:
        return list(self.meta.get("arms") or [])

    @property
    def arm_names(self) -> list[str]:
        return [str(a.get("name")) for a in self.arms]

    @property
    def items(self) -> list[dict[str, Any]]:
        return list((self.meta.get("workload") or {}).get("items") or [])

    @property
    def plan(self) -> list[dict[str, Any]]:
        return list(self.meta.get("plan") or [])

    @property
    def schema_version(self) -> int:
        return int(self.meta.get("schema_version") or 1)

    def seed_stream(self, arm: str) -> int:
        """The arm's `seed_stream` (schema 2; absent = 0): its request seeds are offset by stream * 2**32."""
        decl = next((a for a in self.arms if str(a.get("name")) == arm), {})
        value = decl.get("seed_stream")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def open_loop(self) -> bool:
        """Requests arrive on a schedule (`request_rate` set) rather than as slots free up."""
        return self.meta.get("request_rate") is not None

    @property
    def experiment_config(self) -> dict[str, Any]:
        """`config.experiment` as the campaign recorded it ({} when absent)."""
        return (self.meta.get("config") or {}).get("experiment") or {}

    @property
    def seeded_requests(self) -> bool:
        """`config.experiment.seeded_requests`; the schema's default (true) when absent."""
        return bool(self.experiment_config.get("seeded_requests", True))

    @property
    def aa(self) -> bool:
        """`config.experiment.aa`: an A/A by declaration (campaigns before 2026-12-05: false)."""
        return bool(self.experiment_config.get("aa", False))

    @property
    def expect(self) -> str | None:
        """`config.experiment.expect` (identical_outputs), or None."""
        value = self.experiment_config.get("expect")
        return str(value) if value else None


@dataclass(frozen=True)
class Histograms:
    """`spec_correct_drafts_histogram` (or its old alias) of every record.

    dense: [records, bins] verify steps by number of correct drafts (zeros past a record's list).
    present: [records] whether the record carries a histogram.
    """

    dense: np.ndarray
    present: np.ndarray


@dataclass(frozen=True)
class Chunks:
    """`chunk_us` and `chunk_tokens` of every record, flattened (schema 2; empty for schema 1).

    us_offsets: [records + 1] the slice of `us` that belongs to each record; us: arrival offsets after
    t_sent in microseconds. tok_offsets, tok: the same for chunk_tokens. us_present / tok_present: the
    record carries the list.
    """

    us_offsets: np.ndarray
    us: np.ndarray
    us_present: np.ndarray
    tok_offsets: np.ndarray
    tok: np.ndarray
    tok_present: np.ndarray

    @property
    def aligned(self) -> np.ndarray:
        """[records] both lists present and of the same length (tokens per chunk are known)."""
        return self.us_present & self.tok_present & (np.diff(self.us_offsets) == np.diff(self.tok_offsets))


def segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64 sums of values[offsets[i]:offsets[i + 1]] for each i (0 for an empty segment); offsets non-decreasing
    from 0 to len(values), as Chunks' are."""
    sums = np.zeros(len(offsets) - 1, dtype=np.int64)
    filled = np.flatnonzero(np.diff(offsets) > 0)  # each sum runs to the next filled segment's start
    if len(filled):
        sums[filled] = np.add.reduceat(values, offsets[filled])
    return sums


@dataclass
class Loaded:
    """Everything read from the inputs, in flat tables.

    runs: one row per planned run, then runs found on disk but not planned; `run` is its position.
    items: one row per distinct `item_id` over all campaigns; `item` is its position.
    records: one row per records line, in file order, with `_run` (a row of runs) and `_item`
      (a row of items, -1 when the id is not planned).
    """

    campaigns: list[CampaignDir]
    runs: pd.DataFrame
    items: pd.DataFrame
    records: pd.DataFrame
    hist: Histograms
    chunks: Chunks
    bad_lines: list[BadLine] = field(default_factory=list)
    slow_files: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# discovery


def discover(paths: list[str | Path]) -> list[Path]:
    """Campaign directories under `paths`: each path is a campaign or a directory holding some."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if (path / "campaign.json").is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(_campaigns_below(path))
        else:
            raise InputError(f"{path}: no such directory")
    unique = sorted({p.resolve(): p for p in found}.values(), key=lambda p: str(p.resolve()))
    if not unique:
        raise InputError(f"no campaign.json found under {', '.join(map(str, paths))}")
    return unique


def _campaigns_below(root: Path) -> list[Path]:
    out = []
    for marker in sorted(root.rglob("campaign.json")):
        rel = marker.relative_to(root).parts
        if "runs" in rel[:-1] or any(".failed-" in part for part in rel):
            continue
        out.append(marker.parent)
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: cannot read JSON ({err})") from err
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


# The JSON types every key of campaign.json and manifest.json may have (None is always allowed), nested
# objects included, as harness.contract declares them. A value of another type stops the analysis with the
# file and key named.
CAMPAIGN_TYPES = json_types(CampaignDoc)
PLAN_TYPES = json_types(PlannedRun)
MANIFEST_TYPES = json_types(Manifest)


def _type_problem(value: Any, kinds: tuple[type, ...]) -> str | None:
    """Why `value` is not one of `kinds` (JSON-wise: a bool is not an int), or None when it is."""
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds:
        return "a boolean"
    if not isinstance(value, kinds):
        return f"of type {type(value).__name__}"
    if isinstance(value, float) and not math.isfinite(value):
        return "not finite"
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        return "out of the 64-bit integer range"
    return None


def check_types(path: Path, doc: Any, types: dict[str, tuple[type, ...]], where: str = "") -> None:
    """InputError naming `path` and the key when a read key of `doc` has a value of another type."""
    if not isinstance(doc, dict):
        raise InputError(f"{path}: {where or 'the document'} is not a JSON object")
    for key, kinds in types.items():
        problem = _type_problem(doc.get(key), kinds)
        if problem:
            expected = " or ".join(k.__name__ for k in kinds)
            raise InputError(
                f"{path}: {where}{key}={doc.get(key)!r} is {problem}; expected {expected} or null. "
                "The file was edited or corrupted: restore it, or rerun the run it describes"
            )


def check_doc(path: Path, doc: Any, cls: type, where: str = "") -> None:
    """check_types against the schema class `cls`, and again inside every nested object (and list of them)."""
    check_types(path, doc, json_types(cls), where)
    for name, (sub, many) in nested(cls).items():
        value = doc.get(name)
        if value is None:
            continue
        if many:
            if _plainly_typed(value, sub):  # the common case, checked column-wise (a campaign lists 10^5 items)
                continue
            for i, item in enumerate(value):
                check_doc(path, item, sub, f"{where}{name}[{i}].")
        else:
            check_doc(path, value, sub, f"{where}{name}.")


def _plainly_typed(docs: Any, cls: type) -> bool:
    """True when every element of `docs` is a JSON object that check_doc would accept against `cls` (which
    nests nothing), decided per key from a few representative values (_deciding_values) instead of every
    element. False sends the caller to check_doc's per-element walk, which names the first problem."""
    if not isinstance(docs, list) or nested(cls) or not all(type(d) is dict for d in docs):
        return False
    for key, kinds in json_types(cls).items():
        values = [d.get(key) for d in docs]
        if not {type(v) for v in values} <= _JSON_TYPES:
            return False
        if any(_type_problem(v, kinds) for v in _deciding_values(values)):
            return False
    return True


_JSON_TYPES = {str, int, float, bool, dict, list, type(None)}  # what json.loads makes


def _deciding_values(values: list[Any]) -> list[Any]:
    """Values of JSON types whose _type_problem verdicts are those of all `values`: one of each type (the
    verdict depends on the type alone), the smallest and largest int (the range) and a non-finite float if any."""
    picked = list({type(v): v for v in values}.values())
    ints = [v for v in values if type(v) is int]
    picked += [min(ints), max(ints)] if ints else []
    picked += [v for v in values if type(v) is float and not math.isfinite(v)][:1]
    return picked


def _check_plan(path: Path, meta: dict[str, Any]) -> None:
    """InputError when a planned run lacks what pairs it (its arm, seed and repeat) or the baseline is no arm."""
    fix = "the file was edited or corrupted: restore it from a copy, or rerun the campaign"
    for i, run in enumerate(meta.get("plan") or []):
        for key in ("run_id", "arm", "base_seed", "repeat"):
            if run.get(key) is None:
                raise InputError(f"{path}: plan[{i}].{key} is missing or null; {fix}")
    arms = [str(a.get("name")) for a in meta.get("arms") or []]
    baseline = meta.get("baseline")
    if baseline and arms and baseline not in arms:
        raise InputError(f"{path}: baseline {baseline!r} is not one of the campaign's arms {arms}; {fix}")


def read_campaign(path: Path) -> CampaignDir:
    meta = _read_json(path / "campaign.json")
    if meta.get("schema_version") not in SCHEMA_VERSIONS:
        raise InputError(
            f"{path / 'campaign.json'}: schema_version {meta.get('schema_version')!r}; "
            f"this analysis reads versions {', '.join(map(str, SCHEMA_VERSIONS))}"
        )
    check_doc(path / "campaign.json", meta, CampaignDoc)
    _check_plan(path / "campaign.json", meta)
    run_dirs: dict[str, Path] = {}
    runs_root = path / "runs"
    if runs_root.is_dir():
        for child in sorted(runs_root.iterdir()):
            if child.is_dir() and ".failed-" not in child.name:
                run_dirs[child.name] = child
    manifests = {
        run_id: _read_json(d / "manifest.json") for run_id, d in run_dirs.items() if (d / "manifest.json").is_file()
    }
    for run_id, man in manifests.items():
        check_doc(run_dirs[run_id] / "manifest.json", man, Manifest)
    return CampaignDir(path=path, meta=meta, run_dirs=run_dirs, manifests=manifests)


def check_unique_ids(campaigns: list[CampaignDir]) -> None:
    """InputError naming both folders when two hold one campaign_id: a copy (`cp -r C C.bak`) would count every
    record twice."""
    seen: dict[str, Path] = {}
    for camp in campaigns:
        first = seen.setdefault(camp.campaign_id, camp.path)
        if first != camp.path:
            raise InputError(
                f"{first} and {camp.path} both hold campaign {camp.campaign_id} (one is a copy of the other): "
                "a campaign is read once. Move the copy out of the folder given, or report each folder alone"
            )


# ---------------------------------------------------------------------------------------------
# flat tables


def load(paths: list[str | Path], force_slow: bool = False) -> Loaded:
    """Read every campaign under `paths` into flat tables (no checks beyond parsing)."""
    campaigns = [read_campaign(p) for p in discover(paths)]
    check_unique_ids(campaigns)
    runs = _runs_table(campaigns)
    items = _items_table(campaigns)
    todo = [(int(r.run), Path(r.records_path)) for r in runs.itertuples() if r.records_path]
    scored = _scored_runs(runs)
    # the reads finish (the pool's exit waits for them) before the reader closes; DuckDB and pyarrow release the GIL.
    # force_slow reads line by line only: no DuckDB database is opened for it
    fast: contextlib.AbstractContextManager[duck_records.Reader | None] = (
        contextlib.nullcontext() if force_slow else duck_records.Reader(DUCK_FIELDS)
    )
    workers = os.cpu_count() or 1
    with fast as reader, ThreadPoolExecutor(max_workers=workers) as pool:
        files = [path for _, path in todo]
        batches = [[path] for path in files] if reader is None else _batches(files, workers)
        record_jobs = [pool.submit(_read_batch, batch, reader) for batch in batches]
        score_jobs = [pool.submit(read_scores_file, Path(runs["scores_path"].iat[r])) for r in scored]
        results = [result for job in record_jobs for result in job.result()]
        scores = {r: job.result() for r, job in zip(scored, score_jobs, strict=True)}
    tables = [_tag(table, run) for (run, _), (table, _, _) in zip(todo, results, strict=True)] or [
        _tag(RECORD_SCHEMA.empty_table(), 0)
    ]
    bad = [b for _, lines, _ in results for b in lines]
    slow = [str(path) for (_, path), (_, _, was_slow) in zip(todo, results, strict=True) if was_slow]
    # the chunk lists (list<double> from the fast reader, list<int64> from the slow one) are flattened apart from
    # the other columns, in threads beside the tables: that is mostly the kernel giving out fresh pages
    table = pa.concat_tables([t.drop_columns(list(LIST_FIELDS)) for t in tables])
    with ThreadPoolExecutor(max_workers=2) as pool:
        us, tok = (
            pool.submit(_list_parts, [t.column(name) for t in tables], table.num_rows)
            for name in ("chunk_us", "chunk_tokens")
        )
        records = _records_frame(table, items)
        bad += _apply_scores(records, runs, scores)
        histograms = _histograms(table)
        chunks = Chunks(*us.result(), *tok.result())
    return Loaded(campaigns, runs, items, records, histograms, chunks, bad, slow)


BATCH_FILES = 100  # records files read by one DuckDB query (each query costs about 20 ms of CPU time)
BATCH_BYTES = 32 << 20  # and at most this much JSON, unless one file is more: large files are read one a query


def _batches(paths: list[Path], workers: int) -> list[list[Path]]:
    """`paths` in order, in batches of at most BATCH_FILES files and BATCH_BYTES (a larger file alone), at least
    one batch a worker where there are enough files."""
    most = max(1, min(BATCH_FILES, -(-len(paths) // workers)))
    batches: list[list[Path]] = []
    size = 0
    for path in paths:
        nbytes = path.stat().st_size if path.is_file() else 0
        if not batches or len(batches[-1]) >= most or size + nbytes > BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(path)
        size += nbytes
    return batches


def _read_batch(paths: list[Path], reader: duck_records.Reader | None) -> list[tuple[pa.Table, list[BadLine], bool]]:
    """read_records_file of each path (lists left as the fast reader gives them); line by line where `reader` is
    None (force_slow)."""
    if reader is None:
        return [read_records_file(path, True, None, False) for path in paths]
    return read_records_files(paths, reader, False)


def _tag(table: pa.Table, run: int) -> pa.Table:
    n = table.num_rows
    table = table.append_column("_run", pa.array(np.full(n, run, dtype=np.int64)))
    return table.append_column("_line", pa.array(np.arange(n, dtype=np.int64)))


def _runs_table(campaigns: list[CampaignDir]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for camp in campaigns:
        planned = {str(p.get("run_id")): p for p in camp.plan}
        for run_id, plan in planned.items():
            rows.append(_run_row(camp, run_id, plan))
        for run_id in camp.run_dirs:
            if run_id not in planned:
                rows.append(_run_row(camp, run_id, None))
    frame = pd.DataFrame(rows, columns=list(_RUN_COLUMNS))
    frame.insert(0, "run", np.arange(len(frame), dtype=np.int64))
    return frame


NOT_RUN, NO_MANIFEST = "not run", "no manifest"  # statuses of runs without a manifest
_RUN_COLUMNS = (
    "campaign_id",
    "campaign",
    "run_id",
    "arm",
    "base_seed",
    "repeat",
    "order",
    "gpu",
    "planned",
    "found",
    "records_path",
    "status",
    "concurrency",
    "request_rate",
    "max_new_tokens",
    "seeds_honoured",
    "server_accept_length",
    "deterministic_flag",
    "gpu_name",
    "model_path",
    "dataset_sha256",
    "harness_version",
    "harness_git_sha",
    "harness_dirty",
    "log_checks_passed",
    "schema_version",
    "seed_stream",
    "open_loop",
    "scores_path",
    "scorer",
    "machine_recorded",
    "cpu_other_frac",
    "steal_frac",
    "cpu_other_before",
    "cpu_other_after",
    "server_cpu_s",
    "hostname",
    "node_type",
    "manifest_gpu",
    "gpu_env",
    "spec_algorithm",
    "declared_draft_length",
    "window_start",
    "window_end",
)


def _run_row(camp: CampaignDir, run_id: str, plan: dict[str, Any] | None) -> dict[str, Any]:
    man = camp.manifests.get(run_id) or {}
    source = plan if plan is not None else man
    run_dir = camp.run_dirs.get(run_id)
    records = run_dir / "records.jsonl" if run_dir is not None else None
    versions = man.get("versions") or {}
    harness = versions.get("harness") or {}
    scores = run_dir / "scores.jsonl" if run_dir is not None else None
    arm = str(source.get("arm"))
    return {
        "campaign_id": camp.campaign_id,
        "campaign": camp.label,
        "run_id": run_id,
        "arm": arm,
        "base_seed": _int_or_none(source.get("base_seed")),
        "repeat": _int_or_none(source.get("repeat")),
        "order": _int_or_none(source.get("index")),
        "gpu": source.get("gpu"),
        "planned": plan is not None,
        "found": run_dir is not None,
        "records_path": str(records) if records is not None and records.is_file() else "",
        "status": str(man.get("status")) if man else (NO_MANIFEST if run_dir is not None else NOT_RUN),
        "concurrency": man.get("concurrency", camp.meta.get("concurrency")),
        "request_rate": man.get("request_rate", camp.meta.get("request_rate")),
        "max_new_tokens": man.get("max_new_tokens", camp.meta.get("max_new_tokens")),
        "seeds_honoured": man.get("seeds_honoured"),
        # the end-of-run reply covers the run; the one after readiness only the warmup (flushed)
        "server_accept_length": server_accept_length(man.get("server_info_end") or man.get("server_info")),
        "deterministic_flag": _deterministic_flag(man.get("server_info")),
        "gpu_name": (man.get("gpu_info") or {}).get("name"),
        "model_path": man.get("model_path"),
        "dataset_sha256": (man.get("dataset") or {}).get("sha256"),
        "harness_version": harness.get("version"),
        "harness_git_sha": harness.get("git_sha"),
        "harness_dirty": harness.get("dirty"),
        "log_checks_passed": (man.get("log_checks") or {}).get("passed"),
        "schema_version": camp.schema_version,
        "seed_stream": camp.seed_stream(arm),
        "open_loop": camp.open_loop,
        "scores_path": str(scores) if scores is not None and scores.is_file() else "",
        "scorer": _scorer(man.get("scorer")),
        **_machine(man.get("machine")),
        "server_cpu_s": _num(_dict(man.get("server_cpu")).get("cpu_s")),
        "hostname": (man.get("host") or {}).get("hostname") if man else None,
        "node_type": node_type(man) if man else None,
        "manifest_gpu": man.get("gpu"),
        "gpu_env": (man.get("env") or {}).get("CUDA_VISIBLE_DEVICES"),
        "spec_algorithm": flag_value(man.get("command"), "--speculative-algorithm"),
        "declared_draft_length": man.get("declared_draft_length") if man else None,
        **_window(man),
    }


def _window(man: dict[str, Any]) -> dict[str, float]:
    """The run's span on the runner's monotonic clock (its records' t_* times): from the manifest's wall_anchor
    (taken as the run started) to its t_end_unix (as it ended) mapped through the anchor; NaN where unknown."""
    anchor = man.get("wall_anchor") or {}
    mono, unix, end = (_number(x) for x in (anchor.get("monotonic"), anchor.get("unix"), man.get("t_end_unix")))
    return {"window_start": mono, "window_end": mono + end - unix}


def _number(x: Any) -> float:
    """x as a finite float, else NaN."""
    ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else math.nan


def node_type(man: dict[str, Any]) -> str | None:
    """The hardware a run's manifest describes, in words: GPU model x count and driver (nvidia-smi), CPU model.
    Runs of different node types are not comparable; None when the manifest recorded neither."""
    host, gpu = _dict(man.get("host")), _dict(man.get("gpu_info"))
    parts = []
    if gpu.get("name"):
        parts.append(f"{gpu.get('count') or '?'} x {gpu['name']} (driver {gpu.get('driver_version') or '?'})")
    if host.get("cpu"):
        parts.append(f"CPU {host['cpu']}")
    return "; ".join(parts) or None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _scorer(scorer: Any) -> str | None:
    if not isinstance(scorer, dict) or not scorer.get("name"):
        return None
    return f"{scorer.get('name')} {scorer.get('version') or '(no version)'}".strip()


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def _machine(machine: Any) -> dict[str, Any]:
    """The manifest's `machine` load figures (NaN where not recorded)."""
    m = _dict(machine)
    during, before, after = _dict(m.get("during")), _dict(m.get("before")), _dict(m.get("after"))
    return {
        "machine_recorded": bool(during or before or after),
        "cpu_other_frac": _num(during.get("cpu_other_frac")),
        "steal_frac": _num(during.get("steal_frac")),
        "cpu_other_before": _num(before.get("cpu_other")),
        "cpu_other_after": _num(after.get("cpu_other")),
    }


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def server_accept_length(server_info: Any) -> float | None:
    """The server's lifetime `avg_spec_accept_length` (rank 0) from a `/server_info` reply, if any."""
    if not isinstance(server_info, dict):
        return None
    states = server_info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
    else:
        value = server_info.get("avg_spec_accept_length")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        return None  # 0 (or absent) means the server never folded a value: not published, not zero
    return float(value)


def _deterministic_flag(server_info: Any) -> bool | None:
    if not isinstance(server_info, dict) or "enable_deterministic_inference" not in server_info:
        return None
    return bool(server_info["enable_deterministic_inference"])


def _items_table(campaigns: list[CampaignDir]) -> pd.DataFrame:
    """Distinct items over all campaigns (the first campaign's seed_offset and category win)."""
    frames = [pd.DataFrame(c.items, columns=["item_id", "seed_offset", "category"]) for c in campaigns]
    frame = (
        pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["item_id", "seed_offset", "category"])
    )
    frame["item_id"] = frame["item_id"].astype(str)
    frame = frame.drop_duplicates("item_id", keep="first").reset_index(drop=True)
    frame["seed_offset"] = pd.to_numeric(frame["seed_offset"], errors="coerce").astype("Int64")
    frame["category"] = frame["category"].astype(object).where(frame["category"].notna(), None)
    frame.insert(0, "item", np.arange(len(frame), dtype=np.int64))
    return frame


def _records_frame(table: pa.Table, items: pd.DataFrame) -> pd.DataFrame:
    """Columns as pandas: strings categorical, numbers float64 with NaN for null, `correct` as 1/0/NaN."""
    cols: dict[str, pa.ChunkedArray] = {}
    for name in STR_FIELDS:
        cols[name] = table.column(name).combine_chunks().dictionary_encode()
    for name in INT_FIELDS:  # float64: exact for integers below 2**53, NaN for null, and fast
        cols[name] = pc.cast(table.column(name), pa.float64())
    for name in FLOAT_FIELDS:
        cols[name] = table.column(name)
    for name in ("warmup", "hit_cap"):
        cols[name] = table.column(name).fill_null(False)
    cols["correct"] = pc.cast(table.column("correct"), pa.float64())
    meta = table.column("meta_info")
    for name in META_FLOAT_FIELDS:
        cols[f"meta_{name}"] = pc.struct_field(meta, name)
    cols["_run"] = table.column("_run")
    cols["_line"] = table.column("_line")
    flat = pa.table(cols)
    frame = flat.to_pandas(split_blocks=True)
    frame["_item"] = _item_codes(frame["item_id"], items)
    return frame


def _item_codes(item_ids: pd.Series, items: pd.DataFrame) -> np.ndarray:
    """Position of each record's item in `items`, -1 when it is not a planned item."""
    cats = item_ids.cat.categories
    lookup = pd.Index(items["item_id"]).get_indexer(pd.Index(cats.astype(str)))
    codes = item_ids.cat.codes.to_numpy()
    out = np.where(codes >= 0, lookup[np.maximum(codes, 0)] if len(lookup) else -1, -1)
    return out.astype(np.int64)


def _histograms(table: pa.Table) -> Histograms:
    n = table.num_rows
    meta = table.column("meta_info")
    present = np.zeros(n, dtype=bool)
    parts = []
    for name in META_HIST_FIELDS:  # the current name first; the old alias fills the gaps
        if n == 0:
            break
        lists = pc.struct_field(meta, name).combine_chunks()
        valid = lists.is_valid().to_numpy(zero_copy_only=False) & ~present
        if valid.any():
            offsets = lists.offsets.to_numpy()
            parts.append(
                (valid, offsets, lists.values.to_numpy(zero_copy_only=False), np.where(valid, np.diff(offsets), 0))
            )
            present |= valid
    width = max((int(p[3].max()) for p in parts), default=0)
    dense = np.zeros((n, width), dtype=np.int64)
    for valid, offsets, values, lengths in parts:
        seen = np.flatnonzero(np.bincount(lengths))
        seen = seen[seen > 0]
        if len(seen) == 1 and np.array_equal(np.diff(offsets), lengths):  # one length, contiguous: a reshape
            dense[valid, : seen[0]] = values[offsets[0] : offsets[-1]].reshape(-1, seen[0])
            continue
        for length in seen:
            rows = np.flatnonzero(lengths == length)  # lists of one length gather as one block
            dense[rows, :length] = values[offsets[rows][:, None] + np.arange(length)]
    return Histograms(dense=dense, present=present)


def _list_parts(columns: list[pa.ChunkedArray], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets [n + 1] from 0, int64 values, present [n]) of list columns laid end to end (n lists in all), each
    list<int64> or list<double> of integers below 2^53 (read_records_file's int_lists=False); a null list is empty.
    The values are converted as they are copied, chunk by chunk, into one array: one copy of the values, where a
    conversion per file and a concatenation made two (and combine_chunks three)."""
    chunks = [chunk for column in columns for chunk in column.chunks if len(chunk)]
    if n == 0 or not chunks:
        return np.zeros(n + 1, np.int64), np.zeros(0, np.int64), np.zeros(n, bool)
    offsets, present, spans = [np.zeros(1, np.int64)], [], []
    total = 0
    for chunk in chunks:
        raw = chunk.offsets.to_numpy().astype(np.int64)
        valid = chunk.is_valid().to_numpy(zero_copy_only=False)
        lengths = np.where(valid, np.diff(raw), 0)
        offsets.append(total + np.cumsum(lengths))
        present.append(valid)
        spans.append((raw, valid, lengths))
        total += int(lengths.sum())
    values = np.empty(total, np.int64)
    at = 0
    for chunk, (raw, valid, lengths) in zip(chunks, spans, strict=True):
        flat = chunk.values.to_numpy(zero_copy_only=False)[raw[0] : raw[-1]]
        if not np.array_equal(np.diff(raw), lengths):
            flat = flat[np.repeat(valid, np.diff(raw))]  # null lists with stale child values: drop them
        values[at : at + len(flat)] = flat
        at += len(flat)
    return np.concatenate(offsets), values, np.concatenate(present)


# ---------------------------------------------------------------------------------------------
# scores (schema 2)


def _scored_runs(runs: pd.DataFrame) -> list[int]:
    """The rows of `runs` whose records take `correct` from a scores.jsonl (schema 2, the file present)."""
    v2 = runs["schema_version"].to_numpy() >= 2
    return [int(r) for r in np.flatnonzero(v2 & (runs["scores_path"] != "").to_numpy())]


def _apply_scores(
    records: pd.DataFrame, runs: pd.DataFrame, scores: dict[int, tuple[pa.Table, list[BadLine]]]
) -> list[BadLine]:
    """Schema-2 runs: `correct` of each record from its run's scores.jsonl (`scores`: read_scores_file's
    result by row of `runs`, for the _scored_runs rows), joined on request_index (NaN when the run has no scores file or the record
    no score), and `_score_lines`, the number of score lines the record's request_index has (NaN in runs without a
    scores file). Schema 1 keeps the record's own."""
    v2 = runs["schema_version"].to_numpy() >= 2
    records["_score_lines"] = np.nan
    if not v2.any():
        return []
    run = records["_run"].to_numpy()
    correct = records["correct"].to_numpy().copy()
    correct[v2[run]] = np.nan
    lines_of = np.full(len(records), np.nan)  # score lines of the record's request_index (runs with a scores file)
    index = records["request_index"].to_numpy()
    bad: list[BadLine] = [b for _, lines in scores.values() for b in lines]
    frames = [
        pd.DataFrame(
            {
                "_run": r,
                "request_index": table.column("request_index").to_numpy(zero_copy_only=False).astype(float),
                "correct": pc.cast(table.column("correct"), pa.float64()).to_numpy(zero_copy_only=False),
            }
        )
        for r, (table, _) in scores.items()
    ]
    if frames:  # every run's score lines at once (a loop over runs took 9 s of CPU at 2,000 runs)
        lines = pd.concat(frames, ignore_index=True)
        key = ["_run", "request_index"]
        counts = lines.groupby(key, sort=False, dropna=False).size()
        first = lines.drop_duplicates(key, keep="first").set_index(key)["correct"]
        mine = np.isin(run, np.fromiter(scores, dtype=np.int64))
        wanted = pd.MultiIndex.from_arrays([run[mine], index[mine].astype(float)], names=key)
        correct[mine] = first.reindex(wanted).to_numpy(dtype=float)
        lines_of[mine] = counts.reindex(wanted).fillna(0).to_numpy(dtype=float)
    records["correct"] = correct
    records["_score_lines"] = lines_of
    return bad
