"""How long topk_fused's GPU waits for the host, per vocabulary (iid logits, 4096 rows, top_k 20, top_p 0.95, T 1):

- each kernel's device time (torch.profiler over 10 calls);
- a call timed alone by CUDA events, as the microbenchmark times it (the GPU waits for the host's preparation and
  launches, and the call ends with the synchronisation that reads the rows left to the caller), and the same call
  queued behind a 2 ms sleep kernel, minus the sleep (the launches are queued while the GPU sleeps): the
  difference is the time the GPU spends waiting for the host.

Writes $OUT/probe_host_wait.log (default: the current folder). From the repository root on a CUDA host:

    python lab/scripts/probe_host_wait.py [VOCAB ...]
"""

import os
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.micro.families import make_family  # noqa: E402
from harness.verify import builders  # noqa: E402

ROWS, SLEEP_CYCLES = 4096, 4_000_000


def _events(fn, before=None, n: int = 30) -> float:
    """Median ms between two events around fn(), after before() (queued first, untimed by the events' pair)."""
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        if before:
            before()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernel_times(call) -> str:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            call()
        torch.cuda.synchronize()
    times = {e.key: e.self_device_time_total / 10 / 1000 for e in prof.key_averages() if e.self_device_time_total}
    return ", ".join(f"{k[:24]} {v:.3f}" for k, v in sorted(times.items(), key=lambda kv: -kv[1]))


def one(vocab: int, device: torch.device) -> list[str]:
    x = make_family("iid", ROWS, vocab, seed=0, device=device)
    t = torch.ones(ROWS, device=device)
    k = torch.full((ROWS,), 20, device=device, dtype=torch.int64)
    p = torch.full((ROWS,), 0.95, device=device)
    copy = torch.empty(ROWS, vocab, device=device)

    def call() -> None:
        builders.fused_build(x, t, k, p)

    for _ in range(5):
        call()
    sleep = lambda: torch.cuda._sleep(SLEEP_CYCLES)  # noqa: E731
    alone, queued = _events(call), _events(call, sleep) - _events(lambda: None, sleep)
    floor = _events(lambda: copy.copy_(x))
    return [
        f"V={vocab}: copy {floor:.3f} ms; alone {alone:.3f} ms ({alone / floor:.2f}x), queued behind a sleep "
        f"{queued:.3f} ms ({queued / floor:.2f}x): the GPU waits {alone - queued:.3f} ms for the host",
        f"    kernels (device ms a call): {kernel_times(call)}",
    ]


def main() -> None:
    device = torch.device("cuda")
    vocabs = [int(v) for v in sys.argv[1:]] or [32000, 49152, 128256, 151936, 248320]
    lines = [f"{torch.cuda.get_device_name()}; {ROWS} rows, iid, top_k 20, top_p 0.95, T 1, fp32"]
    for vocab in vocabs:
        lines += one(vocab, device)
        print("\n".join(lines[-2:]), flush=True)
        torch.cuda.empty_cache()
    out = Path(os.environ.get("OUT", ".")) / "probe_host_wait.log"
    out.write_text("\n".join(lines) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
