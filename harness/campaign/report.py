"""The report step after a campaign (or, in a sweep, after every job has ended): the analysis report of
the campaign folder, the power lines it prints, and the exit code it implies."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console


def write_report(campaign_dir: Path, console: Console, strict: bool) -> int:
    """The analysis report of the campaign (it prints where it wrote); its exit code, non-zero when the
    report could not be written or (strict) its audit failed."""
    from analysis.report import EXIT_AUDIT_FAILED, power_lines, run_cli  # noqa: PLC0415  (heavy imports)

    code, report = run_cli([str(campaign_dir), "--strict" if strict else "--no-strict"])
    for line in power_lines(report) if report is not None else []:
        console.print(line, highlight=False, markup=False)
    if code == EXIT_AUDIT_FAILED:
        console.print(f"[bold red]the audit of {campaign_dir} failed[/] (see the top of its report.md); exit 1 "
                      "(strict_audit=false keeps exit 0)")
    elif code:
        console.print(f"[bold red]the report of {campaign_dir} failed (exit code {code}); see above[/]")
    return code
