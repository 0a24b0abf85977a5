"""Where topk_fused's time goes on a GPU: torch.profiler over 10 calls at the seed's sizes (4096 x 248,320 fp32
logits, top_k 20, top_p 0.95), the device time of each kernel. Prints the table and writes it to
$OUT/profile.log (default: the current folder). Run from the repository root on a CUDA host:

    python scripts/profile_topk_fused.py
"""

import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import verify  # noqa: E402


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("profile_topk_fused: needs a CUDA device (the kernels are Triton on CUDA)")
    rows, vocab = 4096, 248_320
    x = torch.randn(rows, vocab, device="cuda")
    t, k, p = (torch.ones(rows, device="cuda"), torch.full((rows,), 20, device="cuda"),
               torch.full((rows,), 0.95, device="cuda"))
    for _ in range(3):  # compile and warm up
        verify.topk_fused_probs(x, t, k, p)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            verify.topk_fused_probs(x, t, k, p)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=8)
    out = Path(os.environ.get("OUT", ".")) / "profile.log"
    out.write_text(f"10 calls of topk_fused_probs, {rows} x {vocab:,} fp32, top_k 20, top_p 0.95\n{table}")
    print(table)
    print(f"written: {out}")


if __name__ == "__main__":
    main()
