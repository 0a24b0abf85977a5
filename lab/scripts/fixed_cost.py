"""The fixed cost of topk_fused's kernels and of the fused sparse verify step, and the model that predicts their
ratio to the bandwidth floor from it.

Per vocabulary, at 64 to 4096 rows (iid logits, top_k 20, top_p 0.95, T 1; the step: steps of 8 rows, point-mass
drafts, block verification), timed in the same rounds (harness.micro.measure.time_interleaved, each call on the GPU
as the previous one left it, the microbenchmark's default): the copy floor (read the logits, write a preallocated
fp32 [rows, V]), one read (a row maximum), the dense builder (harness.verify.fused_build, launch_config's default),
the sparse step (verify_step fused, launch_config's default, with and without the host's bound on top_k), and an
empty Triton kernel (one launch: what a launch costs an idle GPU). Then, per vocabulary and path, the least-squares
line t = fixed + slope x floor over the row counts: `fixed` is what a call costs whatever its size (host work
before the first kernel, the launches the GPU waits for, the finish after the last pass, the synchronisation), and
the model's ratio to the floor is slope + fixed / floor, printed beside the measured ratio at each row count.
QUEUED_MS (default 0) > 0 times each call queued behind a GPU busy-wait of about that long instead (the engine's
way: the host's launches hide behind the previous GPU work), so the fixed cost left is the GPU's own (the short
kernels, the finish after the last pass), and the idle fit minus the queued one is what the host's launches cost.
Writes $OUT/fixed_cost.log ($OUT/fixed_cost_queued.log when queued). On a CUDA host, from the repository root:

    [QUEUED_MS=1] python lab/scripts/fixed_cost.py [vocabs, comma-separated; default 32000,49152,128256,248320]
"""

import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.micro import measure  # noqa: E402
from harness.micro.families import make_family  # noqa: E402
from harness.verify import fused_build  # noqa: E402
from harness.verify.sparse import verify_step  # noqa: E402

try:
    import triton

    @triton.jit
    def _empty_kernel(x_ptr):
        pass
except ImportError:
    triton = None

ROWS = (64, 256, 1024, 2048, 4096)
GAMMA, TOP_K = 7, 20


def cell(vocab: int, rows: int, queued_ms: float) -> dict[str, float]:
    x = make_family("iid", rows, vocab, seed=0, device=torch.device("cuda"))
    steps = rows // (GAMMA + 1)
    t, k, p = (
        torch.ones(rows, device="cuda"),
        torch.full((rows,), TOP_K, device="cuda"),
        torch.full((rows,), 0.95, device="cuda"),
    )
    drafts = x.view(steps, GAMMA + 1, vocab)[:, :GAMMA].argmax(dim=-1)
    u = torch.rand(steps, GAMMA + 1, device="cuda")
    buf = torch.empty(rows, vocab, device="cuda")
    calls = {
        "copy": buf.copy_,
        "read": lambda x: x.amax(dim=-1),
        "dense": lambda x: fused_build(x, t, k, p),
        "step": lambda x: verify_step(x, t, k, p, drafts, None, block=True, fused=True, uniforms=u, max_top_k=TOP_K),
        "step_sync": lambda x: verify_step(x, t, k, p, drafts, None, block=True, fused=True, uniforms=u),
        "empty_triton": lambda x: _empty_kernel[(1,)](x),
    }
    copies = [x, x.clone()] if rows * vocab * 4 < 2**30 else [x]  # small inputs: two copies, alternated
    times = measure.time_interleaved(calls, copies, warmup=3, repeats=20, queued_ms=queued_ms)
    return {n: statistics.median(v) * 1000 for n, v in times.items()}  # us


def fit(floors: list[float], times: list[float]) -> tuple[float, float]:
    """Least squares t = fixed + slope * floor -> (fixed, slope)."""
    mf, mt = statistics.fmean(floors), statistics.fmean(times)
    slope = sum((f - mf) * (t - mt) for f, t in zip(floors, times, strict=True)) / sum((f - mf) ** 2 for f in floors)
    return mt - slope * mf, slope


def main() -> None:
    vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "32000,49152,128256,248320").split(",")]
    queued_ms = float(os.environ.get("QUEUED_MS", "0"))
    lines = [
        f"{torch.cuda.get_device_name()}; iid logits, top_k {TOP_K}, top_p 0.95, T 1; median us of 20 "
        f"interleaved rounds, {measure.start_text(queued_ms)}; fixed + slope x floor fitted "
        f"over rows {', '.join(map(str, ROWS))}; dense against the copy floor, step against one read"
    ]
    out = Path(os.environ.get("OUT", ".")) / ("fixed_cost_queued.log" if queued_ms else "fixed_cost.log")
    for vocab in vocabs:
        cells = {rows: cell(vocab, rows, queued_ms) for rows in ROWS}
        torch.cuda.empty_cache()
        lines.append(
            f"== vocab {vocab:,}: empty Triton kernel {statistics.median(c['empty_triton'] for c in cells.values()):.1f} us"
        )
        lines.append("rows | copy | read | dense (x copy) | step (x read) | step_sync (x read)")
        for rows, c in cells.items():
            lines.append(
                f"{rows} | {c['copy']:.1f} | {c['read']:.1f} | {c['dense']:.1f} ({c['dense'] / c['copy']:.2f}x) "
                f"| {c['step']:.1f} ({c['step'] / c['read']:.2f}x) | {c['step_sync']:.1f} "
                f"({c['step_sync'] / c['read']:.2f}x)"
            )
        for path, floor in (("dense", "copy"), ("step", "read"), ("step_sync", "read")):
            fixed, slope = fit([c[floor] for c in cells.values()], [c[path] for c in cells.values()])
            model = ", ".join(
                f"{rows}: {slope + fixed / c[floor]:.2f}x model / {c[path] / c[floor]:.2f}x measured"
                for rows, c in cells.items()
            )
            lines.append(
                f"{path}: fixed {fixed:.1f} us + {slope:.3f} x {floor}; ratio = {slope:.3f} + {fixed:.1f} us / "
                f"{floor}: {model}"
            )
        print("\n".join(lines[-(len(ROWS) + 5) :]), flush=True)
        out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
