"""The audit: an independent pass over the raw records and manifests.

It reads the selection the metrics use (analysis.selection) and reports every check as a `Check` with a
status: `fail` (the tables should not be trusted), `warn`, `ok` or `info`. Any `fail` makes
`python -m analysis.report` exit 1 (`--no-strict`: 0, the report still says FAILED).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.check import FAIL, INFO, OK, WARN, Check, Status
from analysis.code import CHECK_NAME, check_code, fingerprint, firsts, run_codes
from analysis.commands import ArmDiff, RunVariant, compare_arms, interpreter_only, run_variants
from analysis.load import NO_MANIFEST, NOT_RUN, Loaded, segment_sums
from analysis.read_records import line_numbers
from analysis.selection import (
    FOREIGN_CPU_FRAC,
    FOREIGN_SNAPSHOT_FRAC,
    FOREIGN_STEAL_FRAC,
    INVALID_REASONS,
    Mismatch,
    Picked,
    PlanKeys,
    Selection,
    few,
    foreign_load,
    foreign_reasons,
    recompute_hit_cap,
)
from harness.contract import flag_value, request_seed

_RTOL = 1e-6


@dataclass
class Audit:
    checks: list[Check]
    coverage: pd.DataFrame  # per arm: planned, used, missing, duplicated, extra_records, errored, ...
    missing: pd.DataFrame
    duplicated: pd.DataFrame
    errored: pd.DataFrame
    arm_diffs: list[ArmDiff]
    variants: list[RunVariant]
    mismatches: list[Mismatch]
    picked: Picked  # the planned requests and the records the figures use

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def passed(self) -> bool:
        return not self.failed


# ---------------------------------------------------------------------------------------------
# coverage


def coverage(data: Loaded, plan: PlanKeys, sel: Selection, key: np.ndarray) -> dict[str, pd.DataFrame]:
    """Per-arm counts of planned, used, missing, duplicated and errored requests, and their lists."""
    runs, rec = data.runs, data.records
    size = len(runs) * max(plan.n_items, 1)
    pk = plan.key
    n = np.bincount(key[key >= 0], minlength=size)[pk]
    finished = (runs["status"] == "finished").to_numpy()[plan.run]
    rec_run = rec["_run"].to_numpy()
    unplanned = ~rec["warmup"].to_numpy() & (key < 0)
    counts = {
        "planned": np.ones(len(pk), dtype=np.int64),
        "used": _flag_per_key(sel.used, key, pk, size),
        "missing": (n == 0).astype(np.int64),
        "duplicated": (n > 1).astype(np.int64),
        "extra_records": np.maximum(n - 1, 0),
        "errored": _flag_per_key(sel.errored, key, pk, size),
        "unfinished_run": ((n > 0) & ~finished).astype(np.int64),
    }
    arm_codes, arm_names = pd.factorize(runs["arm"], sort=False)
    table = pd.DataFrame(
        {
            k: np.bincount(arm_codes[plan.run], weights=v, minlength=len(arm_names)).astype(np.int64)
            for k, v in counts.items()
        },
        index=pd.Index(arm_names, name="arm"),
    )
    table["unplanned_records"] = np.bincount(arm_codes[rec_run[unplanned]], minlength=len(arm_names))
    table = table[(table["planned"] > 0) | (table["unplanned_records"] > 0)]
    err = np.flatnonzero(sel.errored)
    invalid = sel.invalid[:, err].any(axis=0)
    errors = rec["error"].to_numpy()[err].astype(object)
    no_tokens = np.isnan(rec["completion_tokens"].to_numpy()[err])
    why = np.where(
        invalid,
        "invalid values (see 'Record values are valid')",
        np.where(no_tokens, "no completion_tokens (see 'Records readable')", "not finished"),
    )
    errored = _key_frame(data, rec_run[err], rec["_item"].to_numpy()[err]).assign(
        finish_reason=rec["finish_reason"].to_numpy()[err].astype(object),
        error=np.where(pd.isna(errors), why, errors),  # a null error says why the record counts as errored
    )
    return {
        "table": table,
        "missing": _key_frame(data, plan.run[n == 0], plan.item[n == 0]),
        "duplicated": _key_frame(data, plan.run[n > 1], plan.item[n > 1]).assign(records=n[n > 1]),
        "errored": errored,
    }


def _flag_per_key(mask: np.ndarray, key: np.ndarray, pk: np.ndarray, size: int) -> np.ndarray:
    """1 for each planned key (pk) that has a record selected by `mask`."""
    hit = np.zeros(size, dtype=np.int64)
    hit[key[mask]] = 1
    return hit[pk]


def _key_frame(data: Loaded, run: np.ndarray, item: np.ndarray) -> pd.DataFrame:
    runs, items = data.runs, data.items
    return pd.DataFrame(
        {
            "campaign": runs["campaign"].to_numpy()[run],
            "run_id": runs["run_id"].to_numpy()[run],
            "arm": runs["arm"].to_numpy()[run],
            "base_seed": runs["base_seed"].to_numpy()[run],
            "repeat": runs["repeat"].to_numpy()[run],
            "item_id": items["item_id"].to_numpy()[item] if len(items) else np.array([], dtype=object),
        }
    )


# ---------------------------------------------------------------------------------------------
# the checks


def run_audit(
    data: Loaded, picked: Picked, arms: list[str], baseline: str, mismatches: list[Mismatch], allow_mismatch: bool
) -> Audit:
    plan, sel, key = picked.plan, picked.selection, picked.key
    cov = coverage(data, plan, sel, key)
    arm_diffs = compare_arms(data, arms, baseline)
    variants = run_variants(data)
    checks = [
        check_parsing(data),
        check_coverage(cov),
        check_runs(data),
        check_identity(data, sel),
        check_seeds(data, sel, plan),
        check_seeds_honoured(data),
        check_commands(arm_diffs, variants, any(c.aa for c in data.campaigns), arms_alike(data, arm_diffs)),
        Check(CHECK_NAME, *check_code(data)),
        check_values(data, sel),
        check_server_fields(data, sel),
        check_verify_counts(data, sel),
        check_proposed_drafts(data, sel),
        check_draft_length(data, sel),
        check_histograms(data, sel),
        check_hit_cap(data, sel),
        check_metadata(mismatches, allow_mismatch),
        check_quiet_machine(data),
        check_nodes(data),
        check_placement(data),
        check_scores(data, sel),
        check_chunks(data, sel),
        check_counter_sums(data, sel),
        check_drafting(data, sel),
    ]
    order = [a for a in arms if a in cov["table"].index] + [a for a in cov["table"].index if a not in arms]
    return Audit(
        checks=checks,
        coverage=cov["table"].reindex(order),
        missing=cov["missing"],
        duplicated=cov["duplicated"],
        errored=cov["errored"],
        arm_diffs=arm_diffs,
        variants=variants,
        mismatches=mismatches,
        picked=picked,
    )


def check_parsing(data: Loaded) -> Check:
    """Every line parsed, and every record has its campaign's schema version."""
    versions = data.records["schema_version"]
    want = data.runs["schema_version"].to_numpy(float)[data.records["_run"].to_numpy()]
    wrong = int((versions.isna() | (versions.to_numpy() != want)).sum())
    details = [f"{b.path}:{b.line}: {b.reason}" for b in data.bad_lines]
    if wrong:
        details.insert(0, f"{wrong} record(s) without their campaign's schema_version")
    n = len(data.records)
    if data.bad_lines or wrong:
        return Check(
            "Records readable",
            FAIL,
            f"{len(data.bad_lines)} bad line(s), {wrong} wrong schema version among {n} records",
            tuple(details),
        )
    note = f"; {len(data.slow_files)} file(s) read by the line-by-line reader" if data.slow_files else ""
    shown = ", ".join(str(v) for v in sorted({c.schema_version for c in data.campaigns}))
    return Check("Records readable", OK, f"{n} records, schema version {shown}{note}")


