"""What any Triton builder pays over the copy floor at small vocabularies: the microbenchmark's copy floor (torch's
copy into a preallocated fp32 output) against copies that a builder could make, timed the microbenchmark's way
(harness.micro.measure.time_interleaved: CUDA events around each call, interleaved seeded rounds, rotated inputs).

At 4096 rows, fp32 logits, per vocabulary:
- `copy`: the floor, `out.copy_(x)` into a preallocated tensor;
- `torch_alloc`: a fresh output (torch.empty) and the copy, what a builder that returns its output pays at least;
- `triton_copy`: a fresh output and a Triton kernel that copies a 2,048-logit block per program (4 warps): the least
  a Triton builder pays, its launch included;
- `triton_prep`: the same with topk_fused's other host work before its launch (the group maxima and the zeroed
  status words allocated, its launch arguments);
- `fused_nosync`: topk_fused's kernel without the synchronisation that reads the rows left to the caller (none
  are, here): its device time where the host's work is hidden;
- `topk_fused`: the builder (top_k 20, top_p 0.95, T 1, iid rows).

Writes $OUT/probe_triton_floor.log (default: the current folder). From the repository root on a CUDA host:

    python lab/scripts/probe_triton_floor.py [VOCAB ...]
"""

import os
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.micro import measure  # noqa: E402
from harness.verify import builders, topk_fused  # noqa: E402

ROWS, BLOCK, REPEATS = 4096, 2048, 20


@triton.jit
def _copy(src, dst, maxes, status, temp, top_k, top_p, n_rows, vocab, BLOCK: tl.constexpr):
    """Program (row, block): the block's logits into the fp32 output (the other arguments: a builder's, unused)."""
    blocks = tl.cdiv(vocab, BLOCK)
    row = tl.program_id(0) // blocks
    offs = (tl.program_id(0) % blocks) * BLOCK + tl.arange(0, BLOCK)
    base = tl.cast(row, tl.int64) * vocab
    x = tl.load(src + base + offs, mask=offs < vocab)
    tl.store(dst + base + offs, x.to(tl.float32), mask=offs < vocab)


def calls_for(vocab: int, t, k, p) -> dict:
    device = torch.device("cuda")
    buf = torch.empty(ROWS, vocab, dtype=torch.float32, device=device)
    grid = (ROWS * triton.cdiv(vocab, BLOCK),)

    def torch_alloc(x):
        return torch.empty(ROWS, vocab, dtype=torch.float32, device=device).copy_(x)

    def triton_copy(x):
        out = torch.empty(ROWS, vocab, dtype=torch.float32, device=device)
        _copy[grid](x, out, out, out, t, k, p, ROWS, vocab, BLOCK=BLOCK)
        return out

    def triton_prep(x):
        out = torch.empty(ROWS, vocab, dtype=torch.float32, device=device)
        maxes = torch.empty(ROWS, 1024, dtype=torch.float32, device=device)
        status = torch.zeros(2 * ROWS + 1, dtype=torch.int32, device=device)
        _copy[grid](x, out, maxes, status, t, k, p, ROWS, vocab, BLOCK=BLOCK)
        return out

    return {
        "copy": buf.copy_,
        "torch_alloc": torch_alloc,
        "triton_copy": triton_copy,
        "triton_prep": triton_prep,
        "fused_nosync": lambda x: topk_fused._launch(x, t, k, p, None)[0],
        "topk_fused": lambda x: builders.topk_fused_probs(x, t, k, p),
    }


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("probe_triton_floor: needs a CUDA device")
    device = torch.device("cuda")
    vocabs = [int(v) for v in sys.argv[1:]] or [32000, 49152, 128256]
    t = torch.ones(ROWS, device=device)
    k = torch.full((ROWS,), 20, dtype=torch.int64, device=device)
    p = torch.full((ROWS,), 0.95, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    lines = [
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; {ROWS} rows, "
        f"fp32, iid; median ms of {REPEATS} interleaved rounds (x the copy floor)"
    ]
    for vocab in vocabs:
        copies = [torch.randn(ROWS, vocab, device=device, generator=gen) for _ in range(2)]
        calls = calls_for(vocab, t, k, p)
        assert torch.equal(calls["triton_copy"](copies[0]), copies[0])
        times = measure.time_interleaved(calls, copies, warmup=3, repeats=REPEATS)
        med = {n: statistics.median(v) for n, v in times.items()}
        lines.append(f"V={vocab}: " + ", ".join(f"{n} {m:.3f} ({m / med['copy']:.2f}x)" for n, m in med.items()))
        print(lines[-1], flush=True)
        del copies
        torch.cuda.empty_cache()
    out = Path(os.environ.get("OUT", ".")) / "probe_triton_floor.log"
    out.write_text("\n".join(lines) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
