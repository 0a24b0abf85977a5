"""The report step after a campaign (or, in a sweep, after every job has ended): the analysis report of the
campaign folder through the analysis API (`build_report`, `write_report`), and what the terminal ends with: the
power in a line per metric, the audit's verdict, the headline table (each arm and each change with its interval)
and where the files are. This is the one module of the runner that imports the analysis."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from analysis.model import Report


def report_campaign(campaign_dir: Path, console: Console, strict: bool, gate: list[str] | None = None) -> int:
    """Build and write the campaign's report, and say what it found; the exit code: non-zero when the report could
    not be written or (strict) its audit failed; with `gate` rules (experiment.gate), the gate's exit status
    (analysis.gate: 1 audit failed, 3 failed, 4 inconclusive)."""
    from analysis.load import InputError  # noqa: PLC0415  (heavy imports, after the runs)
    from analysis.report import MismatchError, build_report  # noqa: PLC0415
    from analysis.report import write_report as write_files  # noqa: PLC0415
    from harness.contract import parse_gate_rule  # noqa: PLC0415

    try:
        report = build_report([campaign_dir], gate=[parse_gate_rule(r) for r in gate or []])
    except (InputError, MismatchError) as err:
        console.print(f"[bold red]the report of {campaign_dir} failed:[/] {err}", soft_wrap=True)
        return 2
    try:
        written = write_files(report, campaign_dir)
    except OSError as err:
        console.print(
            f"[bold red]cannot write the report to {campaign_dir}[/] ({err.strerror or err}); "
            f"`make report DIR={campaign_dir} ARGS='--out PATH'` writes it elsewhere",
            soft_wrap=True,
        )
        return 2
    print_answer(report, written, console, strict)
    if report.gate is not None:
        for line in report.gate.lines():
            console.print(line, highlight=False, markup=False, soft_wrap=True)
        return report.gate.exit_code
    return 0 if report.audit.passed or not strict else 1


def print_answer(report: Report, written: list[Path], console: Console, strict: bool = True) -> None:
    """Power (short), the audit's verdict, the headline table, the paths: the terminal ends with the answer."""
    from analysis.pr import foreign_note, headline  # noqa: PLC0415
    from analysis.report import power_summary  # noqa: PLC0415
    from analysis.verdict import verdict  # noqa: PLC0415

    for line in power_summary(report):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    audit = report.audit
    if audit.passed:
        console.print(f"[bold green]audit:[/] {verdict(audit)}", highlight=False, soft_wrap=True)
    else:
        exit_note = "exit 1 (strict_audit=false keeps exit 0)" if strict else "exit 0 (strict_audit=false)"
        console.print(
            f"[bold red]AUDIT FAILED[/]: {'; '.join(c.name for c in audit.failed)} (details at the top of "
            f"{written[0]}); do not trust these figures; {exit_note}",
            soft_wrap=True,
        )
        for check in audit.failed:
            console.print(f"  {check.name}: {check.summary}", highlight=False, markup=False, soft_wrap=True)
    for ident in report.outputs:
        console.print(f"outputs: {ident.line()}", highlight=False, soft_wrap=True)
    frame = headline(report)
    first = report.data.campaigns[0]
    table = Table(
        title=f"{'A/A' if first.aa else 'A/B'}: {first.experiment} (pooled over all seeds)", title_justify="left"
    )
    for i, col in enumerate(frame.columns):
        table.add_column(str(col), justify="left" if i == 0 else "right", overflow="fold")
    for row in frame.itertuples(index=False):
        table.add_row(*(str(v) for v in row))
    console.print(table)
    if note := foreign_note(report):
        console.print(note.replace("**", "").replace("`", ""), highlight=False, markup=False, soft_wrap=True)
    figures = [p for p in written if p.suffix == ".png"]
    root = written[0].parent
    console.print(
        f"[bold]report:[/] {written[0]}\n[bold]for the PR:[/] {written[1]}\n[bold]as data:[/] {written[2]}"
        + (f"\n[bold]figures:[/] {figures[0].parent}/" if figures else "")
        + f"\n[bold]records:[/] {root}/runs/*/records.jsonl",
        highlight=False,
        soft_wrap=True,
    )


def write_sweep_tables(sweep_dir: Path, roots: list[Path], console: Console) -> None:
    """Per experiment with two or more finished campaigns in the sweep: sweep-<experiment>.md, one row
    per campaign (analysis.sweep), printed too."""
    from analysis.sweep import sweep_markdown  # noqa: PLC0415  (heavy imports)

    by_experiment: dict[str, list[Path]] = {}
    for root in sorted(set(roots)):
        if (root / "campaign.json").is_file():
            by_experiment.setdefault(root.parent.name, []).append(root)
    for experiment, group in by_experiment.items():
        if len(group) < 2:
            continue
        text = sweep_markdown(group)
        out = sweep_dir / f"sweep-{experiment}.md"
        out.write_text(text)
        console.print(text, highlight=False, markup=False, soft_wrap=True)
        console.print(f"[bold green]sweep table:[/] {out}")