def check_coverage(cov: dict[str, pd.DataFrame]) -> Check:
    t = cov["table"]
    total = t.sum()
    summary = (
        f"{total['used']}/{total['planned']} planned requests used; {total['missing']} missing, "
        f"{total['duplicated']} duplicated ({total['extra_records']} extra records), {total['errored']} errored, "
        f"{total['unfinished_run']} in unfinished runs, {total['unplanned_records']} unplanned records"
    )
    bad = total["used"] != total["planned"] or total["duplicated"] or total["unplanned_records"]
    details = [f"missing: {_req(r)}" for r in cov["missing"].itertuples()]
    details += [f"duplicated ({r.records} records): {_req(r)}" for r in cov["duplicated"].itertuples()]
    details += [f"errored ({r.finish_reason}; {r.error}): {_req(r)}" for r in cov["errored"].itertuples()]
    return Check(
        "Coverage (each planned request once, finished, outside warmup)", FAIL if bad else OK, summary, tuple(details)
    )


def _req(r: Any) -> str:
    return f"arm {r.arm}, seed {r.base_seed}, repeat {r.repeat}, item {r.item_id} ({r.campaign}/{r.run_id})"


def check_runs(data: Loaded) -> Check:
    runs = data.runs
    details = [
        f"{r.campaign}/{r.run_id} ({r.arm}): "
        + (f"runs/{r.run_id}/manifest.json is missing" if r.status == NO_MANIFEST else f"status {r.status}")
        for r in runs.itertuples()
        if r.planned and r.status != "finished"
    ]
    details += [
        f"{r.campaign}/{r.run_id}: on disk but not in the plan (ignored)" for r in runs.itertuples() if not r.planned
    ]
    details += [
        f"{r.campaign}/{r.run_id} ({r.arm}): server log checks failed"
        for r in runs.itertuples()
        if r.planned and r.log_checks_passed is False
    ]
    n_ok = int(((runs["status"] == "finished") & runs["planned"]).sum())
    summary = f"{n_ok}/{int(runs['planned'].sum())} planned runs finished"
    return Check("Runs finished, log checks passed", FAIL if details else OK, summary, tuple(details))


def check_identity(data: Loaded, sel: Selection) -> Check:
    rec, runs = data.records, data.runs
    run = rec["_run"].to_numpy()
    bad = np.zeros(len(rec), dtype=bool)
    for col in ("campaign_id", "run_id", "arm"):
        codes = rec[col].cat.codes.to_numpy()
        want = pd.Index(rec[col].cat.categories.astype(str)).get_indexer(runs[col].astype(str))
        bad |= (codes < 0) | (codes != want[run])
    for col in ("base_seed", "repeat"):
        got = rec[col].to_numpy(dtype="float64", na_value=np.nan)
        bad |= got != runs[col].to_numpy(dtype="float64", na_value=np.nan)[run]
    details = _rows(data, bad, lambda i: "campaign_id/run_id/arm/base_seed/repeat differ from the run's plan")
    status: Status = FAIL if bad.any() else OK
    return Check(
        "Record identity matches its run", status, f"{int(bad.sum())} record(s) with another identity", tuple(details)
    )


