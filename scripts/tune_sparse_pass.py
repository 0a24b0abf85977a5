"""Launch configurations of topk_fused's kernels in their sparse mode (run_sparse: the pass reads the logits and
writes nothing), against one read of the logits timed in the same rounds. scripts/profile_sparse_step.py showed
the pass at about 1.6x the read with the dense mode's configuration (1,024-logit blocks, 4 warps: a million
4 KB programs at 4096 rows); this tries bigger blocks and more warps per program, and how a block appends
(SPARSE_APPEND). (tune_stream.log in results/published/verify-step-h200-sparse was made with
a streaming first pass, a few programs per multiprocessor each loading its next block before scanning the
current one; no better than `base`, it was taken out again.)

Per vocabulary and family, 4096 rows, top_k 20, top_p 0.95, T 1: the median ms of 15 interleaved rounds of each
configuration and of the read floor (harness.micro.measure.time_interleaved: each round in a seeded shuffled
order; the logs of 2026-12-03 were made with a fixed order, the script's own loop then), and whether each
configuration's entries equal the first's in the rows both wrote (the kept sets do not depend on the launch),
with the count of rows a configuration left to the caller (logs before tune_chunk.log compared whole outputs).
Prints a table and writes $OUT/$LOG (default tune_sparse_pass.log). On a CUDA host:

    python scripts/tune_sparse_pass.py [vocabs, comma-separated] [families, comma-separated] [configurations]

(configurations: names of CONFIGS, comma-separated; default all; `base` is always timed first. Each
overrides topk_fused.launch_config(vocab, sparse=True), the defaults for the vocabulary, which changed between
the published logs: each log's header says what its `base` was.)
"""

import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.micro import measure  # noqa: E402
from harness.micro.families import make_family  # noqa: E402
from harness.verify import topk_fused  # noqa: E402

CONFIGS = {
    "base": {},
    "b2048w4": {"PASS_BLOCK": 2048, "PASS_WARPS": 4},
    "b2048w8": {"PASS_BLOCK": 2048, "PASS_WARPS": 8},
    "b4096w8": {"PASS_BLOCK": 4096, "PASS_WARPS": 8},
    "b4096w16": {"PASS_BLOCK": 4096, "PASS_WARPS": 16},
    "b8192w16": {"PASS_BLOCK": 8192, "PASS_WARPS": 16},
    # how a block appends its logits above t (topk_fused.launch_config's SPARSE_APPEND)
    "skip": {"SPARSE_APPEND": 1},
    "skip_b2048": {"SPARSE_APPEND": 1, "PASS_BLOCK": 2048},
    "loop": {"SPARSE_APPEND": 2},
    "loop_b2048": {"SPARSE_APPEND": 2, "PASS_BLOCK": 2048},
    # the first round's pass without the loop (PASS_LOOP 0) or without software pipelining (PASS_STAGES 1)
    "noloop": {"PASS_LOOP": 0},
    "stages1": {"PASS_STAGES": 1},
    "noloop_stages1": {"PASS_LOOP": 0, "PASS_STAGES": 1},
    "noloop_loop_b2048": {"PASS_LOOP": 0, "SPARSE_APPEND": 2, "PASS_BLOCK": 2048},
    "noloop_loop": {"PASS_LOOP": 0, "SPARSE_APPEND": 2},
    # the start kernel's samples: the same count in runs of 16 (64 bytes), or half as many
    "noloop_chunk16": {"PASS_LOOP": 0, "CHUNK": 16},
    "noloop_samples4096": {"PASS_LOOP": 0, "SAMPLES": 4096},
    # the start kernel's warps (8 by default)
    "start_w4": {"START_WARPS": 4},
    "start_w16": {"START_WARPS": 16},
    # the start kernel's sampled runs: 4, 8, 16 or 32 contiguous logits per place (16 by default since b79fec9, 8
    # before: the logs' chunk16 column was then the variant), the same count
    "chunk4": {"CHUNK": 4},
    "chunk8": {"CHUNK": 8},
    "chunk16": {"CHUNK": 16},
    "chunk32": {"CHUNK": 32},
    # a missed row's next threshold in the finish kernel: its samples read in pieces of PIECE (1,024 by default,
    # rank x 8 dependent reads at 248,320 ids), by FINISH_WARPS warps (2 by default)
    "w8": {"FINISH_WARPS": 8},
    "piece8192_w8": {"PIECE": 8192, "FINISH_WARPS": 8},
    "piece8192_w4": {"PIECE": 8192, "FINISH_WARPS": 4},
    "piece2048_w4": {"PIECE": 2048, "FINISH_WARPS": 4},
    "rank4_piece8192_w8": {"FIRST_RANK": 4, "PIECE": 8192, "FINISH_WARPS": 8},
}
# the first threshold's rank among the samples fixed for every row, 3 to 12 (0, the default: rank_table's; for
# top_k 20 rule 1, both modes' today, gives 5, 6, 6 at 248,320, 151,936, 32,000, rule 0 gave 5, 9, 10), with the
# sample runs of 8 (rankR, the layout of the logs before b79fec9) and of 16 logits (chunk16_rankR, today's CHUNK)
CONFIGS.update({f"rank{r}": {"CHUNK": 8, "FIRST_RANK": r} for r in range(3, 13)})
CONFIGS.update({f"chunk16_rank{r}": {"CHUNK": 16, "FIRST_RANK": r} for r in range(3, 13)})


