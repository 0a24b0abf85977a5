"""Point metrics per arm: pooled, per base seed, per category and per run.

Definitions (`shared/reference/sglang-protocol.md`, `docs/records.md`):
- acceptance length = sum completion_tokens / sum spec_verify_ct (bonus token included), over the
  requests that report verify steps; the request-weighted mean of completion_tokens / spec_verify_ct
  is the secondary figure.
- correct drafts per verify step = sum spec_num_correct_drafts / sum spec_verify_ct.
- output throughput of a run = sum completion_tokens of its measured requests / (max t_end - min t_sent)
  over them; pooled over runs = sum of tokens / sum of run windows.
- decode tok/s of a run = mean per-request (completion_tokens - 1) / (t_end - t_first_token) x
  concurrency; pooled = mean over runs.
- TTFT = t_first_token - t_sent and end-to-end latency = t_end - t_sent: percentiles per run (linear
  interpolation), pooled = mean over runs.
Measured requests (for throughput) are all records outside warmup of a finished planned run; every
other figure uses the audit's selection (each planned request once, finished, no error).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.audit import Audit, recompute_hit_cap
from analysis.load import Loaded

PERCENTILES = (50, 90, 99)
NO_CATEGORY = "(none)"


@dataclass(frozen=True)
class Partition:
    """A grouping of requests: by run (run_code) or by item (item_code)."""

    name: str  # pooled | seed | category
    labels: tuple
    run_code: np.ndarray | None
    item_code: np.ndarray | None

    def code(self, run: np.ndarray, item: np.ndarray) -> np.ndarray:
        return self.run_code[run] if self.run_code is not None else self.item_code[item]

    @property
    def size(self) -> int:
        return len(self.labels)


@dataclass
class Metrics:
    arms: list[str]
    baseline: str
    requests: pd.DataFrame  # the used requests, one row each, with integer codes
    partitions: dict[str, Partition]
    ratios: pd.DataFrame  # (partition, group, arm) -> sums and ratio metrics
    outcomes: pd.DataFrame  # (partition, group, arm) -> planned, used, correct, scored, cap_hits, errors
    runs: pd.DataFrame  # one row per planned run with data
    seed_runs: pd.DataFrame  # (base_seed, arm) -> tokens, window, throughput, runs
    histogram: pd.DataFrame  # bin -> verify steps per arm (empty without histograms)
    concurrency_note: str


def arm_order(data: Loaded, baseline: str) -> list[str]:
    declared = [n for c in data.campaigns for n in c.arm_names]
    seen = [*declared, *data.runs["arm"].tolist()]
    ordered = list(dict.fromkeys([baseline, *seen]))
    return [a for a in ordered if a]


def compute(data: Loaded, audit: Audit, arms: list[str], baseline: str) -> Metrics:
    arm_of_run = pd.Index(arms).get_indexer(data.runs["arm"]).astype(np.int64)
    parts = partitions(data)
    req = request_frame(data, audit, arm_of_run)
    runs = run_table(data, audit, req, arm_of_run)
    return Metrics(
        arms=arms,
        baseline=baseline,
        requests=req,
        partitions=parts,
        ratios=ratio_table(req, parts, arms),
        outcomes=outcome_table(data, audit, req, parts, arms, arm_of_run),
        runs=runs,
        seed_runs=seed_run_table(runs),
        histogram=histogram_table(data, audit, arm_of_run, arms),
        concurrency_note=_concurrency_note(data),
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


def request_frame(data: Loaded, audit: Audit, arm_of_run: np.ndarray) -> pd.DataFrame:
    used = audit.selection.used
    rec = data.records
    run = rec["_run"].to_numpy()[used]
    ct, vct = rec["completion_tokens"].to_numpy()[used], rec["spec_verify_ct"].to_numpy()[used]
    t_sent, t_first, t_end = (rec[c].to_numpy()[used] for c in ("t_sent", "t_first_token", "t_end"))
    spec = (vct > 0) & ~np.isnan(ct)
    with np.errstate(divide="ignore", invalid="ignore"):
        decode = (ct - 1) / (t_end - t_first)
        al = np.where(spec, ct / vct, np.nan)
    decode = np.where((ct >= 2) & (t_end > t_first), decode, np.nan)
    return pd.DataFrame({
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
        "ttft": t_first - t_sent,
        "e2e": t_end - t_sent,
        "decode": decode,
    })


def _group_sums(code: np.ndarray, arm: np.ndarray, n_groups: int, n_arms: int, weights: np.ndarray) -> np.ndarray:
    ok = (code >= 0) & (arm >= 0)
    flat = np.bincount(code[ok] * n_arms + arm[ok], weights=weights[ok], minlength=n_groups * n_arms)
    return flat.reshape(n_groups, n_arms)


def _long(part: Partition, arms: list[str], columns: dict[str, np.ndarray]) -> pd.DataFrame:
    g, a = np.meshgrid(np.arange(part.size), np.arange(len(arms)), indexing="ij")
    frame = pd.DataFrame({
        "partition": part.name,
        "group": [part.labels[i] for i in g.ravel()],
        "arm": [arms[i] for i in a.ravel()],
    })
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
    data: Loaded, audit: Audit, req: pd.DataFrame, parts: dict[str, Partition], arms: list[str],
    arm_of_run: np.ndarray,
) -> pd.DataFrame:
    plan = audit.plan
    rec = data.records
    err = audit.selection.errored
    err_run, err_item = rec["_run"].to_numpy()[err], rec["_item"].to_numpy()[err]
    run, item, arm = req["run"].to_numpy(), req["item"].to_numpy(), req["arm"].to_numpy()
    correct = req["correct"].to_numpy()
    frames = []
    for part in parts.values():
        code = part.code(run, item)
        n, a = part.size, len(arms)
        cols = {
            "planned": _group_sums(part.code(plan.run, plan.item), arm_of_run[plan.run], n, a,
                                   np.ones(len(plan.run))),
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


def run_table(data: Loaded, audit: Audit, req: pd.DataFrame, arm_of_run: np.ndarray) -> pd.DataFrame:
    runs = data.runs
    rec = data.records
    meas = audit.selection.measured
    m_run = rec["_run"].to_numpy()[meas]
    n = len(runs)
    tokens = np.bincount(m_run, weights=np.nan_to_num(rec["completion_tokens"].to_numpy()[meas]), minlength=n)
    t0 = _group_extreme(m_run, rec["t_sent"].to_numpy()[meas], n, np.minimum, np.inf)
    t1 = _group_extreme(m_run, rec["t_end"].to_numpy()[meas], n, np.maximum, -np.inf)
    window = np.where(np.isfinite(t0) & np.isfinite(t1) & (t1 > t0), t1 - t0, np.nan)
    concurrency = pd.to_numeric(runs["concurrency"], errors="coerce").to_numpy(dtype=float)
    out = runs[["run", "campaign", "campaign_id", "run_id", "arm", "base_seed", "repeat", "order", "status",
                "server_accept_length"]].copy()
    out["measured"] = np.bincount(m_run, minlength=n)
    out["tokens"] = tokens
    out["window_s"] = window
    out["throughput"] = tokens / window
    out = out.join(_per_run_request_stats(req, n), on="run")
    out["decode_tps"] = out["decode_mean"] * concurrency
    keep = runs["planned"].to_numpy() & (runs["status"] == "finished").to_numpy() & (arm_of_run >= 0)
    return out[keep].reset_index(drop=True)


def _group_extreme(group: np.ndarray, values: np.ndarray, n: int, ufunc: np.ufunc, fill: float) -> np.ndarray:
    out = np.full(n, fill)
    ok = ~np.isnan(values)
    ufunc.at(out, group[ok], values[ok])
    return out


def _per_run_request_stats(req: pd.DataFrame, n_runs: int) -> pd.DataFrame:
    run = req["run"].to_numpy()
    order = np.argsort(run, kind="stable")
    bounds = np.searchsorted(run[order], np.arange(n_runs + 1))
    spec = req["spec"].to_numpy()
    sums = {k: np.bincount(run, weights=req[k].to_numpy() if k != "n" else None, minlength=n_runs)
            for k in ("ct", "vct", "n")}
    rows = {"used": sums["n"], "acceptance_length": np.full(n_runs, np.nan)}
    ct_spec = np.bincount(run, weights=np.where(spec, req["ct"].to_numpy(), 0.0), minlength=n_runs)
    with np.errstate(divide="ignore", invalid="ignore"):
        rows["acceptance_length"] = np.where(sums["vct"] > 0, ct_spec / sums["vct"], np.nan)
    cols = {k: req[k].to_numpy()[order] for k in ("decode", "ttft", "e2e")}
    rows["decode_mean"] = _slice_stat(cols["decode"], bounds, np.nanmean)
    for p in PERCENTILES:
        rows[f"ttft_p{p}"] = _slice_stat(cols["ttft"], bounds, lambda v, p=p: np.nanpercentile(v, p))
        rows[f"e2e_p{p}"] = _slice_stat(cols["e2e"], bounds, lambda v, p=p: np.nanpercentile(v, p))
    return pd.DataFrame(rows, index=pd.RangeIndex(n_runs, name="run"))


def _slice_stat(values: np.ndarray, bounds: np.ndarray, fn) -> np.ndarray:
    out = np.full(len(bounds) - 1, np.nan)
    for i in range(len(bounds) - 1):
        chunk = values[bounds[i]:bounds[i + 1]]
        if chunk.size and not np.all(np.isnan(chunk)):
            out[i] = fn(chunk)
    return out


def seed_run_table(runs: pd.DataFrame) -> pd.DataFrame:
    ok = runs[np.isfinite(runs["window_s"])]
    grouped = ok.groupby(["base_seed", "arm"], sort=True)
    out = grouped.agg(tokens=("tokens", "sum"), window_s=("window_s", "sum"), runs=("run", "count"),
                      decode_tps=("decode_tps", "mean"))
    out["throughput"] = out["tokens"] / out["window_s"]
    return out.reset_index()


def histogram_table(data: Loaded, audit: Audit, arm_of_run: np.ndarray, arms: list[str]) -> pd.DataFrame:
    """Verify steps by number of correct drafts, summed over the used requests of each arm."""
    hist = data.hist
    keep = audit.selection.used & hist.present
    if not keep.any():
        return pd.DataFrame()
    arm = arm_of_run[data.records["_run"].to_numpy()]
    sums = np.stack([hist.dense[keep & (arm == a)].sum(axis=0) for a in range(len(arms))], axis=1)
    table = pd.DataFrame(sums, columns=arms)
    table.index.name = "correct_drafts"
    return table


def _concurrency_note(data: Loaded) -> str:
    rates = {c.meta.get("request_rate") for c in data.campaigns}
    if rates - {None}:
        return ("requests arrive at a fixed rate (open loop), so mean decode rate x concurrency is an upper "
                "bound on the decode throughput, not a measurement of it")
    return ""
