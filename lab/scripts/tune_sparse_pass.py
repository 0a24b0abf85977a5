"""Launch configurations of topk_fused's kernels in their sparse mode (run_sparse: the pass reads the logits and
writes nothing), against one read of the logits timed in the same rounds. lab/scripts/profile_sparse_step.py showed
the pass at about 1.6x the read with the dense mode's configuration (1,024-logit blocks, 4 warps: a million
4 KB programs at 4096 rows); CONFIGS tries other blocks, warps, tiles and group counts. (The logs in
lab/results/verify-step-h200-sparse before tune_groups_sparse.log timed the earlier design, a sampled
threshold and retries, whose configuration keys were others: SPARSE_APPEND, CHUNK, FIRST_RANK, PIECE, ...;
tune_stream.log was made with a streaming first pass, no better than its `base`, taken out again.)

Per vocabulary and family, 4096 rows, top_k 20, top_p 0.95, T 1: the median ms of 15 interleaved rounds of each
configuration and of the read floor (harness.micro.measure.time_interleaved: each round in a seeded shuffled
order; the logs of 2026-12-03 were made with a fixed order, the script's own loop then), and whether each
configuration's entries equal the first's in the rows both wrote (the kept sets do not depend on the launch),
with the count of rows a configuration left to the caller (logs before tune_chunk.log compared whole outputs).
QUEUED_MS (default 0: each call starts on an idle GPU) queues each timed call behind a GPU busy-wait of that many ms
(measure.time_interleaved's queued_ms, the host's launches hidden). The real families (smollm2, gemma3) take
their rows from the first logit bank harness.micro.bank finds (the committed tests/fixtures/logit_bank).
Prints a table and writes $OUT/$LOG (default tune_sparse_pass.log). On a CUDA host:

    python lab/scripts/tune_sparse_pass.py [vocabs, comma-separated] [families, comma-separated] [configurations]

(configurations: names of CONFIGS, comma-separated; default all; `base` is always timed first. Each
overrides topk_fused.launch_config(vocab, sparse=True), the defaults for the vocabulary, which changed between
the published logs: each log's header says what its `base` was.)
"""

import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.micro import bank, measure  # noqa: E402
from harness.micro.families import FAMILIES, make_family  # noqa: E402
from harness.verify import topk_fused  # noqa: E402

CONFIGS = {
    "base": {},
    # the finish (`base`: a kernel of its own after the pass, one warp a row, 512-logit tiles): TILE logits merged
    # at a time, GROUPS group maxima a row at most, FINISH_WARPS warps, or in the row's last pass program (FUSE 1).
    # (tune_sparse_placed*.log named the then 1,024-logit default `base` and 512-logit tiles `t512`, `w2t512`.)
    "t1024": {"TILE": 1024},
    "t2048": {"TILE": 2048},
    "g512": {"GROUPS": 512},
    "g2048": {"GROUPS": 2048},
    "fused": {"FUSE": 1},
    "fused_w2": {"FUSE": 1, "PASS_WARPS": 2},
    "w2": {"FINISH_WARPS": 2},
    "w2g2048": {"FINISH_WARPS": 2, "GROUPS": 2048},
    # the pass: PASS_BLOCK logits a program, PASS_WARPS warps
    "b4096w8": {"PASS_BLOCK": 4096, "PASS_WARPS": 8},
    "b8192w8": {"PASS_BLOCK": 8192, "PASS_WARPS": 8},
    "b1024": {"PASS_BLOCK": 1024},
    # the finish beside the pass: rows in CHUNKS slices, each slice's finish on a high-priority side stream once
    # its pass is done; REPLACE: the merge that puts each entering key in place of the top's least (iterations:
    # the keys that enter, not k minus the ranks kept; lab/scripts/count_merge_steps.py counts both)
    "c2": {"CHUNKS": 2},
    "c4": {"CHUNKS": 4},
    "c8": {"CHUNKS": 8},
    "replace": {"REPLACE": 1},
    "replace_c4": {"REPLACE": 1, "CHUNKS": 4},
    # SUPER: the group pick in two rounds (the k largest super-groups of 8 groups, then the k largest groups among
    # theirs), 146 instructions a round of k where one round over all groups is 295 (lab/scripts/sass_loops.py)
    "super8": {"SUPER": 8},
    "replace_super8": {"REPLACE": 1, "SUPER": 8},
    "all": {"REPLACE": 1, "SUPER": 8, "CHUNKS": 4},
}


def taken(left: torch.Tensor | None, rows: int) -> torch.Tensor:
    """The rows run_sparse wrote (not left to the caller), as a mask."""
    mask = torch.ones(rows, dtype=torch.bool, device="cuda")
    if left is not None:
        mask[left] = False
    return mask


def cell(family: str, vocab: int, configs: dict, queued_ms: float, rows: int = 4096) -> str:
    model = FAMILIES[family].bank
    bank_rows = bank.load_rows(bank.find_bank(None), model)[0] if model else None
    x = make_family(family, rows, vocab, seed=0, device=torch.device("cuda"), bank_rows=bank_rows)
    t, k, p = (
        torch.ones(rows, device="cuda"),
        torch.full((rows,), 20, device="cuda"),
        torch.full((rows,), 0.95, device="cuda"),
    )
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
    times = measure.time_interleaved(calls, [x], warmup=2, repeats=15, queued_ms=queued_ms)
    med = {n: statistics.median(ms) for n, ms in times.items()}
    floor = med["read"]
    cells = " | ".join(f"{med[n]:.3f} ({med[n] / floor:.2f}x)" for n in configs)
    return f"| {family} | {vocab:,} | {floor:.3f} | {cells} | {', '.join(notes) or 'all equal'} |"


def main() -> None:
    vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "248320,151936,32000").split(",")]
    families = (sys.argv[2] if len(sys.argv) > 2 else "iid,clustered,sorted,bf16,padding,lm_like").split(",")
    names = ["base"] + [n for n in (sys.argv[3].split(",") if len(sys.argv) > 3 else CONFIGS) if n != "base"]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        sys.exit(f"tune_sparse_pass: unknown configuration(s) {', '.join(unknown)}; valid: {', '.join(CONFIGS)}")
    configs = {n: CONFIGS[n] for n in names}
    queued_ms = float(os.environ.get("QUEUED_MS", "0"))
    timing = f"each call queued behind a {queued_ms:g} ms GPU wait" if queued_ms else "each call on an idle GPU"
    lines = [
        f"{torch.cuda.get_device_name()}: run_sparse ms (x the read floor), 4096 rows, median of 15 rounds, "
        f"{timing}; base = {topk_fused.launch_config(0, sparse=True)}",
        "| family | vocab | read | " + " | ".join(configs) + " | entries |",
        "|---|---:|---:|" + "---:|" * len(configs) + "---|",
    ]
    for vocab in vocabs:
        for family in families:
            lines.append(cell(family, vocab, configs, queued_ms))
            print(lines[-1], flush=True)
    name = os.environ.get("LOG", "tune_sparse_pass.log")
    (Path(os.environ.get("OUT", ".")) / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
