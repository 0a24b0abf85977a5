"""Build the A/B report of one or more campaigns: `python -m analysis.report RESULTS_DIR [...]`.

Python API:
    report = build_report(["results/exp/campaign"])   # pure: reads files, writes nothing
    report.tables.pooled, report.tables.per_seed, report.audit.passed, report.markdown ...
    write_report(report, out_dir)                      # report.md, pr.md, summary.json, figures/*.png
    main(["results/exp/campaign"])                     # the CLI; returns the exit status
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from analysis import gate as gates
from analysis import markdown, plots, positions, pr, summary
from analysis.audit import run_audit
from analysis.compare import POWER_CHANGES, compare, item_based, power_table
from analysis.load import CampaignDir, InputError, load
from analysis.memory import report_memory
from analysis.metrics import report_arm_order, start
from analysis.model import Report
from analysis.outputs import check_outputs, compare_outputs
from analysis.seals import banner, check_seals, verify_seals
from analysis.selection import Mismatch, metadata_mismatches, pick
from analysis.stats import MIN_PAIRS_FOR_SD
from analysis.tables import build, fmt_pairs
from analysis.verdict import verdict

DEFAULT_BOOTSTRAP = 2000
DEFAULT_BOOTSTRAP_SEED = 0
EXIT_OK, EXIT_AUDIT_FAILED, EXIT_REFUSED = gates.EXIT_PASSED, gates.EXIT_AUDIT_FAILED, gates.EXIT_USAGE
STEP_SUMMARY = "GITHUB_STEP_SUMMARY"  # GitHub Actions' step summary file: pr.md is appended to it when set


class MismatchError(Exception):
    """Runs to be compared differ in checked metadata (and --allow-mismatch was not given)."""

    def __init__(self, mismatches: list[Mismatch]):
        self.mismatches = mismatches
        lines = "\n".join(f"  - {m}" for m in mismatches)
        super().__init__(
            "refusing to compare runs whose checked metadata differ:\n"
            + lines
            + "\nRerun with --allow-mismatch to compare them anyway (the report will say so)."
        )


def build_report(
    paths: list[str | Path],
    *,
    allow_mismatch: bool = False,
    n_boot: int = DEFAULT_BOOTSTRAP,
    bootstrap_seed: int = DEFAULT_BOOTSTRAP_SEED,
    force_slow_reader: bool = False,
    allow_edited: bool = False,
    gate: Sequence[gates.GateRule] = (),
) -> Report:
    """Read, audit and analyse the campaigns under `paths` (with report_memory()'s allocation settings), and apply
    the `gate` rules (analysis.gate) when given. Raises InputError or MismatchError. `allow_edited`: records changed
    since their run sealed them warn (and every output carries a banner) instead of failing the audit."""
    if n_boot < 1 or bootstrap_seed < 0:
        raise InputError(
            f"--bootstrap must be >= 1, got {n_boot}"
            if n_boot < 1
            else f"--bootstrap-seed must be >= 0, got {bootstrap_seed}"
        )
    with report_memory():
        return _build(paths, allow_mismatch, n_boot, bootstrap_seed, force_slow_reader, allow_edited, gate)


def _build(
    paths: list[str | Path],
    allow_mismatch: bool,
    n_boot: int,
    bootstrap_seed: int,
    force_slow_reader: bool,
    allow_edited: bool,
    rules: Sequence[gates.GateRule] = (),
) -> Report:
    data = load(paths, force_slow=force_slow_reader)
    if not allow_mismatch:
        check_one_experiment(data.campaigns, paths)
    mismatches = metadata_mismatches(data)
    if mismatches and not allow_mismatch:
        raise MismatchError(mismatches)
    baseline = data.campaigns[0].baseline or (data.campaigns[0].arm_names or [""])[0]
    arms = report_arm_order(data, baseline)
    picked = pick(data)
    # side by side (numpy's and pandas' loops release the GIL): the checks and the ITL from the start, then,
    # as soon as this thread has the request tables, the rest of the metrics, the per-position bootstrap and
    # (here) the comparison's bootstraps over items, which need nothing else; each reads the loaded data only,
    # so the results do not depend on the order
    with ThreadPoolExecutor(max_workers=4) as pool:
        audit_job = pool.submit(run_audit, data, picked, arms, baseline, mismatches, allow_mismatch)
        requests, metrics_job = start(data, picked, arms, baseline, pool)
        positions_job = pool.submit(positions.compute, data, picked.selection.used, requests, n_boot, bootstrap_seed)
        outputs_job = pool.submit(compare_outputs, data, picked.selection.used, arms, baseline)
        items = item_based(requests, n_boot, bootstrap_seed)
        metrics = metrics_job.result()
        comparison = compare(metrics, n_boot, bootstrap_seed, items)
        audit, by_position, outputs = audit_job.result(), positions_job.result(), outputs_job.result()
    audit.checks.append(check_outputs(outputs, data.campaigns[0].expect))
    seals = verify_seals(data)
    audit.checks.append(check_seals(seals, allow_edited))
    tables = build(metrics, comparison, data.campaigns[0].meta.get("max_new_tokens"), len(data.campaigns) > 1)
    report = Report(
        inputs=[Path(p) for p in paths],
        data=data,
        arms=arms,
        baseline=baseline,
        audit=audit,
        metrics=metrics,
        comparison=comparison,
        tables=tables,
        figures=plots.figure_specs(metrics, by_position),
        n_boot=n_boot,
        bootstrap_seed=bootstrap_seed,
        power=power_table(metrics),
        acceptance=by_position,
        outputs=outputs,
        edited=banner(seals) if seals.changed and allow_edited else None,
    )
    if rules:
        figures = gates.figures_from(rules, comparison, report.power, arms, baseline)
        report.gate = gates.evaluate(rules, figures, baseline, audit.passed, [c.name for c in audit.failed])
    top = f"> **{report.edited}**\n\n" if report.edited else ""
    report.markdown = top + markdown.render(report)
    report.pr = top + pr.render(report)
    return report


def check_one_experiment(campaigns: list[CampaignDir], paths: list[str | Path]) -> None:
    """InputError, briefly, when the inputs hold campaigns of several experiments (a whole results/ folder, say):
    the campaigns found, by experiment, and which folder to give instead."""
    by_experiment: dict[str, list[str]] = {}
    for camp in campaigns:
        by_experiment.setdefault(camp.experiment, []).append(str(camp.path))
    if len(by_experiment) < 2:
        return
    lines = [
        f"  {name}: {', '.join(found[:2])}" + (f" and {len(found) - 2} more" if len(found) > 2 else "")
        for name, found in sorted(by_experiment.items())
    ]
    raise InputError(
        f"{', '.join(map(str, paths))} holds {len(campaigns)} campaigns of {len(by_experiment)} experiments; a "
        "report compares the campaigns of one experiment. Give one experiment's folder (or one campaign's):\n"
        + "\n".join(lines)
        + "\n(--allow-mismatch merges them anyway)"
    )


def default_out_dir(paths: list[str | Path]) -> Path:
    """Next to the campaign: the single input directory, else the inputs' common parent."""
    if len(paths) == 1:
        return Path(paths[0])
    return Path(os.path.commonpath([str(Path(p).resolve()) for p in paths]))


def write_report(report: Report, out_dir: str | Path) -> list[Path]:
    """Write report.md, pr.md, summary.json and figures/*.png under `out_dir`; returns the files written."""
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)  # both folders first: one that cannot be made stops the
    # call before any file is written
    md, short, doc = out / "report.md", out / "pr.md", out / "summary.json"
    md.write_text(report.markdown)
    short.write_text(report.pr)
    doc.write_text(json.dumps(summary.summary(report), indent=2, sort_keys=False) + "\n")
    return [md, short, doc, *plots.render(report.metrics, out / "figures", report.acceptance, report.data.runs)]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis.report",
        description=(
            "Audit and compare the arms of speculative-decoding campaigns from their raw records, and write "
            "report.md (with figures/*.png), pr.md (the short summary for a pull request) and summary.json (the "
            "figures as data, docs/summary.md) next to the campaign. RESULTS_DIR is a campaign directory (it holds "
            "campaign.json) or a directory holding campaigns; campaigns of the same experiment are merged when "
            "their checked metadata (GPU model, model path, dataset SHA256, harness version, arms) match."
        ),
        epilog=(
            "exit status: 0 report written and the audit passed (or failed, with --no-strict), and every --fail-on "
            "rule passed; 1 report written but the audit failed (the report says FAILED at its top; with --fail-on "
            "always, --no-strict or not); 2 usage: nothing written (a bad option or --fail-on rule, unreadable input, "
            "an unwritable output folder, or checked metadata differ without --allow-mismatch); 3 the gate failed (a "
            "--fail-on rule's 95%% interval lies entirely beyond its threshold); 4 the gate is inconclusive (an "
            "interval holds a threshold, or there is none: too few run pairs or items). docs/gate.md. "
            "The same files always give a byte-identical report."
        ),
    )
    p.add_argument(
        "results_dirs", nargs="+", metavar="RESULTS_DIR", help="campaign directory, or a directory of campaigns"
    )
    p.add_argument(
        "--strict",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="exit with status 1 when any audit check fails (the default); --no-strict: exit 0 once the "
        "report is written, whose top still says the audit FAILED",
    )
    p.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare runs even when their checked metadata differ (the audit flags it)",
    )
    p.add_argument(
        "--allow-edited",
        action="store_true",
        help="report records changed since their run sealed them (edited, truncated, deleted) instead of failing "
        "the audit; every output (terminal, report.md, pr.md, summary.json) then says so in a banner",
    )
    p.add_argument("--out", metavar="PATH", help="write report.md and figures/ here instead of next to the campaign")
    p.add_argument(
        "--pr",
        action="store_true",
        help="print pr.md (the short summary a pull request carries) to standard output; write nothing",
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        default=DEFAULT_BOOTSTRAP,
        metavar="N",
        help=f"bootstrap resamples for the 95%% intervals (default {DEFAULT_BOOTSTRAP})",
    )
    p.add_argument(
        "--bootstrap-seed",
        type=int,
        default=DEFAULT_BOOTSTRAP_SEED,
        metavar="S",
        help=f"seed of the bootstrap and permutation draws (default {DEFAULT_BOOTSTRAP_SEED})",
    )
    p.add_argument(
        "--fail-on",
        action="append",
        default=[],
        type=gate_rule,
        metavar="RULE",
        help="a regression gate rule, repeatable: 'METRIC < -X%%' fails when the change's 95%% interval lies "
        "entirely below -X%%, 'METRIC > +X%%' entirely above (e.g. 'acceptance_length < -1%%', 'throughput < -3%%', "
        f"'cpu_per_token > +3%%'); metrics: {', '.join(gates.GATE_METRICS)}. Exit 3 failed, 4 inconclusive",
    )
    p.add_argument(
        "--junit",
        metavar="FILE",
        help="with --fail-on: write a JUnit XML file, one test case per gated metric and arm (and the audit)",
    )
    return p


