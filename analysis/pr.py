"""pr.md: what a pull request carries, in the seed write-ups' shape (../shared/reference/): a title line,
the audit in one line, the pooled table in the seeds' rows, the per-seed table, setup and protocol
bullets, and a link to report.md.

Every number is a cell of the report's own tables (analysis.tables), never recomputed; every line is at
most MAX_LINE characters (long bullets wrap; a markdown paragraph joins them again).
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import replace
from typing import Any

import pandas as pd

from analysis import gate as gates
from analysis.code import describe, firsts, package_differences, run_codes
from analysis.commands import normalise
from analysis.markdown import VERSION_FIELDS, arm_manifests, first_manifest, shell, table
from analysis.mdescape import escape_text, no_raw_html
from analysis.model import Report
from analysis.stats import MIN_ITEMS, MIN_PAIRS, Change
from analysis.tables import fmt_change, fmt_num, labels

MAX_LINE = 160
# the seeds' pooled rows: metric key of the report's pooled table -> the label pr.md shows
POOLED_ROWS = {
    "acceptance_length": "Acceptance length (includes bonus)",
    "correct_drafts_per_step": "Correct drafts per verify step",
    "throughput": "Output throughput (tokens/s)",
    "decode_tps": "Decode throughput, measured (tokens/s)",
    "cpu_per_token": "Server CPU time per output token (ms)",
}
COUNT_ROWS = {"score": "Boxed score over entire response", "cap_hits": "Responses hitting the cap"}
METRIC_LINES = (
    "acceptance length = completion tokens / verify steps, summed over requests (first token and bonus included); "
    "correct drafts per verify step = accepted drafts / verify steps; position i = steps accepting at least i drafts / steps",
    "output throughput = output tokens / measured window (first request sent to last ended), summed over runs; "
    "decode throughput = tokens after each first chunk / time while any stream decodes",
)


def render(report: Report) -> str:
    lines = [
        _title(report),
        "",
        _audit_line(report),
        "",
        *([*gates.markdown(report.gate), ""] if report.gate is not None else []),
        *_compared(report),
        *_outputs(report),
        *_pooled(report),
        "",
        *_per_seed(report),
        "",
        *_positions(report),
        "### Setup",
        "",
        *_setup(report),
        "",
        "### Protocol",
        "",
        *_protocol(report),
        "",
        "Full report (audit details, per run, latency, acceptance per position, figures): [report.md](report.md)",
    ]
    return no_raw_html(portable_paths("\n".join(_wrap(lines)).rstrip() + "\n"))  # user text holds no HTML


ABSOLUTE = re.compile(r"(?<![\w.~/-])/(?:[\w.+@-]+/)*[\w.+@-]+")
HOME = re.compile(r"^/(?:home/[^/]+|Users/[^/]+|root)(?=/|$)")
ANCHORS = ("/.venv/", "/venv/", "/site-packages/")  # a path shown from the first of these on


def portable(path: str) -> str:
    """An absolute path of the author's machine in a form that names no machine: from the virtual environment or
    site-packages on (`.venv/bin/python`), `~/...` under a home folder, else its last part (report.md keeps it)."""
    for anchor in ANCHORS:
        if anchor in path:
            return path[path.index(anchor) + 1 :]
    if HOME.match(path):
        return HOME.sub("~", path)
    return path.rsplit("/", 1)[-1] or path


def portable_paths(text: str) -> str:
    """pr.md with every absolute path made portable (interpreters, repositories, snapshot PYTHONPATHs, models)."""
    return ABSOLUTE.sub(lambda m: portable(m.group(0)), text)


def _wrap(lines: list[str]) -> list[str]:
    """Bullets and prose longer than MAX_LINE wrapped; table rows are kept whole."""
    out = []
    for line in lines:
        if len(line) <= MAX_LINE or line.startswith("|"):
            out.append(line)
            continue
        indent = "  " if line.startswith("- ") else ""
        out += textwrap.wrap(line, MAX_LINE, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return out


def _title(report: Report) -> str:
    """The title names the two sides: each arm by what distinguishes it (its ref and commit, or its interpreter,
    where those differ), and an A/A as an A/A."""
    first = report.data.campaigns[0]
    others = [a for a in report.arms if a != report.baseline]
    if not others:
        return f"## {escape_text(first.experiment)}: `{report.baseline}` alone (no other arm: nothing is compared)"
    diff = escape_text(first.meta.get("declared_difference") or "no declared difference")
    named = ", ".join(_side(report, a) for a in others)
    if first.aa:
        return f"## {escape_text(first.experiment)}: A/A of {named} and {_side(report, report.baseline)} (the noise floor: {diff})"
    return f"## {escape_text(first.experiment)}: {named} vs {_side(report, report.baseline)} ({diff})"


def _declared(report: Report) -> dict[str, dict[str, Any]]:
    return {str(a.get("name")): a for c in report.data.campaigns for a in c.arms}


def _side(report: Report, arm: str) -> str:
    """An arm in the title: its name, and its ref and commit (a source arm) or its interpreter (an arm with its own)."""
    decl = _declared(report).get(arm, {})
    src = decl.get("source") or {}
    if src:
        return f"`{arm}` (ref `{src.get('ref')}` = `{str(src.get('commit'))[:12]}`)"
    if decl.get("python"):
        return f"`{arm}` (`{decl.get('python')}`)"
    return f"`{arm}`"


STAT_LINES = 25  # lines of a `git diff --stat` shown in pr.md (its summary line always)


def _compared(report: Report) -> list[str]:
    """What each side ran, where the arms differ in code: refs, commits, dirty flags and `git diff --stat`, or the
    interpreters and the packages that differ between them. Nothing for arms of one install (their commands say)."""
    decl = _declared(report)
    codes = firsts(run_codes(report.data))
    if not any((decl.get(a) or {}).get("source") or (decl.get(a) or {}).get("python") for a in report.arms):
        return []
    out = ["What was compared:", ""]
    for arm in report.arms:
        d, code = decl.get(arm, {}), codes.get(arm) or {}
        src = d.get("source") or {}
        where = code.get("checkout") or {}
        if src:
            uncommitted = (
                " (the checkout's files as they were, uncommitted ones included)"
                if src.get("ref") == "WORKTREE"
                else ""
            )
            out.append(
                f"- `{arm}`: `{src.get('repo')}` ref `{src.get('ref')}` = commit `{src.get('commit')}`{uncommitted}"
            )
        else:
            dirty = (
                f", dirty checkout (diff sha256 `{str(where.get('diff_sha256'))[:12]}`)"
                if where.get("dirty")
                else ", clean checkout"
                if where
                else ""
            )
            python = d.get("python") or code.get("executable") or "the harness's own"
            out.append(f"- `{arm}`: interpreter `{python}`, {describe(code or None)}{dirty}")
    for arm, stat in (report.data.campaigns[0].meta.get("source_diff_stat") or {}).items():
        lines = str(stat).splitlines()
        shown = (
            lines
            if len(lines) <= STAT_LINES + 1
            else [*lines[:STAT_LINES], f" ... {len(lines) - 1 - STAT_LINES} more files", lines[-1]]
        )
        out += ["", f"`git diff --stat` from `{report.baseline}`'s commit to `{arm}`'s:", "", "```", *shown, "```"]
    differ = package_differences(codes)
    if differ:
        out += [
            "",
            "Packages that differ between the arms' interpreters: "
            + "; ".join(f"{n} " + ", ".join(f"`{a}` {v}" for a, v in versions.items()) for n, versions in differ),
        ]
    return [*out, ""]


def _audit_line(report: Report) -> str:
    audit = report.audit
    warned = [c.name for c in audit.checks if c.status == "warn"]
    tail = f"; warnings: {'; '.join(warned)}" if warned else ""
    if audit.passed:
        return f"**Audit: passed** ({len(audit.checks)} checks over the raw records{tail})."
    failed = "; ".join(c.name for c in audit.failed)
    return f"**Audit: FAILED** ({len(audit.failed)} of {len(audit.checks)} checks: {failed}{tail}); do not trust these figures."


def _outputs(report: Report) -> list[str]:
    """Output identity in a line (and the first differing requests when identity was expected)."""
    if not report.outputs:
        return []
    expect = report.data.campaigns[0].expect
    head = "**Outputs**" + (" (expected identical: `experiment.expect: identical_outputs`)" if expect else "")
    out = [f"{head}: " + "; ".join(i.line() for i in report.outputs) + ".", ""]
    if expect:
        listed = [f"- `{i.arm}` vs `{i.baseline}`: {d}" for i in report.outputs for d in i.differing]
        out += [*listed, ""] if listed else []
    return out


def headline(report: Report) -> pd.DataFrame:
    """The seeds' pooled rows: metric, each arm's value and each other arm's change with its interval, as the
    report's own cells (pr.md's table, and what `make bench` ends with on the terminal)."""
    others = [a for a in report.arms if a != report.baseline]
    shown = report.tables.pooled_display.set_index("Metric")
    names = labels(report.data.campaigns[0].meta.get("max_new_tokens"))
    rows = []
    for metric, label in {**POOLED_ROWS, **COUNT_ROWS}.items():
        if names[metric] not in shown.index:
            continue  # not recorded (the server's CPU time before 2026-12-06)
        values = shown.loc[names[metric]].tolist()[: len(report.arms)]  # the report's own cells
        changes = [report.comparison.get("pooled", "all", metric, a) if metric in POOLED_ROWS else None for a in others]
        cells = [_change(c) if metric in POOLED_ROWS else "" for c in changes]
        marked = any(c is not None and c.flagged for c in changes)
        rows.append([f"{label} {FOREIGN_MARK}" if marked else label, *values, *cells])
    cols = ["Metric", *report.arms, *[f"{a} vs {report.baseline} [95% CI]" for a in others]]
    return pd.DataFrame(rows, columns=cols)


def _pooled(report: Report) -> list[str]:
    out = table(headline(report)).rstrip("\n").split("\n")
    model = str(first_manifest(report, report.baseline)[1].get("model_path") or "")
    if model.startswith("embedded:"):  # (a preset: exact integer weights and a made-up vocabulary)
        out += [
            "",
            f"Boxed score: `{model}` is the embedded server's synthetic model; its tokens are drawn from a made-up "
            "distribution, so it cannot answer: a score of 0 is expected and says nothing about accuracy (a real "
            "model: `make bench-real`).",
        ]
    note = foreign_note(report)
    return [*out, "", note] if note else out


FOREIGN_MARK = "†"  # a headline row whose change pairs a run taken under foreign load


def foreign_note(report: Report) -> str | None:
    """The line under the headline table when a row is marked FOREIGN_MARK: which run pairs ran under foreign
    load; None when none did."""
    others = [a for a in report.arms if a != report.baseline]
    changes = {a: report.comparison.get("pooled", "all", "throughput", a) for a in others}
    flagged = [
        f"{c.flagged} of {c.n} `{a}` vs `{report.baseline}` run pairs" for a, c in changes.items() if c and c.flagged
    ]
    if not flagged:
        return None
    return (
        f"{FOREIGN_MARK} **Foreign load** in {'; '.join(flagged)} (report.md, 'Runs taken on a quiet machine'): "
        "their throughput changes may measure other work."
    )


def _change(c: Change | None) -> str:
    """The report's change cell, its foreign-load tail left to the line under the table."""
    return fmt_change(replace(c, flagged=0) if c is not None else None)


