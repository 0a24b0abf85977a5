"""Where a fused sparse verify step's time goes on a GPU (harness.verify.sparse.verify_step, fused=True), from a
torch.profiler trace (CPU and CUDA activity on one clock): each call starts on an idle GPU, as in the
microbenchmark's default timing, and the trace gives, per call (median of CALLS):
- pre: from the call's entry on the host to the first GPU work it queued (the GPU idle, waiting for the host);
- pass: to the start of the first pass kernel;
- gpu: from the first GPU work to the last one's end; busy: the union of the GPU work in it (gpu - busy: bubbles);
- tail: from the last GPU work's end to the call's return on the host (a synchronisation's wake-up and the return
  path; negative: the call returned before the GPU finished, with nothing to wait for);
- total: from entry to whichever ends last (what an idle-GPU timing measures, less the event records);
- the GPU time of each kernel, summed over the call.
The same for the builder alone (topk_fused.run_sparse) and one read of the logits (a row maximum). 512 steps x 8
rows, top_k 20, top_p 0.95, T 1, point-mass drafts, block verification; VARIANTS of lab/scripts/tune_sparse_step.py.
Writes $OUT/profile_sparse_step.log (default: the current folder). From the repository root on a CUDA host:

    python lab/scripts/profile_sparse_step.py [vocabs] [families] [variants]   (comma-separated)
"""

import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tune_sparse_step import GAMMA, STEPS, TOP_K, VARIANTS  # noqa: E402  (lab/scripts/, this script's folder)

from harness.micro import bank  # noqa: E402
from harness.micro.families import FAMILIES, make_family  # noqa: E402
from harness.verify import topk_fused  # noqa: E402
from harness.verify.sparse import verify_step  # noqa: E402

CALLS = 8
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def trace_calls(fn) -> list[dict]:
    """The per-call figures (module docstring) of CALLS calls of fn, each on an idle GPU."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            torch.cuda.synchronize()
            with record_function("timed_call"):
                fn()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    calls = sorted(
        (e for e in events if e.get("name") == "timed_call" and e.get("cat") == "user_annotation"),
        key=lambda e: e["ts"],
    )
    launches = [
        e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    ]
    gpu = {
        e["args"]["correlation"]: e for e in events if e.get("cat") in GPU_CATS and "correlation" in e.get("args", {})
    }
    return [one_call(c, launches, gpu) for c in calls]


def one_call(call: dict, launches: list[dict], gpu: dict[int, dict]) -> dict:
    start, end = call["ts"], call["ts"] + call["dur"]
    work = [
        gpu[e["args"]["correlation"]] for e in launches if start <= e["ts"] <= end and e["args"]["correlation"] in gpu
    ]
    if not work:
        return {}
    first = min(w["ts"] for w in work)
    last = max(w["ts"] + w["dur"] for w in work)
    busy, reach = 0.0, first
    for w in sorted(work, key=lambda w: w["ts"]):
        busy += max(0.0, w["ts"] + w["dur"] - max(reach, w["ts"]))
        reach = max(reach, w["ts"] + w["dur"])
    passes = [w["ts"] for w in work if "_pass_kernel" in w["name"]]
    kernels: dict[str, float] = defaultdict(float)
    for w in work:
        kernels[w["name"][:40]] += w["dur"]
    return {
        "pre": first - start,
        "pass": (min(passes) - start) if passes else float("nan"),
        "gpu": last - first,
        "busy": busy,
        "tail": end - last,
        "total": max(end, last) - start,
        "kernels": dict(kernels),
    }


def summary(label: str, figures: list[dict]) -> list[str]:
    figures = [f for f in figures if f]
    if not figures:
        return [f"  {label:>14}: no GPU work traced"]
    med = {k: statistics.median(f[k] for f in figures) for k in ("pre", "pass", "gpu", "busy", "tail", "total")}
    names = sorted({n for f in figures for n in f["kernels"]})
    kern = ", ".join(f"{n} {statistics.median(f['kernels'].get(n, 0.0) for f in figures):.1f}" for n in names)
    return [
        f"  {label:>14}: total {med['total']:7.1f} us = pre {med['pre']:5.1f} (first pass at {med['pass']:5.1f}) "
        f"+ gpu {med['gpu']:7.1f} (busy {med['busy']:7.1f}, bubbles {med['gpu'] - med['busy']:5.1f}) + tail "
        f"{med['tail']:6.1f}",
        f"  {'':>14}  kernels (us): {kern}",
    ]


def cell(vocab: int, family: str, names: list[str]) -> list[str]:
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
    u = torch.rand(STEPS, GAMMA + 1, device="cuda")
    lines = [f"== {family} {vocab:,}: {rows} x {vocab:,} fp32"]
    for name in names:
        config, bound = VARIANTS[name]
        lines += summary(
            name,
            trace_calls(
                lambda config=config, bound=bound: verify_step(
                    x, t, k, p, drafts, None, block=True, fused=True, uniforms=u, max_top_k=bound, config=config
                )
            ),
        )
    lines += summary("run_sparse", trace_calls(lambda: topk_fused.run_sparse(x, t, k, p)))
    lines += summary("read", trace_calls(lambda: x.amax(dim=-1)))
    return lines


def main() -> None:
    vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "248320,32000").split(",")]
    families = (sys.argv[2] if len(sys.argv) > 2 else "iid,smollm2").split(",")
    names = (sys.argv[3] if len(sys.argv) > 3 else "old_sync,default_sync,default").split(",")
    lines = [
        f"{torch.cuda.get_device_name()}; torch.profiler trace, each call on an idle GPU, median of {CALLS} "
        f"calls; variants: " + "; ".join(f"{n}={VARIANTS[n]}" for n in names)
    ]
    out = Path(os.environ.get("OUT", ".")) / "profile_sparse_step.log"
    for vocab in vocabs:
        for family in families:
            block = cell(vocab, family, names)
            lines += block
            print("\n".join(block), flush=True)
            out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