def gate_rule(text: str) -> gates.GateRule:
    """argparse's type for --fail-on: a bad rule is a usage error naming it and the metrics."""
    try:
        return gates.parse_gate_rule(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    """The CLI. Returns the exit status (see `--help`); never raises for bad input."""
    return run_cli(argv)[0]


def run_cli(argv: list[str] | None = None) -> tuple[int, Report | None]:
    """The CLI's work: (exit status, the report, or None when nothing was written)."""
    p = parser()
    args = p.parse_args(argv)
    if args.junit and not args.fail_on:
        p.error("--junit writes the gate's verdicts: give at least one --fail-on RULE")
    try:
        report = build_report(
            args.results_dirs,
            allow_mismatch=args.allow_mismatch,
            n_boot=args.bootstrap,
            bootstrap_seed=args.bootstrap_seed,
            allow_edited=args.allow_edited,
            gate=args.fail_on,
        )
    except (InputError, MismatchError) as err:
        print(f"analysis.report: {err}", file=sys.stderr)
        return EXIT_REFUSED, None
    if args.pr:
        if report.edited:
            print(report.edited, file=sys.stderr)
        print(report.pr, end="")
        if report.gate is not None:
            return gate_outputs(report, args.junit), report
        failed = args.strict and not report.audit.passed
        return (EXIT_AUDIT_FAILED if failed else EXIT_OK), report
    out_dir = Path(args.out) if args.out else default_out_dir(args.results_dirs)
    try:
        written = write_report(report, out_dir)
    except OSError as err:
        print(
            f"analysis.report: cannot write the report to {out_dir} ({err.strerror or err}); "
            "give a writable folder with --out PATH",
            file=sys.stderr,
        )
        return EXIT_REFUSED, None
    figures = [p for p in written if p.suffix == ".png"]
    print(f"wrote {written[0]}" + (f" and {len(figures)} figure(s) in {figures[0].parent}" if figures else ""))
    print(f"wrote {written[1]} (the summary for a pull request) and {written[2]} (the figures as data)")
    if report.edited:
        print(report.edited)
    if report.audit.passed:
        print(f"audit: {verdict(report.audit)}")
    else:
        names = "; ".join(c.name for c in report.audit.failed)
        print(
            f"AUDIT FAILED: {names} (details at the top of {written[0]})"
            + ("" if args.strict or report.gate is not None else "; exit 0 (--no-strict)"),
            file=sys.stderr,
        )
        for check in report.audit.failed:  # what each found, in a line (the files an edit changed, say)
            print(f"  {check.name}: {check.summary}", file=sys.stderr)
    try:
        append_step_summary(report)
    except OSError as err:
        print(f"analysis.report: cannot append pr.md to ${STEP_SUMMARY} ({err})", file=sys.stderr)
        return EXIT_REFUSED, report
    if report.gate is not None:
        return gate_outputs(report, args.junit), report
    if report.audit.passed:
        return EXIT_OK, report
    return (EXIT_AUDIT_FAILED if args.strict else EXIT_OK), report


def gate_outputs(report: Report, junit: str | None) -> int:
    """The gate's verdict on the terminal, in the JUnit file and in the CI step summary; its exit status (usage when
    a file cannot be written)."""
    assert report.gate is not None
    for line in report.gate.lines():
        print(line, file=sys.stderr if report.gate.exit_code else sys.stdout)
    try:
        if junit:
            gates.junit(report.gate).write(junit, encoding="utf-8", xml_declaration=True)
            print(f"wrote {junit} (JUnit, one test case per gated metric)")
    except OSError as err:
        print(f"analysis.report: cannot write the JUnit file {junit} ({err}); give a writable path", file=sys.stderr)
        return EXIT_REFUSED
    return report.gate.exit_code


def append_step_summary(report: Report) -> None:
    """pr.md (its gate verdict first) appended to $GITHUB_STEP_SUMMARY, when set (GitHub Actions)."""
    where = os.environ.get(STEP_SUMMARY)
    if where:
        with open(where, "a", encoding="utf-8") as out:
            out.write(report.pr + "\n")


POWER_NAMES = {
    "throughput": "throughput",
    "decode_tps": "decode tok/s",
    "acceptance_length": "acceptance length",
    "cpu_per_token": "server CPU/token",
}


def power_summary(report: Report) -> list[str]:
    """The power in one line per arm (the terminal's; report.md has each figure's interval): run pairs needed to
    see a 1%, 2%, 5% change at 80% power, per metric."""
    out = []
    for arm, rows in report.power.groupby("arm", sort=False):
        parts, few = [], []
        for r in rows.itertuples():
            name = POWER_NAMES.get(str(r.metric), str(r.metric))
            if r.sd_log_ratio != r.sd_log_ratio:
                few.append(name)
                continue
            counts = " / ".join(fmt_pairs(getattr(r, f"pairs_for_{round(c * 100)}pct")) for c in POWER_CHANGES)
            parts.append(f"{name} {counts}")
        pairs = int(rows["pairs"].max()) if len(rows) else 0
        head = f"power, {arm} vs {report.baseline} (run pairs for a {' / '.join(f'{round(c * 100)}%' for c in POWER_CHANGES)} change at 80% power, from {pairs} pair(s))"
        if parts:
            out.append(f"{head}: {'; '.join(parts)}" + (f"; {', '.join(few)}: too few pairs" if few else ""))
        else:
            out.append(f"{head}: at least {MIN_PAIRS_FOR_SD} pairs are needed to estimate the run-to-run SD")
    return out


def cli() -> None:
    """The `specbench-report` command."""
    raise SystemExit(main())


if __name__ == "__main__":
    cli()
