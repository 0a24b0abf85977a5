"""How deep should a real model's early-exit draft be? `python -m harness.engine.draft_depth` measures it.

For each depth L it serves the same seeded requests in this process (no server: harness.engine.real_worker)
with drafts from the first L layers, and prints the acceptance length, the draft acceptance rate and the cost
of a token in target forwards, (gamma * L / layers + 1) / acceptance length: below 1, speculation could pay on
hardware where a forward's cost scales with its layers. The prompts are the synthetic arithmetic workload's,
through the model's chat template, sampled as the experiments sample them (T 1, top_p 0.95, top_k 20).
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table

from harness.engine.params import SamplingParams
from harness.engine.real_worker import RealWorker, run_alone
from harness.engine.request import Request, SpecCounters
from harness.engine.worker import WorkerConfig
from harness.models.real import RealLM
from workloads import load_workload
from workloads.config import WorkloadConfig


def measure(
    real: RealLM, depth: int, prompts: list[list[int]], gamma: int, max_new_tokens: int, block: bool, seed: int
) -> dict[str, float]:
    """Acceptance of drafts from the first `depth` layers over `prompts` (token ids), one seeded request each."""
    real.draft_layers = depth
    worker = RealWorker(
        real,
        WorkerConfig(
            gamma=gamma, draft_mode="sampled", block_verification=block, builder="topk_first", deterministic=True
        ),
    )
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, top_p=0.95, top_k=20)
    steps = accepted = tokens = 0
    t0 = time.monotonic()
    for i, ids in enumerate(prompts):
        req = Request(
            rid=f"depth-{depth}-{i}",
            prompt_ids=ids,
            params=params,
            stream=False,
            generator=torch.Generator().manual_seed(seed + i),
            tokenizer=real.tokenizer,
            spec=SpecCounters(gamma),
        )
        run_alone(worker, req)
        assert req.spec is not None
        steps, accepted, tokens = (
            steps + req.spec.verify_ct,
            accepted + req.spec.num_correct,
            tokens + len(req.output_ids) - 1,
        )
    al = (accepted + steps) / max(steps, 1)
    return {
        "depth": depth,
        "al": al,
        "rate": accepted / max(steps * gamma, 1),
        "cost": (gamma * depth / real.num_layers + 1) / al,
        "s": time.monotonic() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.engine.draft_depth", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default="hf:smollm2-135m-instruct")
    p.add_argument("--depths", type=int, nargs="+", default=[8, 12, 16, 20, 22, 24, 26, 28])
    p.add_argument("--items", type=int, default=8, help="prompts of the synthetic workload (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=7)
    p.add_argument("--block", action="store_true", help="block verification (default: token-wise)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    console = Console()
    real = RealLM.load(args.model_path, "auto", torch.device("cpu"), None)
    work = load_workload(WorkloadConfig(kind="synthetic", n_items=args.items))
    prompts = [real.tokenizer.encode(real.tokenizer.chat_prompt(item.messages)) for item in work.items]
    table = Table(
        title=f"{args.model_path}: early-exit drafts, gamma {args.gamma}, {args.items} prompts x "
        f"{args.max_new_tokens} tokens, {'block' if args.block else 'token-wise'} verification"
    )
    for col in ("draft layers", "acceptance length", "draft acceptance rate", "target forwards per token", "s"):
        table.add_column(col, justify="right")
    with console.status("measuring") as status:
        for depth in args.depths:
            status.update(f"draft layers {depth}")
            m = measure(real, depth, prompts, args.gamma, args.max_new_tokens, args.block, args.seed)
            table.add_row(
                f"{depth} / {real.num_layers}",
                f"{m['al']:.2f}",
                f"{m['rate']:.3f}",
                f"{m['cost']:.2f}",
                f"{m['s']:.0f}",
            )
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
