"""Point metrics per arm: pooled, per base seed, per category and per run.

Definitions (`docs/records.md`; the report's method section says the same in words):
- acceptance length = sum completion_tokens / sum spec_verify_ct over the requests that report verify
  steps: completion tokens per verify step, the first token (emitted by the prefill, without a verify
  step) and tokens past the cap that a step emitted and the server truncated included as the server
  counts them. The request-weighted mean of completion_tokens / spec_verify_ct is secondary.
- correct drafts per verify step = sum spec_num_correct_drafts / sum spec_verify_ct.
- output throughput of a run = sum completion_tokens of its measured requests / (max t_end - min t_sent);
  pooled over runs = sum of tokens / sum of run windows.
- decode throughput of a run (measured) = sum over its requests of (completion_tokens - tokens of the first
  chunk) / length of the union of the requests' [first chunk, last chunk] intervals: output tokens per
  second while at least one stream was decoding. Pooled = sum of tokens / sum of union lengths. The
  per-request decode rate (completion_tokens - first-chunk tokens) / (last chunk - first chunk), averaged
  over requests, is secondary. Schema 1 (no chunk arrays): the first chunk counts as 1 token and
  [t_first_token, t_end] is the interval.
- TTFT = t_first_token - t_start and end-to-end latency = t_end - t_start, where t_start = t_scheduled in
  open loop (request_rate set) and t_sent in closed loop; queueing time = t_sent - t_scheduled (open loop).
- TPOT of a request = (t_end - t_first_token) / (completion_tokens - 1), for 2 tokens or more.
- ITL: each chunk after the first that carries n > 0 tokens gives (its arrival - the previous such chunk's)
  / n, counted n times (SGLang bench_serving's rule); chunks without tokens are skipped. Schema 1: n/a. (The
  ITL engine, which gathers them and takes their percentiles, is analysis.itl.)
- Percentiles (linear interpolation) are pooled over all used requests of an arm (ITL: over its tokens);
  per run for the paired comparison.
Measured requests (for throughput) are all records outside warmup of a finished planned run; every other
figure uses the audit's selection (each planned request once, finished, no error).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.itl import PERCENTILES, ItlSummary, itl_summary
from analysis.load import Chunks, Loaded
from analysis.selection import Picked, foreign_load, recompute_hit_cap

LATENCIES = ("ttft", "e2e", "itl", "tpot")  # percentile families
MIN_PERCENTILE_VALUES = 100  # a percentile over fewer values is flagged in the report
NO_CATEGORY = "(none)"


@dataclass(frozen=True)
class Partition:
    """A grouping of requests: by run (run_code) or by item (item_code)."""

    name: str  # pooled | seed | category
    labels: tuple
    run_code: np.ndarray | None
    item_code: np.ndarray | None

    def code(self, run: np.ndarray, item: np.ndarray) -> np.ndarray:
        if self.run_code is not None:
            return self.run_code[run]
        assert self.item_code is not None  # every partition has one of the two
        return self.item_code[item]

    @property
    def size(self) -> int:
        return len(self.labels)


@dataclass
class RequestTables:
    """The used requests and their partitions: all that the bootstraps over items need, ready before the ITL."""

    arms: list[str]
    baseline: str
    requests: pd.DataFrame  # the used requests, one row each, with integer codes
    partitions: dict[str, Partition]


@dataclass
class Metrics(RequestTables):
    ratios: pd.DataFrame  # (partition, group, arm) -> sums and ratio metrics
    outcomes: pd.DataFrame  # (partition, group, arm) -> planned, used, correct, scored, cap_hits, errors
    runs: pd.DataFrame  # one row per planned run with data
    seed_runs: pd.DataFrame  # (base_seed, arm) -> tokens, window, throughput, runs
    histogram: pd.DataFrame  # bin -> verify steps per arm (empty without histograms)
    pooled_latency: pd.DataFrame  # index "<family>_p<q>" and "queue_mean" / "queue_p99"; one column per arm
    pooled_counts: pd.DataFrame  # index family (ttft, e2e, itl, tpot, queue); values behind each percentile
    open_loop: bool
    chunk_timings: bool  # every used request carries chunk arrays with token counts


def report_arm_order(data: Loaded, baseline: str) -> list[str]:
    declared = [n for c in data.campaigns for n in c.arm_names]
    seen = [*declared, *data.runs["arm"].tolist()]
    ordered = list(dict.fromkeys([baseline, *seen]))
    return [a for a in ordered if a]


def start(
    data: Loaded, picked: Picked, arms: list[str], baseline: str, pool: Executor
) -> tuple[RequestTables, Future[Metrics]]:
    """The metrics in two jobs on `pool` (give it two workers for them: numpy's and pandas' loops release the
    GIL): the ITL, queued first, and the rest once this thread has made the request tables; -> (the tables, the
    metrics to come). Work that needs only the tables can run in this thread meanwhile."""
    arm_of_run = pd.Index(arms).get_indexer(data.runs["arm"]).astype(np.int64)
    used = picked.selection.used
    itl_job = pool.submit(
        itl_summary, data.chunks, np.flatnonzero(used), data.records["_run"].to_numpy()[used], arm_of_run, len(arms)
    )
    tables = RequestTables(arms, baseline, request_frame(data, picked, arm_of_run), partitions(data))
    return tables, pool.submit(_finish, data, picked, tables, arm_of_run, itl_job)


def _finish(
    data: Loaded, picked: Picked, tables: RequestTables, arm_of_run: np.ndarray, itl_job: Future[ItlSummary]
) -> Metrics:
    arms, req, parts = tables.arms, tables.requests, tables.partitions
    ratios = ratio_table(req, parts, arms)
    outcomes = outcome_table(data, picked, req, parts, arms, arm_of_run)
    histogram = histogram_table(data, picked, arm_of_run, arms)
    runs = run_table(data, picked, req, itl_job.result, arm_of_run)  # waits for the ITL once the rest is done
    latency, counts = pooled_latency(req, itl_job.result(), len(arms), arms)
    return Metrics(
        arms=arms,
        baseline=tables.baseline,
        requests=req,
        partitions=parts,
        ratios=ratios,
        outcomes=outcomes,
        runs=runs,
        seed_runs=seed_run_table(runs),
        histogram=histogram,
        pooled_latency=latency,
        pooled_counts=counts,
        open_loop=any(c.open_loop for c in data.campaigns),
        chunk_timings=bool(len(req)) and bool(req["chunked"].all()),
    )


def partitions(data: Loaded) -> dict[str, Partition]:
    runs, items = data.runs, data.items
    seeds = sorted({int(s) for s in runs["base_seed"].dropna()})
    seed_code = np.array([seeds.index(int(s)) if pd.notna(s) else -1 for s in runs["base_seed"]], dtype=np.int64)
    cats = items["category"].astype(object).where(items["category"].notna(), NO_CATEGORY).astype(str)
    cat_labels = sorted(cats.unique())
    cat_code = pd.Index(cat_labels).get_indexer(cats).astype(np.int64)
    out = {
        "pooled": Partition("pooled", ("all",), np.zeros(len(runs), np.int64), None),
        "seed": Partition("seed", tuple(seeds), seed_code, None),
    }
    if cat_labels and cat_labels != [NO_CATEGORY]:
        out["category"] = Partition("category", tuple(cat_labels), None, cat_code)
    return out


def _chunk_ends(chunks: Chunks, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per record in `rows`: has chunk times, first and last chunk offset (s after t_sent), first-chunk tokens."""
    if len(chunks.us_present) == 0:
        nan = np.full(len(rows), np.nan)
        return np.zeros(len(rows), bool), nan, nan, np.ones(len(rows))
    start, stop = chunks.us_offsets[rows], chunks.us_offsets[rows + 1]
    has = chunks.us_present[rows] & (stop > start)
    safe_first = np.where(has, start, 0)
    safe_last = np.where(has, stop - 1, 0)
    us = chunks.us if len(chunks.us) else np.zeros(1, np.int64)
    first = np.where(has, us[safe_first] / 1e6, np.nan)
    last = np.where(has, us[safe_last] / 1e6, np.nan)
    aligned = chunks.aligned[rows] & has
    tok = chunks.tok if len(chunks.tok) else np.zeros(1, np.int64)
    first_tokens = np.where(aligned, tok[np.where(aligned, chunks.tok_offsets[rows], 0)], 1).astype(float)
    return aligned, first, last, first_tokens


