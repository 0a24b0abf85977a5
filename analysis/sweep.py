"""A table over the campaigns of a sweep (`-m client.concurrency=1,8,32`, `make perf`): one row per campaign,
named by the settings that differ between the campaigns; per arm its pooled output throughput and
acceptance length, and each arm's throughput over the baseline's. Every figure is the campaign report's
own (analysis.report), recomputed from the records.

    python -m analysis.sweep results/embedded_perf/<campaign> [...] [--out sweep.md]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.load import InputError
from analysis.model import Report
from analysis.report import MismatchError, build_report
from analysis.tables import fmt_num
from harness.contract import read_json, unmeasured, with_added_keys


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists are kept whole (compared as values)."""
    if not isinstance(config, dict):
        return {prefix.rstrip("."): config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(flatten(value, f"{prefix}{key}."))
    return out


def swept_keys(configs: list[dict[str, Any]]) -> list[str]:
    """The dotted keys whose values differ between the campaigns' configs; lists (argv, seeds) only when no
    single value differs (an argv that interpolates a swept value differs with it)."""
    flat = [flatten(with_added_keys(c)) for c in configs]  # (a key added since: its neutral value where absent)
    keys = sorted({k for f in flat for k in f})
    # (unmeasured: settings that never change what is measured, where the campaigns were written among them)
    differ = [k for k in keys if not unmeasured(k) and len({repr(f.get(k)) for f in flat}) > 1]
    scalar = [k for k in differ if not any(isinstance(f.get(k), list) for f in flat)]
    return scalar or differ


def sweep_row(report: Report, keys: list[str], config: dict[str, Any]) -> dict[str, str]:
    """One campaign: its swept settings, per arm tok/s (AL), and throughput over the baseline's."""
    flat = flatten(config)
    pooled = report.tables.pooled
    row = {k: str(flat.get(k)) for k in keys}
    base = float(pooled.at["throughput", report.baseline])
    for arm in report.arms:
        tps, al = float(pooled.at["throughput", arm]), float(pooled.at["acceptance_length", arm])
        row[f"{arm} tok/s (AL)"] = fmt_num(tps, 1) + (f" ({fmt_num(al, 2)})" if math.isfinite(al) else "")
        if arm != report.baseline:
            row[f"{arm} / {report.baseline}"] = f"{tps / base:.2f}x" if base > 0 and math.isfinite(tps) else "n/a"
    row["audit"] = "passed" if report.audit.passed else "FAILED"
    return row


def sweep_table(roots: list[Path]) -> pd.DataFrame:
    """The table over `roots` (campaign folders), ordered by the swept settings as numbers where they are."""
    configs = [read_json(r / "campaign.json").get("config") or {} for r in roots]
    keys = swept_keys(configs)
    rows = [sweep_row(build_report([r]), keys, c) for r, c in zip(roots, configs, strict=True)]
    frame = pd.DataFrame(rows)

    def order(value: str) -> tuple[int, float | str]:
        try:
            return (0, float(value))
        except ValueError:
            return (1, value)

    if keys:
        frame = frame.sort_values(keys, key=lambda col: col.map(order)).reset_index(drop=True)
    return frame


def sweep_markdown(roots: list[Path]) -> str:
    frame = sweep_table(roots)
    lines = [
        "# Sweep",
        "",
        f"{len(roots)} campaign(s): " + ", ".join(f"`{r.parent.name}/{r.name}`" for r in roots),
        "",
        frame.to_markdown(index=False, disable_numparse=True),
        "",
        "tok/s: output tokens over the run's measured window, summed over the arm's runs (each campaign's "
        "report, 'Output throughput'); AL: completion tokens per verify step, pooled over the arm's "
        "requests; X / baseline: the ratio of the two pooled throughputs of one campaign.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("campaigns", nargs="+", type=Path, help="campaign folders (each holds campaign.json)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the table (default: print only)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.campaigns if not (p / "campaign.json").is_file()]
    if missing:
        print(f"analysis.sweep: not a campaign folder (no campaign.json): {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        text = sweep_markdown(args.campaigns)
    except (InputError, MismatchError) as exc:
        print(f"analysis.sweep: {exc}", file=sys.stderr)
        return 2
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
