"""How much work topk_fused's finish does on each logit family, counted on a CPU (no GPU, no Triton): per row, the
keys at or above the floor among the k largest groups (the candidates), and the iterations of the tile merge's
repeated maximum (`for i in range(placed, total)` in harness/verify/topk_fused.py's _finish_row), modelled in
numpy with the kernel's rules: groups ranked by (maximum descending, index ascending), tiles of TILE logits in that
order, a tile's merge starting after the running top's ranks that beat every key of the tile; and those of the
other merge (REPLACE 1: `for _ in range(enter)`, a tile's keys above the running top's least, at most k).

On an H200 the sparse finish kernel took about 100 us plus 2.5 us per merge iteration of a row at 4096 rows x
248,320 ids (lab/results/verify-step-h200-sparse/profile_sparse_fefff33.log): this count says which
families a new finish must handle better. From the repository root:

    python lab/scripts/count_merge_steps.py [families, comma-separated; default all ten] [vocab] [top_k]

The real families (smollm2, gemma3) take their rows from the first logit bank harness.micro.bank finds (the
committed tests/fixtures/logit_bank from the repository root).
"""

import sys

import numpy as np
import torch

from harness.micro import bank
from harness.micro.families import FAMILIES, make_family
from harness.verify.topk_fused import group_size, launch_config

ROWS = 64
ALL = "iid,clustered,sorted,lm_like,padding,heavy_tail,peaked,bf16,smollm2,gemma3"


def row_counts(row: np.ndarray, k: int, group: int, tile_groups: int) -> tuple[int, int, int]:
    """(candidates, merge iterations, REPLACE merge iterations) of one fp32 row."""
    n_groups = -(-len(row) // group)
    padded = np.full(n_groups * group, -np.inf, np.float32)
    padded[: len(row)] = row
    maxima = padded.reshape(n_groups, group).max(axis=1)
    order = np.lexsort((np.arange(n_groups), -maxima))[:k]  # by maximum descending, then group index
    kth, last = maxima[order[-1]], (order[-1] + 1) * group - 1  # the floor: the k-th group's maximum, at its end
    top: list[tuple[float, int]] = []
    candidates = iterations = replace = 0
    for start in range(0, len(order), tile_groups):
        keys = []
        for g in order[start : start + tile_groups]:
            values, ids = padded[g * group : (g + 1) * group], np.arange(g * group, (g + 1) * group)
            keep = (values > kth) | ((values == kth) & (ids <= last))
            keys += list(zip(values[keep].tolist(), (-ids[keep]).tolist(), strict=True))  # lower id ranks first
        candidates += len(keys)
        total = min(len(top) + len(keys), k)
        placed = 0
        if start > 0:
            placed = total if not keys else min(sum(key > max(keys) for key in top), total)
        iterations += total - placed
        replace += min(sum(key > top[-1] for key in keys) if len(top) == k else len(keys), k)
        top = sorted(top + keys, reverse=True)[:k]
    return candidates, iterations, replace


def main() -> None:
    families = (sys.argv[1] if len(sys.argv) > 1 else ALL).split(",")
    vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 248_320
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    cfg = launch_config(vocab, sparse=True)
    group = group_size(vocab, cfg["GROUPS"])
    tile_groups = max(1, cfg["TILE"] // group)
    print(f"{ROWS} rows x {vocab:,} ids, top_k {k}, groups of {group}, tiles of {tile_groups * group} logits")
    for name in families:
        model = FAMILIES[name].bank
        rows = bank.load_rows(bank.find_bank(None), model)[0] if model else None
        x = make_family(name, ROWS, vocab, seed=0, device=torch.device("cpu"), bank_rows=rows).float().numpy()
        counts = np.array([row_counts(row, k, group, tile_groups) for row in x])
        print(
            f"{name:11s} candidates: median {int(np.median(counts[:, 0])):5d}, max {counts[:, 0].max():5d};"
            f" merge iterations: median {int(np.median(counts[:, 1])):3d}, max {counts[:, 1].max():3d};"
            f" REPLACE: median {int(np.median(counts[:, 2])):3d}, max {counts[:, 2].max():3d}"
        )


if __name__ == "__main__":
    main()