def request_frame(data: Loaded, picked: Picked, arm_of_run: np.ndarray) -> pd.DataFrame:
    used = picked.selection.used
    rows = np.flatnonzero(used)
    rec = data.records
    run = rec["_run"].to_numpy()[used]
    ct, vct = rec["completion_tokens"].to_numpy()[used], rec["spec_verify_ct"].to_numpy()[used]
    t_sent, t_first, t_end = (rec[c].to_numpy()[used] for c in ("t_sent", "t_first_token", "t_end"))
    t_sched = rec["t_scheduled"].to_numpy()[used]
    open_loop = data.runs["open_loop"].to_numpy(dtype=bool)[run] if len(run) else np.zeros(0, bool)
    t_start = np.where(open_loop & np.isfinite(t_sched), t_sched, t_sent)
    chunked, c_first, c_last, first_tokens = _chunk_ends(data.chunks, rows)
    d0 = np.where(np.isfinite(c_first), t_sent + c_first, t_first)
    d1 = np.where(np.isfinite(c_last), t_sent + c_last, t_end)
    decode_tokens = np.where(np.isfinite(d0) & np.isfinite(d1), np.maximum(ct - first_tokens, 0), np.nan)
    spec = (vct > 0) & ~np.isnan(ct)
    with np.errstate(divide="ignore", invalid="ignore"):
        al = np.where(spec, ct / vct, np.nan)
        rate = np.where((decode_tokens > 0) & (d1 > d0), decode_tokens / (d1 - d0), np.nan)
        tpot = np.where((ct >= 2) & (t_end >= t_first), (t_end - t_first) / (ct - 1), np.nan)
    return pd.DataFrame(
        {
            "run": run,
            "item": rec["_item"].to_numpy()[used],
            "arm": arm_of_run[run],
            "spec": spec,
            "ct": ct,
            "vct": np.where(spec, vct, 0.0),
            "ncd": np.where(spec, np.nan_to_num(rec["spec_num_correct_drafts"].to_numpy()[used]), 0.0),
            "al": al,
            "correct": rec["correct"].to_numpy()[used],
            "hit_cap": recompute_hit_cap(rec)[used],
            "ttft": t_first - t_start,
            "e2e": t_end - t_start,
            "queue": np.where(open_loop, t_sent - t_sched, np.nan),
            "tpot": tpot,
            "decode_tokens": decode_tokens,
            "decode_start": d0,
            "decode_end": d1,
            "decode_rate": rate,
            "chunked": chunked,
        }
    )


