"""Where topk_fused's host time goes on a CUDA machine (4096 rows, iid logits, top_k 20, top_p 0.95, T 1), the time
the GPU waits for (lab/scripts/probe_host_wait.py measures that wait):

- one call of builders.fused_build, host time by part (medians of 50 calls, each after a synchronisation): the
  per-row parameters (rows.row_params), the preparation in topk_fused._launch before the first kernel, each
  Triton launch (one, the pass whose last program for a row finishes it; the finish kernel after it when
  unfused; the logs before 2026-12-04 evening timed the earlier design's seven), and what is left (the
  synchronisation that reads the rows left to the caller, its wait for the GPU included);
- Triton's launch path alone: host microseconds per launch of a kernel that does nothing, with as many runtime
  arguments as the pass kernel and a few constexprs (1,000 launches queued, one synchronisation);
- torch's, for scale: host microseconds per torch.empty of the workspace and per launch of a small torch kernel.

Writes $OUT/probe_launch_cost.log (default: the current folder). From the repository root on a CUDA host:

    python lab/scripts/probe_launch_cost.py [VOCAB ...]
"""

import os
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.verify import builders, topk_fused  # noqa: E402

ROWS, CALLS, LAUNCHES = 4096, 50, 1000
KERNELS = ("_pass_kernel", "_finish_kernel")


@triton.jit
def _noop(a, b, c, d, e, f, g, h, i, j, k, m, n, o, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr):
    pass


class Timed:
    """A Triton kernel whose launches record their host start and end (perf_counter) in `marks`."""

    def __init__(self, kernel, name: str, marks: list):
        self.kernel, self.name, self.marks = kernel, name, marks

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **kwargs):
            start = time.perf_counter()
            result = launch(*args, **kwargs)
            self.marks.append((self.name, start, time.perf_counter()))
            return result

        return call


def call_parts(x, t, k, p) -> dict[str, list[float]]:
    """Host microseconds of each part of CALLS calls of fused_build, by part."""
    marks: list = []
    originals = {name: getattr(topk_fused, name) for name in KERNELS}
    row_params = builders.row_params
    for name in KERNELS:
        setattr(topk_fused, name, Timed(originals[name], name, marks))
    parts: dict[str, list[float]] = {}

    def timed_params(*args):
        start = time.perf_counter()
        result = row_params(*args)
        marks.append(("params", start, time.perf_counter()))
        return result

    builders.row_params = timed_params
    try:
        for _ in range(CALLS):
            marks.clear()
            torch.cuda.synchronize()
            begin = time.perf_counter()
            builders.fused_build(x, t, k, p)
            end = time.perf_counter()
            params = next(m for m in marks if m[0] == "params")
            launches = [m for m in marks if m[0] != "params"]
            steps = [
                ("the builder's entry", params[1] - begin),
                ("row_params", params[2] - params[1]),
                ("prep in _launch before launch 1", launches[0][1] - params[2]),
            ]
            for i, (name, start, stop) in enumerate(launches):
                steps.append((f"launch {i + 1} ({name.strip('_').replace('_kernel', '')})", stop - start))
                if i + 1 < len(launches):
                    steps.append((f"between launches {i + 1} and {i + 2}", launches[i + 1][1] - stop))
            steps += [("after the last launch (sync, rows left)", end - launches[-1][2]), ("whole call", end - begin)]
            for key, seconds in steps:
                parts.setdefault(key, []).append(seconds * 1e6)
    finally:
        for name, kernel in originals.items():
            setattr(topk_fused, name, kernel)
        builders.row_params = row_params
    return parts


def per_launch_us(launch) -> float:
    launch()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(LAUNCHES):
        launch()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / LAUNCHES * 1e6


def main() -> None:
    device = torch.device("cuda")
    vocabs = [int(v) for v in sys.argv[1:]] or [32000, 49152, 128256, 151936]
    lines = [
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; {ROWS} rows, "
        f"iid, top_k 20, top_p 0.95, T 1, fp32; host microseconds, median of {CALLS} calls"
    ]
    buf = torch.zeros(16, device=device)
    lines.append(
        f"Triton launch of a kernel that does nothing (14 runtime arguments, 3 constexprs): "
        f"{per_launch_us(lambda: _noop[(1,)](*([buf] * 7), *range(7), A=1, B=2, C=3)):.1f} us a launch"
    )
    lines.append(
        f"torch: a small kernel (buf.add_(1)) {per_launch_us(lambda: buf.add_(1)):.1f} us a launch; torch.empty "
        f"of a 4096-row buffer {per_launch_us(lambda: torch.empty(4096 * 1024, dtype=torch.int32, device=device)):.1f} us"
    )
    gen = torch.Generator(device=device).manual_seed(0)
    for vocab in vocabs:
        x = torch.randn(ROWS, vocab, device=device, generator=gen)
        t = torch.ones(ROWS, device=device)
        k = torch.full((ROWS,), 20, device=device, dtype=torch.int64)
        p = torch.full((ROWS,), 0.95, device=device)
        for _ in range(5):
            builders.fused_build(x, t, k, p)
        parts = call_parts(x, t, k, p)
        lines.append(f"V={vocab}: " + "; ".join(f"{key} {statistics.median(v):.1f}" for key, v in parts.items()))
        print(lines[-1], flush=True)
        del x
        torch.cuda.empty_cache()
    print("\n".join(lines[:3]))
    out = Path(os.environ.get("OUT", ".")) / "probe_launch_cost.log"
    out.write_text("\n".join(lines) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
