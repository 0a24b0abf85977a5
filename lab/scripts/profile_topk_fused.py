"""Where topk_fused's time goes on a GPU, per vocabulary (default the seed's 248,320; fp32, top_k 20, top_p 0.95):

1. torch.profiler over 10 calls at 4096 rows: the device time of each kernel;
2. per row count, the median time of a call alone (the GPU waits for the host's launches) and behind a 2 ms
   sleep kernel minus the sleep (the launches queue while the GPU is busy): the difference is the time
   the GPU spends waiting for the host. topk_first beside it.

Prints both and writes them to $OUT/profile.log (default: the current folder). From the repository root
on a CUDA host:

    python lab/scripts/profile_topk_fused.py [vocabs, comma-separated; default 248320]
"""

import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness import verify  # noqa: E402

VOCAB = 248_320
SLEEP_CYCLES = 4_000_000  # about 2 ms on an H200


def batch(rows: int, vocab: int) -> tuple[list[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    xs = [torch.randn(rows, vocab, device="cuda") for _ in range(2)]
    return xs, (
        torch.ones(rows, device="cuda"),
        torch.full((rows,), 20, device="cuda"),
        torch.full((rows,), 0.95, device="cuda"),
    )


def kernel_table(vocab: int) -> str:
    xs, (t, k, p) = batch(4096, vocab)
    for _ in range(3):  # compile and warm up
        verify.topk_fused_probs(xs[0], t, k, p)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            verify.topk_fused_probs(xs[0], t, k, p)
        torch.cuda.synchronize()
    head = f"10 calls of topk_fused_probs, 4096 x {vocab:,} fp32, top_k 20, top_p 0.95\n"
    return head + prof.key_averages().table(sort_by="cuda_time_total", row_limit=8)


def median_ms(fn: Callable[[], object], repeats: int = 20) -> float:
    times = []
    for i in range(repeats + 3):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def rows_lines(rows: int, vocab: int, sleep_ms: float) -> list[str]:
    xs, params = batch(rows, vocab)
    lines = []
    for name, builder in (("topk_fused", verify.topk_fused_probs), ("topk_first", verify.topk_first_probs)):
        calls = iter(range(10**9))

        def call(builder: Callable = builder, calls=calls) -> object:
            return builder(xs[next(calls) % 2], *params)

        alone = median_ms(call)
        behind = median_ms(lambda call=call: (torch.cuda._sleep(SLEEP_CYCLES), call())) - sleep_ms
        lines.append(f"rows {rows:5d} {name}: alone {alone:.3f}, behind the sleep {behind:.3f}")
    return lines


def host_wait_lines(vocab: int) -> list[str]:
    lines = [
        "",
        f"vocab {vocab:,}: median ms of a call alone, and behind a 2 ms sleep kernel minus the sleep (GPU-bound)",
    ]
    sleep_ms = median_ms(lambda: torch.cuda._sleep(SLEEP_CYCLES))
    for rows in (64, 512, 4096):
        lines += rows_lines(rows, vocab, sleep_ms)
        torch.cuda.empty_cache()
    return lines


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("profile_topk_fused: needs a CUDA device (the kernels are Triton on CUDA)")
    vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else str(VOCAB)).split(",")]
    text = "\n".join(line for v in vocabs for line in (kernel_table(v), *host_wait_lines(v), "")) + "\n"
    out = Path(os.environ.get("OUT", ".")) / "profile.log"
    out.write_text(text)
    print(text)
    print(f"written: {out}")


if __name__ == "__main__":
    main()
