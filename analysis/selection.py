"""Which records the figures use: the planned requests (`PlanKeys`), the masks over `Loaded.records` that say which
records are measured, chosen (the first of each planned request), errored or used (`Selection`), and the values no
server or client can have produced (`invalid_values`). Fixed once, before any check runs (`pick`), so that the
metrics and the audit's checks read the same selection side by side."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.load import Loaded

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
