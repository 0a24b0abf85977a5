"""An independent recomputation of a llama.cpp campaign's published figures, from its raw files with pandas alone
(not the project's analysis module): per arm, acceptance length (sum completion_tokens / sum spec_verify_ct),
correct drafts per step, output throughput (sum of a run's measured tokens / its span, pooled as sum of tokens /
sum of spans), per-run sums against the manifest's /metrics deltas, and greedy output identity between the arms.
Compares them with the campaign's summary.json; exit 1 on any difference.

    python lab/scripts/recompute_llamacpp.py results/published/<set>/<campaign> [...]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

REL = 1e-9


def campaign_frame(root: Path) -> pd.DataFrame:
    frames = []
    for path in sorted(root.glob("runs/*/records.jsonl")):
        frame = pd.read_json(path, lines=True)
        frame["proposed"] = [m.get("spec_num_proposed_drafts") for m in frame["meta_info"]]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def check(root: Path) -> list[str]:
    summary = json.loads((root / "summary.json").read_text())
    rec = campaign_frame(root)
    measured = rec[~rec["warmup"]]
    problems, lines = [], []
    per_arm = measured.groupby("arm").agg(
        ct=("completion_tokens", "sum"), vct=("spec_verify_ct", "sum"), ncd=("spec_num_correct_drafts", "sum")
    )
    spans = measured.groupby(["arm", "run_id"]).agg(
        ct=("completion_tokens", "sum"), t0=("t_sent", "min"), t1=("t_end", "max")
    )
    spans["span"] = spans["t1"] - spans["t0"]
    tput = spans.groupby("arm").apply(lambda g: g["ct"].sum() / g["span"].sum(), include_groups=False)
    mine = {
        "acceptance_length": per_arm["ct"] / per_arm["vct"],
        "correct_drafts_per_step": per_arm["ncd"] / per_arm["vct"],
        "throughput": tput,
    }
    for key, values in mine.items():
        for arm, value in values.items():
            theirs = summary["pooled"][key]["values"][arm]
            same = math.isclose(value, theirs, rel_tol=REL, abs_tol=1e-12)
            lines.append(
                f"{root.name} {key} {arm}: recomputed {value:.6f}, published {theirs:.6f} "
                f"{'equal' if same else 'DIFFERENT'}"
            )
            if not same:
                problems.append(lines[-1])
    for path in sorted(root.glob("runs/*/manifest.json")):
        man = json.loads(path.read_text())
        run = measured[measured["run_id"] == man["run_id"]]
        delta = man["server_counters"]["delta"]
        for col, counter in (
            ("completion_tokens", "tokens_predicted_total"),
            ("proposed", "spec_decode_num_draft_tokens_total"),
            ("spec_num_correct_drafts", "spec_decode_num_accepted_tokens_total"),
        ):
            if run[col].sum() != delta[counter]:
                problems.append(f"{man['run_id']}: sum {col} {run[col].sum()} != /metrics {counter} {delta[counter]}")
    texts = measured.pivot_table(index=["base_seed", "item_id"], columns="arm", values="output_text", aggfunc="first")
    differing = int((texts.nunique(axis=1) > 1).sum())
    lines.append(
        f"{root.name}: {len(texts)} paired requests, {differing} with differing output text across arms; "
        f"per-run sums vs /metrics deltas: {sum('!=' in p for p in problems)} mismatch(es)"
    )
    if differing:
        problems.append(f"{root.name}: {differing} paired requests differ in output")
    print("\n".join(lines))
    return problems


def main(paths: list[str]) -> int:
    problems = [p for path in paths for p in check(Path(path))]
    print("recomputation:", "AGREES with the published figures" if not problems else f"{len(problems)} problem(s)")
    for p in problems:
        print("  ", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
