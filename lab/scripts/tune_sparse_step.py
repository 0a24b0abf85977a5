"""The whole sparse verify step (harness.verify.sparse.verify_step, fused=True) under launch-configuration variants,
with and without the host's bound on top_k (max_top_k, SGLang's sampling_info.max_top_k: no synchronisation when
the kernels take every row), against one read of the logits and the sparse builder alone (topk_fused.run_sparse,
the default configuration), timed in the same rounds (harness.micro.measure.time_interleaved, the microbenchmark's
method: CUDA events, each call on the GPU as the previous one left it, or QUEUED_MS behind a GPU busy-wait).

Per vocabulary and family: 512 steps x 8 positions = 4096 rows, top_k 20, top_p 0.95, T 1, point-mass drafts (the
argmax of each position), block verification, the median ms of REPEATS (default 15) rounds; every variant's tokens
compared with the first variant's (a line says DIFFERS otherwise). The real families take their rows from the first
logit bank harness.micro.bank finds. Prints each cell and writes $OUT/$LOG (default tune_sparse_step.log):

    python lab/scripts/tune_sparse_step.py [vocabs] [families] [variants]   (comma-separated; variants: names of VARIANTS)
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
from harness.verify.sparse import verify_step  # noqa: E402

STEPS, GAMMA, TOP_K = 512, 7, 20
# name -> (launch_config overrides, the host's bound on top_k or None). Each names every key it relies on, so that
# the variant does not change with the defaults; `default` is launch_config's own.
_OLD = {"FUSE": 0, "CHUNKS": 1, "HALVING": 0, "REPLACE": 0, "SUPER": 0, "VERIFY": 0}  # 0374ea8's sparse default
_ALL = {"FUSE": 0, "CHUNKS": 4, "HALVING": 0, "REPLACE": 1, "SUPER": 8, "VERIFY": 0}
VARIANTS: dict[str, tuple[dict[str, int], int | None]] = {
    "default": ({}, TOP_K),
    "default_sync": ({}, None),
    "old_sync": (_OLD, None),
    "old": (_OLD, TOP_K),
    "super8": ({**_OLD, "SUPER": 8}, TOP_K),
    "super8_v": ({**_OLD, "SUPER": 8, "VERIFY": 1}, TOP_K),
    "fused_v": ({**_OLD, "FUSE": 1, "SUPER": 8, "VERIFY": 1}, TOP_K),
    "fused_rs_v": ({**_OLD, "FUSE": 1, "REPLACE": 1, "SUPER": 8, "VERIFY": 1}, TOP_K),
    "all_sync": (_ALL, None),
    "all": (_ALL, TOP_K),
    "all_v": ({**_ALL, "VERIFY": 1}, TOP_K),
    "all_h": ({**_ALL, "HALVING": 1}, TOP_K),
    "all_h_v": ({**_ALL, "HALVING": 1, "VERIFY": 1}, TOP_K),
    "c3_h_v": ({**_ALL, "CHUNKS": 3, "HALVING": 1, "VERIFY": 1}, TOP_K),
    "c5_h_v": ({**_ALL, "CHUNKS": 5, "HALVING": 1, "VERIFY": 1}, TOP_K),
    "c2_v": ({**_ALL, "CHUNKS": 2, "VERIFY": 1}, TOP_K),
}


def cell(family: str, vocab: int, names: list[str], queued_ms: float, repeats: int) -> str:
    rows = STEPS * (GAMMA + 1)
    model = FAMILIES[family].bank
    bank_rows = bank.load_rows(bank.find_bank(None) or Path("tests/fixtures/logit_bank"), model)[0] if model else None
    x = make_family(family, rows, vocab, seed=0, device=torch.device("cuda"), bank_rows=bank_rows)
    t, k, p = (
        torch.ones(rows, device="cuda"),
        torch.full((rows,), TOP_K, device="cuda"),
        torch.full((rows,), 0.95, device="cuda"),
    )
    drafts = x.view(STEPS, GAMMA + 1, vocab)[:, :GAMMA].argmax(dim=-1)
    u = torch.rand(STEPS, GAMMA + 1, generator=torch.Generator().manual_seed(2)).cuda()

    def step(name: str):
        config, bound = VARIANTS[name]
        return lambda x: (
            verify_step(
                x, t, k, p, drafts, None, block=True, fused=True, uniforms=u, max_top_k=bound, config=config
            ).tokens
        )

    calls = {n: step(n) for n in names}
    calls["run_sparse"] = lambda x: topk_fused.run_sparse(x, t, k, p)[0]
    calls["read"] = lambda x: x.amax(dim=-1)
    ref = calls[names[0]](x)
    notes = [f"{n}:DIFFERS" for n in names[1:] if not torch.equal(calls[n](x), ref)]
    times = measure.time_interleaved(calls, [x], warmup=2, repeats=repeats, queued_ms=queued_ms)
    med = {n: statistics.median(ms) for n, ms in times.items()}
    floor = med["read"]
    cells = " | ".join(f"{med[n]:.3f} ({med[n] / floor:.2f}x)" for n in [*names, "run_sparse"])
    return f"| {family} | {vocab:,} | {floor:.3f} | {cells} | {', '.join(notes) or 'all equal'} |"


def main() -> None:
    vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "248320,262144,151936,32000").split(",")]
    families = (sys.argv[2] if len(sys.argv) > 2 else "iid,clustered,lm_like,smollm2,gemma3").split(",")
    names = (sys.argv[3] if len(sys.argv) > 3 else ",".join(VARIANTS)).split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"tune_sparse_step: unknown variant(s) {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
    if not torch.cuda.is_available():
        sys.exit("tune_sparse_step: needs a CUDA device")
    queued_ms = float(os.environ.get("QUEUED_MS", "0"))
    repeats = int(os.environ.get("REPEATS", "15"))
    timing = f"each call queued behind a {queued_ms:g} ms GPU wait" if queued_ms else "each call on an idle GPU"
    lines = [
        f"{torch.cuda.get_device_name()}: verify_step(fused=True) ms (x the read floor), {STEPS} steps x "
        f"{GAMMA + 1} rows, top_k {TOP_K}, median of {repeats} rounds, {timing}; variants (launch_config "
        "overrides, max_top_k): "
        + "; ".join(f"{n}={VARIANTS[n]}" for n in names)
        + f"; run_sparse = the builder alone with launch_config; defaults: dense {topk_fused.DENSE_RANGES}, "
        f"sparse {topk_fused.SPARSE_RANGES}",
        "| family | vocab | read | " + " | ".join([*names, "run_sparse"]) + " | tokens |",
        "|---|---:|---:|" + "---:|" * (len(names) + 1) + "---|",
    ]
    out = Path(os.environ.get("OUT", ".")) / os.environ.get("LOG", "tune_sparse_step.log")
    for vocab in vocabs:
        for family in families:
            lines.append(cell(family, vocab, names, queued_ms, repeats))
            print(lines[-1], flush=True)
            out.write_text("\n".join(lines) + "\n")
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
