"""Where the fused sparse verify step's time goes on a GPU (harness.verify.sparse.verify_step, fused=True), at
the seed's sizes: 512 steps x 8 positions = 4096 rows of 248,320 fp32 logits, top_k 20, top_p 0.95, T 1,
point-mass drafts, block verification.

Per logit family: torch.profiler's device time per kernel over 10 steps; then the median ms of a step alone
(the GPU waits for the host's launches) and behind a 2 ms sleep kernel minus the sleep (launches queued while
the GPU is busy: the GPU's own time), beside the builder alone (topk_fused.run_sparse) and one read of the
logits (a row maximum). Prints it and writes $OUT/profile_sparse.log (default: the current folder). From the
repository root on a CUDA host:

    python scripts/profile_sparse_step.py [families, comma-separated; default iid,clustered,sorted,lm_like,padding]
"""

import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profile_topk_fused import median_ms  # noqa: E402  (scripts/, this script's folder)

from harness.micro.families import make_family  # noqa: E402
from harness.verify import topk_fused  # noqa: E402
from harness.verify.sparse import verify_step  # noqa: E402

VOCAB, STEPS, GAMMA = 248_320, 512, 7
SLEEP_CYCLES = 4_000_000  # about 2 ms on an H200


def family_lines(family: str, sleep_ms: float) -> list[str]:
    rows = STEPS * (GAMMA + 1)
    x = make_family(family, rows, VOCAB, seed=0, device=torch.device("cuda"))
    t, k, p = (torch.ones(rows, device="cuda"), torch.full((rows,), 20, device="cuda"),
               torch.full((rows,), 0.95, device="cuda"))
    drafts = x.view(STEPS, GAMMA + 1, VOCAB)[:, :GAMMA].argmax(dim=-1)
    u = torch.rand(STEPS, GAMMA + 1, device="cuda")

    def step() -> object:
        return verify_step(x, t, k, p, drafts, None, block=True, fused=True, uniforms=u).tokens

    calls = {"step": step, "run_sparse": lambda: topk_fused.run_sparse(x, t, k, p), "read": lambda: x.amax(dim=-1)}
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    lines = [f"== {family}: 10 steps, {rows} x {VOCAB:,} fp32",
             prof.key_averages().table(sort_by="cuda_time_total", row_limit=10)]
    for name, fn in calls.items():
        alone = median_ms(fn)
        behind = median_ms(lambda fn=fn: (torch.cuda._sleep(SLEEP_CYCLES), fn())) - sleep_ms
        lines.append(f"{family} {name}: alone {alone:.3f} ms, behind the sleep {behind:.3f} ms")
    return lines


def main() -> None:
    families = (sys.argv[1] if len(sys.argv) > 1 else "iid,clustered,sorted,lm_like,padding").split(",")
    sleep_ms = median_ms(lambda: torch.cuda._sleep(SLEEP_CYCLES))
    lines = [f"{torch.cuda.get_device_name()}, sleep kernel {sleep_ms:.3f} ms"]
    for family in families:
        lines += family_lines(family, sleep_ms)
    text = "\n".join(lines) + "\n"
    print(text)
    (Path(os.environ.get("OUT", ".")) / "profile_sparse.log").write_text(text)


if __name__ == "__main__":
    main()