def _per_seed(report: Report) -> list[str]:
    shown = report.tables.per_seed_display
    if shown.empty:
        return ["(no per-seed table: no base seeds)"]
    keep = [
        "Seed",
        *[f"{a} AL" for a in report.arms],
        *[f"{a} tok/s" for a in report.arms],
        *[f"{a} correct" for a in report.arms],
    ]
    return table(shown[keep]).rstrip("\n").split("\n")


def _positions(report: Report) -> list[str]:
    """Acceptance per draft position: each arm's rate and the change with its interval (none without
    histograms)."""
    acc = report.acceptance
    if acc is None:
        return []
    shown = [a for a in report.arms if a in acc.rates]  # an arm without drafts has no rates
    if not shown:
        return []
    others = [a for a in shown if a in acc.changes]
    rows = [
        [str(i + 1), *(fmt_num(acc.rates[a][i], 4) for a in shown), *(fmt_change(acc.changes[a][i]) for a in others)]
        for i in range(acc.gamma)
    ]
    cols = ["Draft position", *shown, *[f"{a} vs {report.baseline} [95% CI]" for a in others]]
    head = "Acceptance per draft position (verify steps that accepted at least i drafts / verify steps):"
    tail = [f"({', '.join(f'`{a}`' for a in acc.no_drafts)}: n/a: no drafts)"] if acc.no_drafts else []
    return [head, "", *table(pd.DataFrame(rows, columns=cols)).rstrip("\n").split("\n"), *tail, ""]