def check_seeds(data: Loaded, sel: Selection, plan: PlanKeys) -> Check:
    rec, runs, items = data.records, data.runs, data.items
    run, item = rec["_run"].to_numpy(), np.maximum(rec["_item"].to_numpy(), 0)
    seeded = np.array([_seeded(data, c) for c in runs["campaign"]], dtype=bool)[run]
    offset = (
        items["seed_offset"].to_numpy(dtype="float64", na_value=np.nan)[item]
        if len(items)
        else np.full(len(item), np.nan)
    )
    base = runs["base_seed"].to_numpy(dtype="float64", na_value=np.nan)[run]
    stream = runs["seed_stream"].to_numpy(dtype="float64")[run]
    planned = np.where(seeded, request_seed(base, offset, stream), np.nan)  # float64: exact below 2**53
    got = rec["request_seed"].to_numpy(dtype="float64", na_value=np.nan)
    rec_offset = rec["seed_offset"].to_numpy(dtype="float64", na_value=np.nan)
    same = (got == planned) | (np.isnan(got) & np.isnan(planned))
    bad = sel.chosen & (~same | (rec_offset != offset))
    details = _rows(
        data,
        bad,
        lambda i: (
            f"request_seed {_int(got[i])}, planned {_int(planned[i])} "
            f"(seed_offset {_int(rec_offset[i])}, planned {_int(offset[i])})"
        ),
    )
    n = int(sel.chosen.sum())
    what = (
        "planned seeds (base seed + item seed_offset"
        + (" + seed_stream x 2^32)" if (runs["seed_stream"] != 0).any() else ")")
        if seeded.all()
        else "planned seeds"
    )
    return Check(
        "Request seeds equal the plan",
        FAIL if bad.any() else OK,
        f"{n - int(bad.sum())}/{n} requests carry their {what}",
        tuple(details),
    )


def _int(x: float) -> str:
    return "null" if np.isnan(x) else str(int(x))


def _seeded(data: Loaded, label: str) -> bool:
    return next(c for c in data.campaigns if c.label == label).seeded_requests


def check_seeds_honoured(data: Loaded) -> Check:
    runs = data.runs[data.runs["planned"] & ~data.runs["status"].isin((NOT_RUN, NO_MANIFEST))]
    if not any(_seeded(data, c.label) for c in data.campaigns):
        return Check("Seeds honoured by the server", INFO, "requests are not seeded (experiment.seeded_requests=false)")
    honoured = runs["seeds_honoured"].map(lambda v: v is True)
    details = [
        f"{r.campaign}/{r.run_id} ({r.arm}): seeds_honoured={r.seeds_honoured}" for r in runs[~honoured].itertuples()
    ]
    contradict = runs[honoured & (runs["deterministic_flag"].map(lambda v: v is False))]
    details += [
        f"{r.campaign}/{r.run_id}: manifest says seeds honoured but server_info has "
        f"enable_deterministic_inference=false"
        for r in contradict.itertuples()
    ]
    summary = f"{int(honoured.sum())}/{len(runs)} runs honour sampling seeds"
    if not contradict.empty:
        return Check("Seeds honoured by the server", FAIL, summary, tuple(details))
    if not honoured.all():
        return Check(
            "Seeds honoured by the server",
            WARN,
            summary + ": the server ignored sampling_seed in the others, so their outputs are not reproducible",
            tuple(details),
        )
    return Check("Seeds honoured by the server", OK, summary)


def check_commands(
    arm_diffs: list[ArmDiff], variants: list[RunVariant], aa: bool = False, alike: dict[str, bool] | None = None
) -> Check:
    """The arms' commands and environments differ from the baseline's only as declared; and an arm that resolved
    alike (`alike`: the same command, environment and code) is a comparison only where the experiment declares an
    A/A (`aa`), which in turn needs every arm alike."""
    alike = alike or {}
    details: list[str] = []
    for d in arm_diffs:
        if alike.get(d.arm) and not aa:
            details.append(
                f"{d.arm} vs {d.baseline}: the same command, environment and code: the comparison "
                "compares a thing with itself, though the experiment declares a difference (an intended "
                "A/A says experiment.aa=true)"
            )
        if aa and not alike.get(d.arm) and d.pairs:
            details.append(
                f"{d.arm} vs {d.baseline}: the experiment declares an A/A (experiment.aa=true), but the "
                f"arms differ: {'; '.join([*map(str, d.hunks), *map(str, d.env)]) or 'in their code'}"
            )
    for d in arm_diffs:
        if d.note:
            details.append(f"{d.arm}: {d.note}")
        if d.undeclared_removed or d.undeclared_added:
            details.append(
                f"{d.arm} vs {d.baseline}: undeclared command tokens: "
                f"removed {list(d.undeclared_removed)}, added {list(d.undeclared_added)}; "
                f"differences: {'; '.join(map(str, d.hunks))}"
            )
        details += [f"{d.arm} vs {d.baseline}: undeclared env difference {e}" for e in d.undeclared_env]
    variant_lines = [
        f"{v.arm}: run {v.run_id} differs from run {v.first_run_id}: "
        f"{'; '.join([*map(str, v.hunks), *map(str, v.env)])}"
        for v in variants
    ]
    bad = any(not d.clean or bool(alike.get(d.arm)) != aa for d in arm_diffs if d.pairs)
    unknown = any(d.note for d in arm_diffs)
    summary = "; ".join(
        f"{d.arm}: "
        + (
            (
                "identical to the baseline (A/A, declared)"
                if aa
                else "IDENTICAL to the baseline, though a difference is declared"
            )
            if alike.get(d.arm)
            else d.note
            if d.note
            else "only the declared difference"
            if d.clean
            else "UNDECLARED differences"
        )
        for d in arm_diffs
    )
    status: Status = FAIL if bad else WARN if variants or unknown else OK
    return Check("Commands and environments differ only as declared", status, summary, tuple(details + variant_lines))


