"""Which records the figures use: the planned requests (`PlanKeys`), the masks over `Loaded.records` that say which
records are measured, chosen (the first of each planned request), errored or used (`Selection`), and the values no
server or client can have produced (`invalid_values`). Fixed once, before any check runs (`pick`), so that the
metrics and the audit's checks read the same selection side by side. And what else decides which figures count:
the runs taken under foreign load (`foreign_load`), hit_cap recomputed from the records (`recompute_hit_cap`), the
checked metadata that differ between runs or campaigns (`metadata_mismatches`: a report refuses to compare them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import NO_MANIFEST, NOT_RUN, Loaded

FINISHED_REASONS = ("stop", "length")


@dataclass(frozen=True)
class Selection:
    """Boolean masks over `Loaded.records` (one entry per record line)."""

    measured: np.ndarray  # outside warmup, in a finished planned run: counts for run throughput
    chosen: np.ndarray  # the first measured record of each planned request
    errored: np.ndarray  # chosen, but with an error, an abort or no completion_tokens
    used: np.ndarray  # chosen, not errored, in a finished run: what the metrics use
    invalid: np.ndarray  # [len(INVALID_REASONS), records]: invalid_values, computed once for the checks


@dataclass(frozen=True)
class PlanKeys:
    """The planned requests: run (row of Loaded.runs) and item (row of Loaded.items) of each."""

    run: np.ndarray
    item: np.ndarray
    n_items: int

    @property
    def key(self) -> np.ndarray:
        return self.run * self.n_items + self.item


@dataclass(frozen=True)
class Picked:
    """What the figures use, fixed before any check runs: the planned requests and the record masks (the
    metrics read only this, so they can be computed while the checks run)."""

    plan: PlanKeys
    selection: Selection
    key: np.ndarray  # per record, its plan key (-1 when it is not a planned request)


def plan_keys(data: Loaded) -> PlanKeys:
    item_pos = pd.Index(data.items["item_id"])
    runs_parts, items_parts = [], []
    planned = data.runs[data.runs["planned"]]
    for camp in data.campaigns:
        camp_items = item_pos.get_indexer([str(i.get("item_id")) for i in camp.items]).astype(np.int64)
        camp_runs = planned.loc[planned["campaign"] == camp.label, "run"].to_numpy(np.int64)
        runs_parts.append(np.repeat(camp_runs, len(camp_items)))
        items_parts.append(np.tile(camp_items, len(camp_runs)))
    run = np.concatenate(runs_parts) if runs_parts else np.empty(0, np.int64)
    item = np.concatenate(items_parts) if items_parts else np.empty(0, np.int64)
    return PlanKeys(run, item, len(data.items))


def select(data: Loaded, plan: PlanKeys) -> tuple[Selection, np.ndarray]:
    """The record masks and, per record, its plan key (-1 when it is not a planned request)."""
    rec, runs = data.records, data.runs
    run = rec["_run"].to_numpy()
    finished = (runs["status"] == "finished").to_numpy()[run] & runs["planned"].to_numpy()[run]
    is_planned = np.zeros(len(runs) * max(plan.n_items, 1), dtype=bool)
    is_planned[plan.key] = True
    item = rec["_item"].to_numpy()
    key = np.where(item >= 0, run * plan.n_items + np.maximum(item, 0), -1)
    outside_warmup = ~rec["warmup"].to_numpy()
    in_plan = outside_warmup & (key >= 0) & is_planned[np.maximum(key, 0)]
    key = np.where(in_plan, key, -1)
    first = in_plan & ~pd.Series(key).duplicated(keep="first").to_numpy()
    invalid = invalid_values(rec, runs)
    errored = first & (errored_mask(rec) | invalid.any(axis=0))
    sel = Selection(
        measured=outside_warmup & finished,
        chosen=first,
        errored=errored,
        used=first & ~errored & finished,
        invalid=invalid,
    )
    return sel, key


def errored_mask(rec: pd.DataFrame) -> np.ndarray:
    reason_ok = rec["finish_reason"].isin(FINISHED_REASONS).to_numpy()
    return rec["error"].notna().to_numpy() | ~reason_ok | np.isnan(rec["completion_tokens"].to_numpy())


WINDOW_SLACK_S, WINDOW_SLACK_FRAC = 60.0, 0.05  # clock steps between the anchor's two clocks, and rounding


INVALID_REASONS = (
    "completion_tokens is negative or not an integer",
    "spec_verify_ct is negative or not an integer",
    "spec_num_correct_drafts is negative or not an integer",
    "completion_tokens exceeds the request's max_new_tokens (SGLang caps the output there)",
    "no verify step but more than one completion token (only the first token comes without one)",
    "t_end is before t_sent",
    "t_first_token is outside [t_sent, t_end]",
    "t_sent or t_end is missing (the client sets both on every request it sends)",
    f"t_sent or t_end is outside its run (the manifest's wall_anchor to t_end_unix, {WINDOW_SLACK_S:g} s and "
    f"{WINDOW_SLACK_FRAC:.0%} of the run either side)",
)


def invalid_values(rec: pd.DataFrame, runs: pd.DataFrame) -> np.ndarray:
    """[len(INVALID_REASONS), records] masks of numbers no server or client can have produced (`runs`: the runs'
    windows, by the records' `_run`).

    Such a record is counted as errored (never in a figure) and fails the audit.
    """
    ct, vct, ncd, cap = (
        rec[c].to_numpy() for c in ("completion_tokens", "spec_verify_ct", "spec_num_correct_drafts", "max_new_tokens")
    )
    t_sent, t_first, t_end = (rec[c].to_numpy() for c in ("t_sent", "t_first_token", "t_end"))
    run = rec["_run"].to_numpy()
    start, end = (runs[c].to_numpy(dtype=float)[run] for c in ("window_start", "window_end"))
    slack = WINDOW_SLACK_S + WINDOW_SLACK_FRAC * np.nan_to_num(end - start)

    def bad_count(x: np.ndarray) -> np.ndarray:
        return ~np.isnan(x) & ((x < 0) | (x != np.floor(x)))

    with np.errstate(invalid="ignore"):  # NaN (null) compares False: a missing value is not invalid, except
        # t_sent and t_end of a request that did not fail (t_first_token stays null when no chunk carried output)
        masks = (
            bad_count(ct),
            bad_count(vct),
            bad_count(ncd),
            ct > cap,
            (vct == 0) & (ct > 1),
            t_end < t_sent,
            (t_first < t_sent) | (t_first > t_end),
            ~errored_mask(rec) & (np.isnan(t_sent) | np.isnan(t_end)),
            (t_sent < start - slack) | (t_end > end + slack),
        )
    return np.vstack(masks) if len(rec) else np.zeros((len(INVALID_REASONS), 0), dtype=bool)


def pick(data: Loaded) -> Picked:
    """The planned requests and which records the figures use."""
    plan = plan_keys(data)
    selection, key = select(data, plan)
    return Picked(plan, selection, key)


# ---------------------------------------------------------------------------------------------
# foreign load

# Foreign load (manifest `machine`): other processes used more than this share of all CPUs during the run,
# the hypervisor stole more than this share, or a 1 s sample before or after the run exceeded this.
FOREIGN_CPU_FRAC = 0.10
FOREIGN_STEAL_FRAC = 0.05
FOREIGN_SNAPSHOT_FRAC = 0.25


def foreign_load(runs: pd.DataFrame) -> np.ndarray:
    """[runs] True where the manifest's `machine` shows other work on the machine (thresholds above)."""
    with np.errstate(invalid="ignore"):
        during = (runs["cpu_other_frac"].to_numpy(float) > FOREIGN_CPU_FRAC) | (
            runs["steal_frac"].to_numpy(float) > FOREIGN_STEAL_FRAC
        )
        around = (runs["cpu_other_before"].to_numpy(float) > FOREIGN_SNAPSHOT_FRAC) | (
            runs["cpu_other_after"].to_numpy(float) > FOREIGN_SNAPSHOT_FRAC
        )
    return during | around


def foreign_reasons(run: Any) -> list[str]:
    """Why a run (a row of the runs table) counts as taken under foreign load."""
    out = []
    if run.cpu_other_frac > FOREIGN_CPU_FRAC:
        out.append(
            f"other processes used {run.cpu_other_frac:.0%} of all CPUs during the run (> {FOREIGN_CPU_FRAC:.0%})"
        )
    if run.steal_frac > FOREIGN_STEAL_FRAC:
        out.append(f"steal {run.steal_frac:.0%} (> {FOREIGN_STEAL_FRAC:.0%})")
    for when, value in (("before", run.cpu_other_before), ("after", run.cpu_other_after)):
        if value > FOREIGN_SNAPSHOT_FRAC:
            out.append(
                f"{value:.0%} of all CPUs busy in other processes just {when} it (> {FOREIGN_SNAPSHOT_FRAC:.0%})"
            )
    return out


# ---------------------------------------------------------------------------------------------
# hit_cap


def recompute_hit_cap(rec: pd.DataFrame) -> np.ndarray:
    """finish_reason == "length" and completion_tokens >= max_new_tokens, per record."""
    length = (rec["finish_reason"] == "length").to_numpy(dtype=bool, na_value=False)
    return length & (rec["completion_tokens"].to_numpy() >= rec["max_new_tokens"].to_numpy())


# ---------------------------------------------------------------------------------------------
# checked metadata


@dataclass(frozen=True)
class Mismatch:
    """Checked metadata that differ between runs or campaigns: value -> where it was seen."""

    what: str
    values: dict[str, list[str]]

    def __str__(self) -> str:
        parts = [f"{v} ({few(where)})" for v, where in self.values.items()]
        return f"{self.what}: " + "; ".join(parts)


def few(names: list[str], n: int = 3) -> str:
    """The first n names, and how many more."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def metadata_mismatches(data: Loaded) -> list[Mismatch]:
    """Checked metadata that differ: GPU model, model path, dataset SHA256, harness version, and
    (between campaigns) the experiment, its arms and baseline, and the client settings."""
    runs = data.runs[~data.runs["status"].isin((NOT_RUN, NO_MANIFEST))]  # check_runs names those
    out = [_distinct(f"run {col}", runs, col) for col in _RUN_CHECKED]
    out.append(_distinct_campaign(data, "dataset SHA256", lambda c: (c.meta.get("workload") or {}).get("sha256")))
    for what, get in _CAMPAIGN_CHECKED.items():
        out.append(_distinct_campaign(data, what, get))
    return [m for m in out if m is not None]


_RUN_CHECKED = ("gpu_name", "model_path", "dataset_sha256", "harness_version", "harness_git_sha")
_CAMPAIGN_CHECKED = {
    "experiment": lambda c: c.experiment,
    "arms (as declared)": lambda c: c.arms,
    "baseline": lambda c: c.baseline,
    "max_new_tokens": lambda c: c.meta.get("max_new_tokens"),
    "concurrency": lambda c: c.meta.get("concurrency"),
    "request_rate": lambda c: c.meta.get("request_rate"),
}


def _distinct(what: str, runs: pd.DataFrame, col: str) -> Mismatch | None:
    seen: dict[str, list[str]] = {}
    for value, run_id, camp in zip(runs[col], runs["run_id"], runs["campaign"], strict=True):
        seen.setdefault(_key(value), []).append(f"{camp}/{run_id}")
    return Mismatch(what, seen) if len(seen) > 1 else None


def _distinct_campaign(data: Loaded, what: str, get: Any) -> Mismatch | None:
    seen: dict[str, list[str]] = {}
    for camp in data.campaigns:
        seen.setdefault(_key(get(camp)), []).append(camp.label)
    return Mismatch(what, seen) if len(seen) > 1 else None


def _key(value: Any) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "(none)"
    return str(value)