def _setup(report: Report) -> list[str]:
    fields = dict(VERSION_FIELDS)
    hardware = []
    for label in ("GPU", "host CPU", "cores", "platform"):
        values = sorted(
            {
                str(fields[label](m))
                for a in report.arms
                for m in arm_manifests(report, a)
                if fields[label](m) is not None
            }
        )
        if values:
            hardware.append(f"{label} {', '.join(values)}")
    out = [f"- hardware: {'; '.join(hardware) or 'not recorded'}"]
    run_id, man = first_manifest(report, report.baseline)
    if man:
        out.append(f"- model: `{man.get('model_path')}`")
        out.append(
            f"- server (`{report.baseline}`, port and seed masked): `{shell(normalise(man.get('command') or [], run_id, man.get('base_seed')))}`"
        )
    sources = {a.get("name"): a.get("source") for c in report.data.campaigns for a in c.arms}
    for d in report.audit.arm_diffs:
        same = (
            "the same command; the code differs (below)"
            if sources.get(d.arm) != sources.get(d.baseline)
            else "identical (A/A)"
        )
        what = "; ".join([str(h) for h in d.hunks] + [f"env {e}" for e in d.env]) or same
        status = "as declared" if d.clean else "UNDECLARED differences"
        out.append(f"- `{d.arm}` vs `{d.baseline}` ({status}): {d.note or what}")
    codes = firsts(run_codes(report.data))
    for arm in report.arms:
        if arm in codes:
            out.append(f"- code of `{arm}`: {describe(codes[arm])}")
    differ = package_differences(codes)
    if codes:
        out.append(
            f"- packages that differ between the arms' interpreters: {', '.join(n for n, _ in differ) or 'none'}"
        )
    return out