def arms_alike(data: Loaded, arm_diffs: list[ArmDiff]) -> dict[str, bool]:
    """Per arm: whether it resolved alike to the baseline: the same commands and environments, or commands that
    differ only in the interpreter's path where both interpreters held the same code and packages; and no recorded
    code that differs (two paths to one install are one install)."""
    codes = firsts(run_codes(data))
    out = {}
    for d in arm_diffs:
        a, b = codes.get(d.baseline), codes.get(d.arm)
        same_code = a is None or b is None or fingerprint(a) == fingerprint(b)
        out[d.arm] = (
            d.pairs > 0 and same_code and (d.identical or (interpreter_only(d) and a is not None and b is not None))
        )
    return out


def check_values(data: Loaded, sel: Selection) -> Check:
    """Counts and times that cannot be true (negative, fractional, out of order) fail the audit."""
    masks = sel.invalid
    in_scope = sel.chosen | sel.measured
    bad = in_scope & masks.any(axis=0)
    details = _rows(data, bad, lambda i: "; ".join(r for r, m in zip(INVALID_REASONS, masks[:, i], strict=True) if m))
    summary = (
        f"{int(bad.sum())} measured record(s) with impossible counts or times (counted as errored, "
        f"left out of every figure)"
        if bad.any()
        else f"{int(in_scope.sum())} measured records checked"
    )
    return Check("Record values are valid (counts, times)", FAIL if bad.any() else OK, summary, tuple(details))