def _percentile(values: np.ndarray, q: float) -> float:
    finite = values[np.isfinite(values)]
    return float(np.percentile(finite, q)) if finite.size else float("nan")


def pooled_latency(
    req: pd.DataFrame, itl: ItlSummary, n_arms: int, arms: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Percentiles pooled over all used requests (ITL: tokens) of each arm, and how many values each has."""
    arm = req["arm"].to_numpy()
    values: dict[str, list[float]] = {}
    counts: dict[str, list[float]] = {}
    for family in LATENCIES:
        for q in PERCENTILES:
            values[f"{family}_p{q}"] = []
        counts[family] = []
    values["queue_mean"], values["queue_p99"], counts["queue"] = [], [], []
    for a in range(n_arms):
        for family in ("ttft", "e2e", "tpot"):
            col = req[family].to_numpy()[arm == a]
            counts[family].append(float(np.isfinite(col).sum()))
            for q in PERCENTILES:
                values[f"{family}_p{q}"].append(_percentile(col, q))
        pooled, tokens = itl.pooled[a]
        counts["itl"].append(float(tokens))
        for q, x in zip(PERCENTILES, pooled, strict=True):
            values[f"itl_p{q}"].append(x)
        queue = req["queue"].to_numpy()[arm == a]
        finite = queue[np.isfinite(queue)]
        counts["queue"].append(float(finite.size))
        values["queue_mean"].append(float(finite.mean()) if finite.size else float("nan"))
        values["queue_p99"].append(_percentile(queue, 99))
    latency = pd.DataFrame.from_dict(values, orient="index", columns=arms)
    return latency, pd.DataFrame.from_dict(counts, orient="index", columns=arms)


def _group_sums(code: np.ndarray, arm: np.ndarray, n_groups: int, n_arms: int, weights: np.ndarray) -> np.ndarray:
    ok = (code >= 0) & (arm >= 0)
    flat = np.bincount(code[ok] * n_arms + arm[ok], weights=weights[ok], minlength=n_groups * n_arms)
    return flat.reshape(n_groups, n_arms)


def _long(part: Partition, arms: list[str], columns: dict[str, np.ndarray]) -> pd.DataFrame:
    g, a = np.meshgrid(np.arange(part.size), np.arange(len(arms)), indexing="ij")
    frame = pd.DataFrame(
        {
            "partition": part.name,
            "group": [part.labels[i] for i in g.ravel()],
            "arm": [arms[i] for i in a.ravel()],
        }
    )
    for name, values in columns.items():
        frame[name] = values.ravel()
    return frame


def ratio_table(req: pd.DataFrame, parts: dict[str, Partition], arms: list[str]) -> pd.DataFrame:
    run, item, arm = req["run"].to_numpy(), req["item"].to_numpy(), req["arm"].to_numpy()
    spec = req["spec"].to_numpy()
    weights = {
        "requests": spec.astype(float),
        "tokens": np.where(spec, req["ct"].to_numpy(), 0.0),
        "verify_steps": req["vct"].to_numpy(),
        "correct_drafts": req["ncd"].to_numpy(),
        "al_sum": np.nan_to_num(req["al"].to_numpy()),
    }
    frames = []
    for part in parts.values():
        code = part.code(run, item)
        cols = {k: _group_sums(code, arm, part.size, len(arms), w) for k, w in weights.items()}
        frames.append(_long(part, arms, cols))
    out = pd.concat(frames, ignore_index=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["acceptance_length"] = out["tokens"] / out["verify_steps"].where(out["verify_steps"] > 0)
        out["al_request_mean"] = out["al_sum"] / out["requests"].where(out["requests"] > 0)
        out["correct_drafts_per_step"] = out["correct_drafts"] / out["verify_steps"].where(out["verify_steps"] > 0)
    return out


def outcome_table(
    data: Loaded,
    picked: Picked,
    req: pd.DataFrame,
    parts: dict[str, Partition],
    arms: list[str],
    arm_of_run: np.ndarray,
) -> pd.DataFrame:
    plan = picked.plan
    rec = data.records
    err = picked.selection.errored
    err_run, err_item = rec["_run"].to_numpy()[err], rec["_item"].to_numpy()[err]
    run, item, arm = req["run"].to_numpy(), req["item"].to_numpy(), req["arm"].to_numpy()
    correct = req["correct"].to_numpy()
    frames = []
    for part in parts.values():
        code = part.code(run, item)
        n, a = part.size, len(arms)
        cols = {
            "planned": _group_sums(part.code(plan.run, plan.item), arm_of_run[plan.run], n, a, np.ones(len(plan.run))),
            "used": _group_sums(code, arm, n, a, np.ones(len(run))),
            "correct": _group_sums(code, arm, n, a, (correct == 1).astype(float)),
            "scored": _group_sums(code, arm, n, a, (~np.isnan(correct)).astype(float)),
            "cap_hits": _group_sums(code, arm, n, a, req["hit_cap"].to_numpy().astype(float)),
            "errors": _group_sums(part.code(err_run, err_item), arm_of_run[err_run], n, a, np.ones(len(err_run))),
        }
        frames.append(_long(part, arms, {k: v.astype(np.int64) for k, v in cols.items()}))
    out = pd.concat(frames, ignore_index=True)
    out["missing"] = out["planned"] - out["used"] - out["errors"]
    return out


def run_table(
    data: Loaded, picked: Picked, req: pd.DataFrame, itl: Callable[[], ItlSummary], arm_of_run: np.ndarray
) -> pd.DataFrame:
    """One row per planned finished run. itl: gives the ITL summary; called once every other column is made."""
    runs = data.runs
    rec = data.records
    meas = picked.selection.measured
    m_run = rec["_run"].to_numpy()[meas]
    n = len(runs)
    tokens = np.bincount(m_run, weights=np.nan_to_num(rec["completion_tokens"].to_numpy()[meas]), minlength=n)
    t0 = _group_extreme(m_run, rec["t_sent"].to_numpy()[meas], n, np.minimum, np.inf)
    t1 = _group_extreme(m_run, rec["t_end"].to_numpy()[meas], n, np.maximum, -np.inf)
    window = np.where(np.isfinite(t0) & np.isfinite(t1) & (t1 > t0), t1 - t0, np.nan)
    out = runs[
        [
            "run",
            "campaign",
            "campaign_id",
            "run_id",
            "arm",
            "base_seed",
            "repeat",
            "order",
            "status",
            "server_accept_length",
            "machine_recorded",
            "cpu_other_frac",
            "steal_frac",
            "cpu_other_before",
            "cpu_other_after",
            "server_cpu_s",
        ]
    ].copy()
    out["foreign_load"] = foreign_load(runs)
    out["measured"] = np.bincount(m_run, minlength=n)
    out["tokens"] = tokens
    out["window_s"] = window
    out["throughput"] = tokens / window
    with np.errstate(divide="ignore", invalid="ignore"):  # the server tree's CPU seconds per measured output token
        out["cpu_per_token"] = out["server_cpu_s"].to_numpy(float) / np.where(tokens > 0, tokens, np.nan)
    out = out.join(_per_run_request_stats(req, itl, n), on="run")
    with np.errstate(divide="ignore", invalid="ignore"):
        out["decode_tps"] = out["decode_tokens"] / out["decode_span_s"].where(out["decode_span_s"] > 0)
    keep = runs["planned"].to_numpy() & (runs["status"] == "finished").to_numpy() & (arm_of_run >= 0)
    return out[keep].reset_index(drop=True)


def _group_extreme(group: np.ndarray, values: np.ndarray, n: int, ufunc: np.ufunc, fill: float) -> np.ndarray:
    out = np.full(n, fill)
    ok = ~np.isnan(values)
    ufunc.at(out, group[ok], values[ok])
    return out


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of the intervals [start_i, end_i] (empty or reversed ones count for nothing)."""
    ok = np.isfinite(start) & np.isfinite(end) & (end > start)
    if not ok.any():
        return 0.0
    order = np.argsort(start[ok], kind="stable")
    s, e = start[ok][order], end[ok][order]
    reach = np.maximum.accumulate(e)
    before = np.concatenate([[-np.inf], reach[:-1]])
    return float(np.sum(np.maximum(reach - np.maximum(s, before), 0.0)))


def _per_run_request_stats(req: pd.DataFrame, itl: Callable[[], ItlSummary], n_runs: int) -> pd.DataFrame:
    """Per-run sums and percentiles (the ITL's from `itl()`, called last)."""
    run = req["run"].to_numpy()
    order = np.argsort(run, kind="stable")
    bounds = np.searchsorted(run[order], np.arange(n_runs + 1))
    spec = req["spec"].to_numpy()
    sums = {
        k: np.bincount(run, weights=req[k].to_numpy() if k != "n" else None, minlength=n_runs)
        for k in ("ct", "vct", "n")
    }
    rows = {"used": sums["n"], "acceptance_length": np.full(n_runs, np.nan)}
    ct_spec = np.bincount(run, weights=np.where(spec, req["ct"].to_numpy(), 0.0), minlength=n_runs)
    with np.errstate(divide="ignore", invalid="ignore"):
        rows["acceptance_length"] = np.where(sums["vct"] > 0, ct_spec / sums["vct"], np.nan)
    rows["decode_tokens"] = np.bincount(run, weights=np.nan_to_num(req["decode_tokens"].to_numpy()), minlength=n_runs)
    cols = {k: req[k].to_numpy()[order] for k in ("decode_rate", "ttft", "e2e", "tpot", "decode_start", "decode_end")}
    rows["decode_span_s"] = np.array(
        [
            union_length(cols["decode_start"][bounds[i] : bounds[i + 1]], cols["decode_end"][bounds[i] : bounds[i + 1]])
            for i in range(n_runs)
        ]
    )
    rows["decode_rate_mean"] = _slice_stat(cols["decode_rate"], bounds, np.nanmean)
    for family in ("ttft", "e2e", "tpot"):
        for p in PERCENTILES:
            rows[f"{family}_p{p}"] = _slice_stat(cols[family], bounds, lambda v, p=p: np.nanpercentile(v, p))
    per_run = itl().per_run
    for k, p in enumerate(PERCENTILES):
        rows[f"itl_p{p}"] = per_run[:, k]
    return pd.DataFrame(rows, index=pd.RangeIndex(n_runs, name="run"))


def _slice_stat(values: np.ndarray, bounds: np.ndarray, fn) -> np.ndarray:
    out = np.full(len(bounds) - 1, np.nan)
    for i in range(len(bounds) - 1):
        chunk = values[bounds[i] : bounds[i + 1]]
        if chunk.size and not np.all(np.isnan(chunk)):
            out[i] = fn(chunk)
    return out


def seed_run_table(runs: pd.DataFrame) -> pd.DataFrame:
    ok = runs[np.isfinite(runs["window_s"])]
    grouped = ok.groupby(["base_seed", "arm"], sort=True)
    out = grouped.agg(
        tokens=("tokens", "sum"),
        window_s=("window_s", "sum"),
        runs=("run", "count"),
        decode_tokens=("decode_tokens", "sum"),
        decode_span_s=("decode_span_s", "sum"),
    )
    out["throughput"] = out["tokens"] / out["window_s"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["decode_tps"] = out["decode_tokens"] / out["decode_span_s"].where(out["decode_span_s"] > 0)
    return out.reset_index()


def histogram_table(data: Loaded, picked: Picked, arm_of_run: np.ndarray, arms: list[str]) -> pd.DataFrame:
    """Verify steps by number of correct drafts, summed over the used requests of each arm."""
    hist = data.hist
    keep = picked.selection.used & hist.present
    if not keep.any():
        return pd.DataFrame()
    arm = arm_of_run[data.records["_run"].to_numpy()]
    sums = np.stack([hist.dense[keep & (arm == a)].sum(axis=0) for a in range(len(arms))], axis=1)
    table = pd.DataFrame(sums, columns=arms)
    table.index.name = "correct_drafts"
    return table