def _intervals(report: Report) -> str:
    """How the intervals were made, as they were: the throughputs' t-interval only where there were enough pairs."""
    head = f"intervals: 95%; paired bootstrap over items (AL, drafts per step, positions; none below {MIN_ITEMS} items)"
    pairs = [
        c
        for a in report.arms
        if a != report.baseline
        if (c := report.comparison.get("pooled", "all", "throughput", a)) is not None
    ]
    if pairs and all(c.has_interval for c in pairs):
        return head + ", t-interval over run pairs (throughputs)"
    n = min((c.n for c in pairs), default=0)
    return head + (
        f"; throughputs: no interval ({n} run pair(s); a t-interval needs {MIN_PAIRS}, so their change is "
        "the pairs' geometric mean with the range of the pair ratios)"
    )


def _protocol(report: Report) -> list[str]:
    c = report.data.campaigns[0]
    w = c.meta.get("workload") or {}
    cfg: dict[str, Any] = c.meta.get("config") or {}
    exp = cfg.get("experiment") or {}
    warm = exp.get("warmup") or {}
    out = [f"- workload `{w.get('name')}` (`{w.get('dataset_id')}`), {len(c.items)} items, SHA-256 `{w.get('sha256')}`"]
    if cfg.get("sampling") is not None:
        out.append(f"- sampling `{json.dumps(cfg['sampling'], sort_keys=True)}`")
    order = " (the arms' order alternates by seed)" if exp.get("order") == "alternate" else ""
    seeds = (
        "each request seeded: base seed + its item's offset"
        if exp.get("seeded_requests", True)
        else "requests not seeded"
    )
    flush = ", then the cache flushed" if warm.get("flush_cache") else ""
    out.append(
        f"- base seeds {exp.get('base_seeds')}, repeats {exp.get('repeats')}, order `{exp.get('order')}`{order}; "
        f"{seeds}; concurrency {c.meta.get('concurrency')}; warmup {warm.get('requests')} requests of "
        f"{warm.get('max_new_tokens')} tokens per run{flush}"
    )
    out += [f"- {line}" for line in (*METRIC_LINES, _intervals(report))]
    return out
