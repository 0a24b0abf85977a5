"""How fast can a Triton kernel shaped like topk_fused's sparse pass read the logits? The pass (a program per
block of a row, read-only in its sparse mode) runs at 1.4x-1.7x one read of the logits (torch's row maximum)
on an H200; this separates the grid's shape from the pass's own work.

Per vocabulary and family, 4096 rows fp32, the median ms of 15 interleaved rounds
(harness.micro.measure.time_interleaved) of:
- `read`: torch's row maximum (the read floor of the micro's tables);
- `tr_B_W_U[_e]`: a bare Triton read: a program per U consecutive blocks of B logits of one row, W warps, the
  blocks' maximum stored per program (`_e`: the loads marked evict_first);
- `tt_B_W_U`: the same plus the pass's test: the row's threshold loaded, the count of logits above it per block
  (a block reduction, as the earlier design's pass did before it skipped a block), the count stored;
- `rs_NAME`: topk_fused.run_sparse with launch_config overrides CONFIGS[NAME] (its kernels and the
  synchronisation: the whole sparse builder).
Prints a table and writes $OUT/probe_read_shape.log. On a CUDA host, from the repository root:

    python lab/scripts/probe_read_shape.py [vocabs] [families]
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
from harness.micro.families import make_family  # noqa: E402
from harness.verify import topk_fused  # noqa: E402

READS = [
    (1024, 4, 1, 0),
    (1024, 4, 1, 1),
    (2048, 4, 1, 0),
    (4096, 4, 1, 0),
    (4096, 8, 1, 0),
    (8192, 8, 1, 0),
    (1024, 4, 4, 0),
    (1024, 4, 8, 0),
    (2048, 8, 4, 0),
]
TESTS = [(1024, 4, 1), (2048, 4, 1), (4096, 8, 1), (1024, 4, 4)]
CONFIGS = {  # (lab/results/verify-step-h200-sparse/probe_read_shape.log timed the earlier design's keys)
    "base": {},  # the sparse mode's default (2,048-logit blocks, 4 warps, a finish kernel of its own)
    "b1024": {"PASS_BLOCK": 1024},
    "b4096w8": {"PASS_BLOCK": 4096, "PASS_WARPS": 8},
    "fused": {"FUSE": 1},
}


@triton.jit
def _read(x_ptr, out_ptr, vocab, stride, per_row, BLOCK: tl.constexpr, UNROLL: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // per_row
    first = (pid % per_row) * UNROLL * BLOCK
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for u in tl.static_range(UNROLL):
        offs = first + u * BLOCK + tl.arange(0, BLOCK)
        ptr = x_ptr + tl.cast(row, tl.int64) * stride + offs
        if EVICT:
            x = tl.load(ptr, mask=offs < vocab, other=float("-inf"), eviction_policy="evict_first")
        else:
            x = tl.load(ptr, mask=offs < vocab, other=float("-inf"))
        m = tl.maximum(m, x)
    tl.store(out_ptr + pid, tl.max(m, axis=0))


@triton.jit
def _test(x_ptr, t_ptr, out_ptr, vocab, stride, per_row, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // per_row
    first = (pid % per_row) * UNROLL * BLOCK
    t = tl.load(t_ptr + row)
    n = tl.full([], 0, tl.int32)
    for u in tl.static_range(UNROLL):
        offs = first + u * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + tl.cast(row, tl.int64) * stride + offs, mask=offs < vocab, other=float("-inf"))
        n += tl.sum((x > t).to(tl.int32), axis=0)
    tl.store(out_ptr + pid, n)


def read_call(block: int, warps: int, unroll: int, evict: int):
    def call(x: torch.Tensor) -> torch.Tensor:
        rows, vocab = x.shape
        per_row = triton.cdiv(vocab, block * unroll)
        out = torch.empty(rows * per_row, device=x.device, dtype=torch.float32)
        _read[(rows * per_row,)](
            x, out, vocab, x.stride(0), per_row, BLOCK=block, UNROLL=unroll, EVICT=evict, num_warps=warps
        )
        return out

    return call


def test_call(block: int, warps: int, unroll: int, t: torch.Tensor):
    def call(x: torch.Tensor) -> torch.Tensor:
        rows, vocab = x.shape
        per_row = triton.cdiv(vocab, block * unroll)
        out = torch.empty(rows * per_row, device=x.device, dtype=torch.int32)
        _test[(rows * per_row,)](x, t, out, vocab, x.stride(0), per_row, BLOCK=block, UNROLL=unroll, num_warps=warps)
        return out

    return call


def cell(family: str, vocab: int, rows: int = 4096) -> tuple[list[str], str]:
    x = make_family(family, rows, vocab, seed=0, device=torch.device("cuda"))
    t, k, p = (
        torch.ones(rows, device="cuda"),
        torch.full((rows,), 20, device="cuda"),
        torch.full((rows,), 0.95, device="cuda"),
    )
    # a threshold like the pass's: the row's 64th largest logit
    thr = x.topk(64, dim=-1).values[:, -1].contiguous()
    calls = {"read": lambda x: x.amax(dim=-1)}
    for b, w, u, e in READS:
        calls[f"tr_{b}_{w}_{u}{'_e' if e else ''}"] = read_call(b, w, u, e)
    for b, w, u in TESTS:
        calls[f"tt_{b}_{w}_{u}"] = test_call(b, w, u, thr)
    for name, c in CONFIGS.items():
        calls[f"rs_{name}"] = lambda x, c=c: topk_fused.run_sparse(x, t, k, p, c)[0]
    times = measure.time_interleaved(calls, [x], warmup=3, repeats=15)
    med = {n: statistics.median(ms) for n, ms in times.items()}
    floor = med["read"]
    names = list(calls)
    return names, f"| {family} | {vocab:,} | " + " | ".join(
        f"{med[n]:.3f} ({med[n] / floor:.2f}x)" for n in names
    ) + " |"


def main() -> None:
    vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "248320,32000").split(",")]
    families = (sys.argv[2] if len(sys.argv) > 2 else "iid,sorted,lm_like").split(",")
    lines: list[str] = []
    for vocab in vocabs:
        for family in families:
            names, line = cell(family, vocab)
            if not lines:
                lines = [
                    f"{torch.cuda.get_device_name()}: ms (x torch's row maximum), 4096 rows fp32, median of 15",
                    "| family | vocab | " + " | ".join(names) + " |",
                    "|---|---:|" + "---:|" * len(names),
                ]
                print("\n".join(lines), flush=True)
            lines.append(line)
            print(line, flush=True)
    (Path(os.environ.get("OUT", ".")) / "probe_read_shape.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
