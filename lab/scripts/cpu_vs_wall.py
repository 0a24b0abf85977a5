"""How much less the server's CPU time per output token moves than its wall-clock throughput, over identical campaigns
on a shared machine (docs/figures.md, "CPU time per token against wall throughput under foreign load").

Per campaign (each already reported: summary.json beside campaign.json), the pooled change of every non-baseline arm
in output throughput and in server CPU time per output token, with their 95% intervals, and the run-to-run SD of the
per-pair log ratios (the same pairs, recomputed from the manifests and records); the machine's load average and the
foreign CPU share of each run from its manifest. Prints a markdown table; writes cpu_vs_wall.png to $OUT (default:
the current folder).

    python lab/scripts/cpu_vs_wall.py results/published/cpu_vs_wall_2cpu_20261206/embedded_block_vs_token/fig-*
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METRICS = {"throughput": "output throughput (wall)", "cpu_per_token": "server CPU time per output token"}


def runs(root: Path) -> list[dict]:
    """Per finished run: arm, base seed, measured tokens, its window, server CPU s, load average, foreign CPU share."""
    out = []
    for path in sorted(root.glob("runs/*/manifest.json")):
        man = json.loads(path.read_text())
        if man["status"] != "finished":
            continue
        recs = [json.loads(x) for x in (path.parent / "records.jsonl").read_text().splitlines() if x.strip()]
        measured = [r for r in recs if not r["warmup"]]
        tokens = sum(r["completion_tokens"] or 0 for r in measured)
        window = max(r["t_end"] for r in measured) - min(r["t_sent"] for r in measured)
        machine = man["machine"]
        out.append(
            {
                "arm": man["arm"],
                "seed": man["base_seed"],
                "throughput": tokens / window,
                "cpu_per_token": man["server_cpu"]["cpu_s"] / tokens,
                "load1": (machine["before"] or {}).get("load_avg", [math.nan])[0],
                "foreign": (machine["during"] or {}).get("cpu_other_frac", math.nan),
            }
        )
    return out


def pair_sd(rows: list[dict], baseline: str, metric: str) -> float:
    """SD of log(B/A) over the run pairs (one per base seed)."""
    by = {(r["arm"], r["seed"]): r[metric] for r in rows}
    logs = [math.log(by[(a, s)] / by[(baseline, s)]) for (a, s) in by if a != baseline and (baseline, s) in by]
    return statistics.stdev(logs) if len(logs) > 1 else math.nan


def campaign(root: Path) -> dict:
    doc = json.loads((root / "summary.json").read_text())
    base = doc["baseline"]
    (arm,) = [a for a in doc["arms"] if a != base]
    rows = runs(root)
    out = {"name": root.name, "arm": arm, "baseline": base, "runs": len(rows)}
    for metric in METRICS:
        change = doc["pooled"][metric]["changes"][arm]
        out[metric] = (change["estimate"], change["lo"], change["hi"], change["n"])
        out[f"{metric}_sd"] = pair_sd(rows, base, metric)
    loads = [r["load1"] for r in rows]
    foreign = [r["foreign"] for r in rows]
    out["load"] = (min(loads), statistics.median(loads), max(loads))
    out["foreign"] = (min(foreign), statistics.median(foreign), max(foreign))
    return out


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def spread(values: list[float]) -> str:
    return f"{statistics.stdev(values) * 100:.1f} points" if len(values) > 1 else "n/a (one campaign)"


def table(found: list[dict]) -> str:
    lines = [
        "| campaign | runs | load avg 1 min before runs (min / median / max) | foreign CPU share (median) | "
        "throughput change [95% CI] | its pair SD | CPU/token change [95% CI] | its pair SD |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in found:
        t, k = c["throughput"], c["cpu_per_token"]
        lines.append(
            f"| {c['name']} | {c['runs']} | {c['load'][0]:.2f} / {c['load'][1]:.2f} / {c['load'][2]:.2f} | "
            f"{c['foreign'][1]:.0%} | {pct(t[0])} [{pct(t[1])}, {pct(t[2])}] | {c['throughput_sd'] * 100:.1f}% | "
            f"{pct(k[0])} [{pct(k[1])}, {pct(k[2])}] | {c['cpu_per_token_sd'] * 100:.1f}% |"
        )
    for metric, label in METRICS.items():
        est = [c[metric][0] for c in found]
        lines.append(
            f"\n{label}: change estimates {', '.join(pct(e) for e in est)}; range {pct(min(est))} to {pct(max(est))} "
            f"({(max(est) - min(est)) * 100:.1f} points), SD over campaigns {spread(est)}"
        )
    return "\n".join(lines)


def plot(found: list[dict], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(8.5, 3.4))
    for i, metric in enumerate(METRICS):
        for j, c in enumerate(found):
            est, lo, hi, _ = c[metric]
            y = i + (j - (len(found) - 1) / 2) * 0.12
            if lo is not None and hi is not None:
                ax.plot([lo * 100, hi * 100], [y, y], color=f"C{i}", lw=2)
            ax.plot([est * 100], [y], "o", color=f"C{i}")
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_ylim(-0.5, len(METRICS) - 0.5)
    ax.set_yticks(range(len(METRICS)), [v.replace(" per ", "\nper ").replace(" (", "\n(") for v in METRICS.values()])
    ax.set_xlabel(
        f"change of {found[0]['arm']} vs {found[0]['baseline']} (%): estimate and 95% interval, one per campaign"
    )
    ax.set_title(f"{len(found)} identical campaigns on a shared 2-core VM")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
    found = [campaign(Path(p)) for p in argv]
    print(table(found))
    out = Path(os.environ.get("OUT", ".")) / "cpu_vs_wall.png"
    plot(found, out)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