def taken(left: torch.Tensor | None, rows: int) -> torch.Tensor:
    """The rows run_sparse wrote (not left to the caller), as a mask."""
    mask = torch.ones(rows, dtype=torch.bool, device="cuda")
    if left is not None:
        mask[left] = False
    return mask


def cell(family: str, vocab: int, configs: dict, rows: int = 4096) -> str:
    x = make_family(family, rows, vocab, seed=0, device=torch.device("cuda"))
    t, k, p = (torch.ones(rows, device="cuda"), torch.full((rows,), 20, device="cuda"),
               torch.full((rows,), 0.95, device="cuda"))
    calls = {n: (lambda x, c=c: topk_fused.run_sparse(x, t, k, p, c)[0]) for n, c in configs.items()}
    calls["read"] = lambda x: x.amax(dim=-1)
    ref_values, ref_ids, ref_left = topk_fused.run_sparse(x, t, k, p)
    notes = []
    for name, c in configs.items():
        values, ids, left = topk_fused.run_sparse(x, t, k, p, c)
        both = taken(ref_left, rows) & taken(left, rows)  # rows left to the caller hold nothing: not compared
        if not (torch.equal(values[both], ref_values[both]) and torch.equal(ids[both], ref_ids[both])):
            notes.append(f"{name}:DIFFERS")
        if left is not None:
            notes.append(f"{name}: {len(left)} rows left to the caller")
    times = measure.time_interleaved(calls, [x], warmup=2, repeats=15)
    med = {n: statistics.median(ms) for n, ms in times.items()}
    floor = med["read"]
    cells = " | ".join(f"{med[n]:.3f} ({med[n] / floor:.2f}x)" for n in configs)
    return f"| {family} | {vocab:,} | {floor:.3f} | {cells} | {', '.join(notes) or 'all equal'} |"


def main() -> None:
    vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "248320,151936,32000").split(",")]
    families = (sys.argv[2] if len(sys.argv) > 2 else "iid,clustered,sorted,bf16,padding,lm_like").split(",")
    names = ["base"] + [n for n in (sys.argv[3].split(",") if len(sys.argv) > 3 else CONFIGS) if n != "base"]
    configs = {n: CONFIGS[n] for n in names}
    lines = [f"{torch.cuda.get_device_name()}: run_sparse ms (x the read floor), 4096 rows, median of 15 rounds",
             "| family | vocab | read | " + " | ".join(configs) + " | entries |",
             "|---|---:|---:|" + "---:|" * len(configs) + "---|"]
    for vocab in vocabs:
        for family in families:
            lines.append(cell(family, vocab, configs))
            print(lines[-1], flush=True)
    name = os.environ.get("LOG", "tune_sparse_pass.log")
    (Path(os.environ.get("OUT", ".")) / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