def check_server_fields(data: Loaded, sel: Selection) -> Check:
    """Each request's server spec_accept_length against completion_tokens / spec_verify_ct."""
    rec = data.records
    ct, vct = rec["completion_tokens"].to_numpy(), rec["spec_verify_ct"].to_numpy()
    server = rec["meta_spec_accept_length"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        mine = ct / vct
    have = sel.chosen & ~np.isnan(server) & (vct > 0) & ~np.isnan(ct)  # (no completion_tokens: errored already)
    bad = have & ~np.isclose(server, mine, rtol=_RTOL, atol=0)
    details = _rows(
        data,
        bad,
        lambda i: f"server spec_accept_length {server[i]:.6g} vs completion_tokens/spec_verify_ct {mine[i]:.6g}",
    )
    summary = (
        f"{int(have.sum())} requests report spec_accept_length; {int(bad.sum())} differ from "
        f"completion_tokens/spec_verify_ct"
    )
    return Check(
        "Server's spec_accept_length matches the recomputed one", FAIL if bad.any() else OK, summary, tuple(details)
    )


def check_verify_counts(data: Loaded, sel: Selection) -> Check:
    """A run whose server command names a speculative algorithm must report its verify counts
    (spec_verify_ct) with every request: without them its acceptance length is not measured, however well
    the rest of the campaign went."""
    name = "Speculative runs report their verify counts"
    algo = data.runs["spec_algorithm"].to_numpy(dtype=object)
    speculative = np.array([a is not None and str(a).upper() != "NONE" for a in algo], dtype=bool)
    if not speculative.any():
        return Check(name, INFO, "no run's server command names a --speculative-algorithm")
    rec = data.records
    run = rec["_run"].to_numpy()
    missing = sel.used & speculative[run] & np.isnan(rec["spec_verify_ct"].to_numpy(float))
    details = _rows(
        data, missing, lambda i: f"--speculative-algorithm {algo[run[i]]}, but meta_info carries no spec_verify_ct"
    )
    checked = int((sel.used & speculative[run]).sum())
    if missing.any():
        return Check(
            name,
            FAIL,
            f"{int(missing.sum())} of {checked} requests of speculative runs carry no "
            "spec_verify_ct: the server did not report what it verified, so acceptance length "
            "and drafts per step are not measured",
            tuple(details),
        )
    return Check(name, OK, f"{checked} requests of speculative runs carry spec_verify_ct")


def check_proposed_drafts(data: Loaded, sel: Selection) -> Check:
    """An arm whose server command names a speculative algorithm must have proposed drafts: when every used
    request of its speculative runs reports spec_num_proposed_drafts 0 and an all-zero acceptance histogram,
    nothing was speculated (a draft model that never ran, a server that ignored the flag), and its acceptance
    figures would be 0/0."""
    name = "Speculative arms proposed drafts"
    algo = data.runs["spec_algorithm"].to_numpy(dtype=object)
    speculative = np.array([a is not None and str(a).upper() != "NONE" for a in algo], dtype=bool)
    if not speculative.any():
        return Check(name, INFO, "no run's server command names a --speculative-algorithm")
    rec, hist = data.records, data.hist
    run = rec["_run"].to_numpy()
    proposed = rec["meta_spec_num_proposed_drafts"].to_numpy(dtype=float)
    told = ~np.isnan(proposed) | hist.present  # the request says how many drafts it proposed, one way or both
    no_proposal = np.isnan(proposed) | (proposed == 0)
    no_steps = ~hist.present | (hist.dense.sum(axis=1) == 0)
    none = told & no_proposal & no_steps
    scope = sel.used & speculative[run] & told
    arms = data.runs["arm"].to_numpy(dtype=object)[run]
    details, checked = [], sorted({str(a) for a in arms[scope]})
    for arm in checked:
        mine = scope & (arms == arm)
        if none[mine].all():
            details.append(
                f"arm {arm}: its {int(mine.sum())} used request(s) of speculative runs all report "
                "spec_num_proposed_drafts 0 and an all-zero acceptance histogram: the arm proposed no "
                "drafts, so its acceptance length and per-position rates measure nothing (check that "
                "the draft model ran: the server's log, --speculative-* flags)"
            )
    if details:
        return Check(
            name, FAIL, f"{len(details)} of {len(checked)} speculative arm(s) proposed no drafts", tuple(details)
        )
    if not checked:
        return Check(name, INFO, "no used request of a speculative run reports its proposed drafts")
    return Check(name, OK, f"{len(checked)} speculative arm(s) proposed drafts")


def check_draft_length(data: Loaded, sel: Selection) -> Check:
    """Each run whose command declares a draft length (manifest declared_draft_length, read by its backend from the
    argv) drafted that many tokens per verify step: its used records' proposed drafts per verify step equal it. A server that ignored the flag fails, naming the run."""
    name = "Each run drafted the draft length its command declares"
    declared = (
        data.runs["declared_draft_length"].to_numpy(dtype=float) if "declared_draft_length" in data.runs else None
    )
    if declared is None or np.isnan(declared).all():
        return Check(name, INFO, "no run's command declares a draft length its backend reads")
    rec = data.records
    run = rec["_run"].to_numpy()
    steps = rec["spec_verify_ct"].to_numpy(dtype=float)
    per_step = rec["meta_spec_num_proposed_drafts"].to_numpy(dtype=float) / np.where(steps > 0, steps, np.nan)
    details, checked = [], 0
    for r in np.flatnonzero(~np.isnan(declared)):
        mine = sel.used & (run == r)
        seen = sorted({int(round(p)) for p in per_step[mine] if np.isfinite(p)})
        if not seen:
            continue
        checked += 1
        if seen != [int(declared[r])]:
            row = data.runs.iloc[r]
            details.append(
                f"{row['campaign']}/{row['run_id']} (arm {row['arm']}): its command declares {int(declared[r])} draft "
                f"token(s) per verify step, its records show {', '.join(map(str, seen))} (the server ignored the flag?)"
            )
    summary = f"{checked} run(s) checked; {len(details)} drafted another length than declared"
    return Check(name, FAIL if details else (OK if checked else INFO), summary, tuple(details))


def _rows(data: Loaded, mask: np.ndarray, say: Callable[[int], str], limit: int = 200) -> list[str]:
    """One line per flagged record (the first `limit`), naming its run, its line of records.jsonl and its item."""
    runs, rec = data.runs, data.records
    idx = np.flatnonzero(mask)
    run, row = rec["_run"].to_numpy()[idx[:limit]], rec["_line"].to_numpy()[idx[:limit]]
    line: dict[tuple[int, int], int] = {}
    for r in np.unique(run):
        path = runs["records_path"].iat[r]
        rows = [int(x) for x in row[run == r]]
        line.update(
            zip(((int(r), x) for x in rows), line_numbers(Path(path), rows, path in data.slow_files), strict=True)
        )
    out = []
    for i, r, x in zip(idx[:limit], run, row, strict=True):
        out.append(
            f"{runs['campaign'].iat[r]}/{runs['run_id'].iat[r]} line {line[int(r), int(x)]} "
            f"(item {rec['item_id'].iat[i]}): {say(i)}"
        )
    if len(idx) > limit:
        out.append(f"... and {len(idx) - limit} more records")
    return out


def check_histograms(data: Loaded, sel: Selection) -> Check:
    hist = data.hist
    name = "Correct-drafts histograms add up"
    if not hist.present.any():
        return Check(name, INFO, "no spec_correct_drafts_histogram in meta_info")
    rec = data.records
    steps = hist.dense.sum(axis=1)
    drafts = hist.dense @ np.arange(hist.dense.shape[1])
    vct, ncd = rec["spec_verify_ct"].to_numpy(), rec["spec_num_correct_drafts"].to_numpy()
    bad = sel.chosen & hist.present & (((~np.isnan(vct)) & (steps != vct)) | ((~np.isnan(ncd)) & (drafts != ncd)))
    details = _rows(
        data,
        bad,
        lambda i: (
            f"histogram sums to {steps[i]} steps / {drafts[i]} correct drafts, "
            f"record says {_int(vct[i])} / {_int(ncd[i])}"
        ),
    )
    summary = f"{int((hist.present & sel.chosen).sum())} requests carry a histogram; {int(bad.sum())} inconsistent"
    return Check(name, WARN if bad.any() else OK, summary, tuple(details))


def check_hit_cap(data: Loaded, sel: Selection) -> Check:
    rec = data.records
    recomputed = recompute_hit_cap(rec)
    recorded = rec["hit_cap"].to_numpy(dtype=bool)
    bad = sel.chosen & (recomputed != recorded)
    details = _rows(data, bad, lambda i: f"hit_cap={bool(recorded[i])} but recomputed {bool(recomputed[i])}")
    return Check(
        "hit_cap agrees with finish_reason and max_new_tokens",
        WARN if bad.any() else OK,
        f"{int(bad.sum())} disagreement(s); the report uses the recomputed value",
        tuple(details),
    )


def check_metadata(mismatches: list[Mismatch], allow_mismatch: bool) -> Check:
    name = "Checked metadata match (GPU, model, dataset SHA256, harness version)"
    if not mismatches:
        return Check(name, OK, "all runs and campaigns agree")
    status: Status = WARN if allow_mismatch else FAIL
    how = "compared anyway (--allow-mismatch)" if allow_mismatch else "refused"
    return Check(name, status, f"{len(mismatches)} mismatch(es), {how}", tuple(map(str, mismatches)))


def check_quiet_machine(data: Loaded) -> Check:
    """Runs whose manifest `machine` shows other work on the machine (schema 2)."""
    name = "Runs taken on a quiet machine"
    runs = data.runs[data.runs["planned"] & (data.runs["status"] == "finished")]
    recorded = runs[runs["machine_recorded"].to_numpy(dtype=bool)]
    if recorded.empty:
        return Check(name, INFO, "machine load not recorded (schema 1 manifests)")
    flagged = recorded[foreign_load(recorded)]
    details = [f"{r.campaign}/{r.run_id} ({r.arm}): " + "; ".join(foreign_reasons(r)) for r in flagged.itertuples()]
    unrecorded = len(runs) - len(recorded)
    summary = (
        f"{len(flagged)} of {len(recorded)} runs taken under foreign load (other processes > "
        f"{FOREIGN_CPU_FRAC:.0%} of all CPUs during the run, steal > {FOREIGN_STEAL_FRAC:.0%}, or > "
        f"{FOREIGN_SNAPSHOT_FRAC:.0%} just before or after)"
    )
    if unrecorded:
        summary += f"; {unrecorded} run(s) without a machine record"
    if len(flagged):
        summary += ": their throughput and latency may measure the other work, not the arms"
    return Check(name, WARN if len(flagged) else OK, summary, tuple(details))


def check_nodes(data: Loaded) -> Check:
    """Both runs of a pair (same campaign, seed, repeat) on one node, and one node type (GPU model, count and
    driver; CPU model) over every run: shards of a campaign may land on different nodes of a cluster, but
    a pair split across nodes is not paired, and mixed hardware is refused."""
    name = "Paired runs on one node, one node type"
    runs = data.runs[data.runs["planned"] & data.runs["found"] & data.runs["hostname"].notna()]
    if runs.empty:
        return Check(name, INFO, "no manifest names its host")
    details = []
    for (camp, seed, repeat), pair in runs.groupby(["campaign", "base_seed", "repeat"], sort=True):
        if pair["hostname"].nunique() > 1:
            where = ", ".join(f"{r.run_id} on {r.hostname}" for r in pair.itertuples())
            details.append(f"{camp}: the pair (seed {seed}, repeat {repeat}) was split across nodes: {where}")
    types = runs.groupby("node_type", dropna=False, sort=True)["run_id"].apply(list)
    if len(types) > 1:
        details += [
            f"mixed hardware: {t if isinstance(t, str) else 'unknown'}: {few(list(ids))}" for t, ids in types.items()
        ]
    hosts = sorted(runs["hostname"].unique())
    summary = f"{len(runs)} runs on {len(hosts)} node(s) ({few(hosts)}); " + (
        f"{len(types)} node types" if len(types) > 1 else f"node type: {types.index[0]}"
    )
    return Check(name, FAIL if details else OK, summary, tuple(details))


def check_placement(data: Loaded) -> Check:
    """Each run got the GPU its plan gave it (parallel placement): the manifest's gpu and the
    CUDA_VISIBLE_DEVICES its server got equal the plan's. The command comparison masks this planned
    difference (commands.placed_env), so this check is what catches a wrong GPU."""
    name = "Each run on the GPU the plan gave it"
    runs = data.runs[data.runs["planned"] & data.runs["found"]]
    placed = runs[runs["gpu"].notna()]
    if placed.empty:
        return Check(name, OK, "no GPU placement planned (sequential runs share the visible GPUs)")
    details = [
        f"{r.campaign}/{r.run_id} ({r.arm}): planned GPU {r.gpu}, manifest gpu {r.manifest_gpu}, "
        f"CUDA_VISIBLE_DEVICES={r.gpu_env}"
        for r in placed.itertuples()
        if r.manifest_gpu != r.gpu or r.gpu_env != str(int(r.gpu))
    ]
    summary = f"{len(placed) - len(details)}/{len(placed)} runs on their planned GPU"
    return Check(name, FAIL if details else OK, summary, tuple(details))


def check_scores(data: Loaded, sel: Selection) -> Check:
    """Schema 2: each finished run with records has a scores.jsonl that scores its used requests."""
    name = "Answers scored (scores.jsonl)"
    runs = data.runs[data.runs["planned"] & (data.runs["status"] == "finished") & (data.runs["schema_version"] >= 2)]
    if runs.empty:
        return Check(name, INFO, "schema 1: answers were scored in the client's event loop (the record's `correct`)")
    missing = runs[(runs["scores_path"] == "") & (runs["records_path"] != "")]
    details = [  # the runner writes it once the run's server has stopped: deleted or moved since
        f"{r.campaign}/{r.run_id} ({r.arm}): records but no runs/{r.run_id}/scores.jsonl (deleted or moved: restore "
        "it, or rerun the run); its used requests have no score"
        for r in missing.itertuples()
    ]
    lines = data.records["_score_lines"].to_numpy()
    with np.errstate(invalid="ignore"):  # NaN: the run has no scores file (above)
        none, twice = sel.used & (lines == 0), sel.used & (lines > 1)
    lost = _rows(
        data,
        none,
        lambda i: (
            "no line in its run's scores.jsonl: its score is unknown, and the score column counts it as not correct"
        ),
    )
    lost += _rows(
        data, twice, lambda i: f"scored on {int(lines[i])} lines of its run's scores.jsonl (the first counts)"
    )
    nulls = int((sel.used & (lines == 1) & np.isnan(data.records["correct"].to_numpy())).sum())
    if nulls:
        details.append(f"{nulls} used request(s) with a null score (no reference answer, or scoring off)")
    summary = f"{len(runs) - len(missing)}/{len(runs)} finished runs have scores.jsonl"
    if lost:
        summary += (
            f"; {int(none.sum())} used request(s) without a score line, {int(twice.sum())} scored twice: "
            "the file was edited or cut short (restore it, or rerun the runs)"
        )
        return Check(name, FAIL, summary, tuple(lost + details))
    return Check(name, FAIL if len(missing) else OK, summary, tuple(details))


def check_chunks(data: Loaded, sel: Selection) -> Check:
    """Schema 2 chunk arrays: increasing times, one token count per chunk, counts adding up to completion_tokens."""
    name = "Chunk timings consistent (chunk_us, chunk_tokens)"
    ch = data.chunks
    if not ch.us_present.any():
        return Check(name, INFO, "no chunk arrays (schema 1): ITL n/a; the first chunk counts as 1 token")
    rec = data.records
    # over the flat arrays: each decrease found once and given to its record; token sums per non-empty record
    backwards = np.zeros(len(ch.us_present), dtype=bool)
    later = np.flatnonzero(ch.us[1:] < ch.us[:-1])  # chunk j + 1 arrived before chunk j
    owner = np.searchsorted(ch.us_offsets, later, side="right") - 1  # the record of chunk j
    backwards[owner[later + 1 < ch.us_offsets[owner + 1]]] = True  # j + 1 is the same record's
    tok_sum = segment_sums(ch.tok, ch.tok_offsets)
    ct = rec["completion_tokens"].to_numpy()
    mis_len = ch.us_present & ch.tok_present & ~ch.aligned
    mis_sum = ch.aligned & ~np.isnan(ct) & (tok_sum != ct)
    scope = sel.used & ch.us_present
    bad = scope & (backwards | mis_len | mis_sum)

    def say(i: int) -> str:
        parts = ["chunk_us decreases"] if backwards[i] else []
        parts += ["chunk_tokens and chunk_us differ in length"] if mis_len[i] else []
        parts += [f"chunk_tokens add up to {int(tok_sum[i])}, completion_tokens {_int(ct[i])}"] if mis_sum[i] else []
        return "; ".join(parts)

    no_tokens = int((scope & ~ch.tok_present).sum())
    summary = f"{int(scope.sum())} used requests carry chunk times; {int(bad.sum())} inconsistent"
    if no_tokens:
        summary += f"; {no_tokens} without chunk_tokens (ITL n/a for them, first chunk counted as 1 token)"
    return Check(name, WARN if bad.any() else OK, summary, tuple(_rows(data, bad, say)))


# ---------------------------------------------------------------------------------------------
# a server's own counters (manifest server_counters: its /metrics over the measured window, harness/backends/counters.py)

# (record column, the harness' counter): the per-request counts of a run's measured requests must add up to its delta
COUNTER_SUMS = (
    ("completion_tokens", "output_tokens"),
    ("meta_spec_num_proposed_drafts", "draft_tokens"),
    ("spec_num_correct_drafts", "accepted_tokens"),
    ("spec_verify_ct", "verify_steps"),
)
# manifests before server_counters.names (2026-12-06) were llama-server's, under these names
LEGACY_COUNTER_NAMES = {
    "output_tokens": "tokens_predicted_total",
    "draft_tokens": "spec_decode_num_draft_tokens_total",
    "accepted_tokens": "spec_decode_num_accepted_tokens_total",
    "decode_calls": "n_decode_total",
}
LLAMA_DRAFT_MODEL_FLAGS = ("--spec-draft-model", "-md", "--model-draft")


def _counted_runs(data: Loaded) -> list[tuple[int, str, dict[str, Any]]]:
    """(row of runs, campaign/run_id, manifest) of each finished planned run whose manifest has server_counters."""
    out = []
    manifests = {c.label: c.manifests for c in data.campaigns}
    for r in data.runs[data.runs["planned"] & (data.runs["status"] == "finished")].itertuples():
        man = manifests.get(r.campaign, {}).get(r.run_id) or {}
        if isinstance(man.get("server_counters"), dict):
            out.append((int(r.run), f"{r.campaign}/{r.run_id} ({r.arm})", man))
    return out


def counter_deltas(man: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """The harness' counter -> (the engine's name, its delta over the measured window) of one run's manifest."""
    counters = man["server_counters"]
    names = counters.get("names") or LEGACY_COUNTER_NAMES
    delta = counters.get("delta") or {}
    return {ours: (native, delta[native]) for ours, native in names.items() if native in delta}


def counter_acceptance(data: Loaded, sel: Selection) -> dict[str, float]:
    """Each counted run's acceptance length from its server's own counters alone: every request's first token comes
    from its prompt's forward and each verify step emits its accepted drafts plus one token, so verify steps = output
    tokens - requests - accepted tokens, and AL = output tokens / verify steps (the records' definition,
    analysis/metrics.py); a server that counts its verify steps (the embedded server, SGLang) gives them directly.
    Runs without output_tokens and either verify_steps or accepted_tokens counters are left out."""
    out = {}
    run_of = data.records["_run"].to_numpy()
    for run, label, man in _counted_runs(data):
        deltas = counter_deltas(man)
        if "output_tokens" in deltas and deltas.get("verify_steps", ("", 0.0))[1] > 0:  # the server counts its steps
            out[label] = deltas["output_tokens"][1] / deltas["verify_steps"][1]
        elif "output_tokens" in deltas and "accepted_tokens" in deltas:
            tokens, accepted = deltas["output_tokens"][1], deltas["accepted_tokens"][1]
            steps = tokens - int((sel.measured & (run_of == run)).sum()) - accepted
            out[label] = tokens / steps if steps > 0 else float("nan")
    return out


def check_counter_sums(data: Loaded, sel: Selection) -> Check:
    """Each run's measured requests add up to its server's /metrics deltas: output tokens, drafted and accepted
    tokens; at concurrency 1 also its decode calls (each request's decode steps plus its prompt's one call)."""
    name = "Per-request counts add up to the server's own counters (/metrics deltas)"
    runs = _counted_runs(data)
    if not runs:
        return Check(name, INFO, "no run recorded its server's counters (llama-server and embedded runs do)")
    rec = data.records
    run_of = rec["_run"].to_numpy()
    details: list[str] = []
    compared: dict[str, None] = {}  # the pairs checked, in order (a dict as an ordered set)
    for run, label, man in runs:
        mine = sel.measured & (run_of == run)
        deltas = counter_deltas(man)
        given = [(col, ours) for col, ours in COUNTER_SUMS if not np.isnan(rec[col].to_numpy(float)[mine]).all()]
        sums = [(col, ours, float(np.nansum(rec[col].to_numpy(float)[mine]))) for col, ours in given]
        if man.get("concurrency") == 1 and not np.isnan(rec["spec_verify_ct"].to_numpy(float)[mine]).all():
            steps = float(np.nansum(rec["spec_verify_ct"].to_numpy(float)[mine])) + int(mine.sum())
            sums.append(("spec_verify_ct + 1 per request", "decode_calls", steps))
        compared.update({f"{col} against {ours}": None for col, ours, _ in sums if ours in deltas})
        details += [
            f"{label}: records sum {col} to {got:g}, the server's {deltas[ours][0]} grew by {deltas[ours][1]:g}"
            for col, ours, got in sums
            if ours in deltas and deltas[ours][1] != got
        ]
    summary = f"{len(runs)} run(s) checked against their /metrics deltas; {len(details)} mismatch(es)"
    summary += f" (compared: {', '.join(compared) or 'nothing: no record field has a counter on these servers'})"
    lengths = counter_acceptance(data, sel)
    if lengths:
        summary += "; acceptance length from the counters: " + ", ".join(f"{k} {v:.3f}" for k, v in lengths.items())
    return Check(name, FAIL if details else OK, summary, tuple(details))


def _asks_speculation(argv: Any) -> bool:
    """A llama-server command that asks for speculative decoding: a --spec-type other than none, or a draft model."""
    kind = flag_value(argv, "--spec-type")
    return (kind is not None and kind != "none") or any(flag_value(argv, f) for f in LLAMA_DRAFT_MODEL_FLAGS)


def check_drafting(data: Loaded, sel: Selection) -> Check:
    """A run whose command asks for speculation must have drafted (llama-server silently serves without it, e.g. for
    -md without --spec-type): its /slots say a slot speculates and its counters show drafts; a run that does not ask
    must report no draft at all (counters and records)."""
    name = "Speculative runs drafted; the others report no drafts"
    runs = _counted_runs(data)
    if not runs:
        return Check(name, INFO, "no run recorded its server's counters (llama-server runs do)")
    rec = data.records
    run_of = rec["_run"].to_numpy()
    proposed = rec["meta_spec_num_proposed_drafts"].to_numpy(float)
    details, asking = [], 0
    runs = [r for r in runs if isinstance(r[2].get("server_slots"), list)]  # (llama-server's: its /slots say)
    if not runs:
        return Check(name, INFO, "no run recorded its server's /slots (llama-server runs do)")
    for run, label, man in runs:
        drafted = counter_deltas(man).get("draft_tokens", ("", 0.0))[1]
        slots = man.get("server_slots")
        speculates = isinstance(slots, list) and any(isinstance(s, dict) and s.get("speculative") for s in slots)
        in_records = float(np.nansum(proposed[sel.measured & (run_of == run)]))
        if _asks_speculation(man.get("command")):
            asking += 1
            if not speculates:
                details.append(
                    f"{label}: its command asks for speculation, but its /slots say no slot speculates "
                    "(llama-server serves a draft model without --spec-type without speculation)"
                )
            if not drafted:
                details.append(
                    f"{label}: its command asks for speculation, but it drafted nothing in the measured "
                    "window: its acceptance is not measured"
                )
        elif drafted or speculates or in_records:
            details.append(
                f"{label}: its command asks for no speculation, but it drafted {drafted:g} token(s) "
                f"(records: {in_records:g}; a slot speculates: {speculates})"
            )
    summary = f"{asking} of {len(runs)} run(s) ask for speculation; {len(details)} problem(s)"
    return Check(name, FAIL if details else OK, summary, tuple(details))
