"""Why the verify-step microbenchmark times sparse_fused 0.1-0.2 ms above lab/scripts/profile_sparse_step.py: per
family, the microbenchmark's cell (harness.micro.verify_step.paths, 4096 rows, the same drafts and coins) timed
three ways in interleaved rounds (median of 15): all paths together (the microbenchmark), sparse_fused with the
read floor alone, and those two with dense_topk_fused. Prints one line per family and way. On a CUDA host, from
the repository root:

    PYTHONPATH=. python lab/scripts/probe_micro_gap.py [families, comma-separated] [vocab]
"""

import statistics
import sys
from pathlib import Path

import torch

from harness.micro import measure
from harness.micro import verify_step as vs
from harness.micro.inputs import rotated_copies

STEPS, GAMMA = 512, 7
BANK = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "logit_bank"
WAYS = {
    "all": None,
    "sparse_fused+read": ["sparse_fused", "read_floor"],
    "with dense_topk_fused": ["sparse_fused", "read_floor", "dense_topk_fused"],
}


def main() -> None:
    families = (sys.argv[1] if len(sys.argv) > 1 else "iid,lm_like,sorted").split(",")
    vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 248_320
    for fam in families:
        x, drafts, coins = vs.cell_inputs(fam, vocab, STEPS, GAMMA, torch.device("cuda"), BANK)
        calls = vs.paths(STEPS, GAMMA, drafts, coins)
        inputs = rotated_copies(x, 256 * 2**20)
        for way, names in WAYS.items():
            timed = {n: calls[n] for n in (names or calls)}
            med = {
                n: statistics.median(t)
                for n, t in measure.time_interleaved(timed, inputs, warmup=3, repeats=15).items()
            }
            cells = ", ".join(f"{n} {m:.3f}" for n, m in med.items())
            print(
                f"{fam} {vocab:,} [{way}]: {cells}; sparse_fused / read {med['sparse_fused'] / med['read_floor']:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
