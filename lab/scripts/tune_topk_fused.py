"""Launch-configuration variants of topk_fused against the copy floor and topk_first, timed in the same rounds
(the microbenchmark's method: harness.micro.measure.time_interleaved, CUDA events, rotated input copies).

At 4096 rows, top_k 20, top_p 0.95, temperature 1, fp32, for each vocabulary and logit family given: the copy
floor (read the logits, write a preallocated fp32 [rows, vocab]), topk_first, and topk_fused under each
variant (a JSON object of topk_fused.launch_config() overrides), and, with --against [NAME=]FILE (repeatable), the
topk_fused.py of another commit or a trial copy (its run(), the rows it leaves built by topk_first) as the variant
NAME (default "against"). Every variant's output
is checked against full_vocab's (kept sets, except rows with ties at the k-th logit or the top-p cut:
harness.micro.compare). The real families take their rows from --bank. Writes $OUT/tuning.log (default: the
current folder). On a CUDA host, from the repository root:

    git show HEAD~1:harness/verify/topk_fused.py > /tmp/old_topk_fused.py
    python lab/scripts/tune_topk_fused.py --vocabs 32000,49152 --families iid,sorted,gemma3 \\
        --bank tests/fixtures/logit_bank --against /tmp/old_topk_fused.py \\
        --variant base='{}' --variant block1024='{"PASS_BLOCK": 1024}'
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.micro import measure  # noqa: E402
from harness.micro.bank import load_rows  # noqa: E402
from harness.micro.compare import tied_rows, unexplained_rows  # noqa: E402
from harness.micro.families import FAMILIES, make_family  # noqa: E402
from harness.verify import builders  # noqa: E402

ROWS, TOP_K, TOP_P = 4096, 20, 0.95


def parse_variant(text: str) -> tuple[str, dict[str, int]]:
    name, _, config = text.partition("=")
    return name, json.loads(config or "{}")


def against_build(path: str):
    """fused_build with the kernels of another topk_fused.py (its run(); the rows it leaves by topk_first)."""
    spec = importlib.util.spec_from_file_location("against_topk_fused", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def build(x, t, k, p, config=None):
        out, left = module.run(x, t, k, p)
        if left is not None:
            out[left] = builders.topk_first_probs(x[left], t[left], k[left], p[left])
        return out

    return build


def one_cell(
    vocab: int,
    family: str,
    variants: dict[str, dict[str, int]],
    repeats: int,
    bank: str | None,
    against=None,
    queued_ms: float = 0.0,
) -> list[str]:
    device = torch.device("cuda")
    model = FAMILIES[family].bank
    rows = load_rows(Path(bank), model)[0] if model else None
    copies = [make_family(family, ROWS, vocab, seed=s, device=device, bank_rows=rows) for s in (0, 1)]
    t = torch.ones(ROWS, device=device)
    k = torch.full((ROWS,), TOP_K, device=device, dtype=torch.int64)
    p = torch.full((ROWS,), TOP_P, device=device)
    buf = torch.empty(ROWS, vocab, dtype=torch.float32, device=device)
    calls = {"copy": buf.copy_, "topk_first": lambda x: builders.topk_first_probs(x, t, k, p)}
    build = {name: builders.fused_build for name in variants}
    for name, other in (against or {}).items():
        variants, build = {**variants, name: {}}, {**build, name: other}
    for name, cfg in variants.items():
        calls[name] = lambda x, cfg=cfg, name=name: build[name](x, t, k, p, config=cfg)
    ref = builders.full_vocab_probs(copies[0], t, k, p)
    tied = tied_rows(copies[0], t, k, p)
    checks = {}
    for name, cfg in variants.items():
        out = build[name](copies[0], t, k, p, config=cfg)
        differ, unexplained = unexplained_rows(out, ref, tied)
        checks[name] = f"{differ} rows differ, {unexplained} unexplained"
    times = measure.time_interleaved(calls, copies, warmup=3, repeats=repeats, queued_ms=queued_ms)
    med = {n: statistics.median(v) for n, v in times.items()}
    lines = [f"vocab {vocab:,} {family}: copy {med['copy']:.3f} ms, topk_first {med['topk_first']:.3f} ms"]
    for name in variants:
        lines.append(
            f"  {name:>14}: {med[name]:.3f} ms = {med[name] / med['copy']:.2f}x copy, "
            f"{med[name] / med['topk_first']:.2f}x topk_first; {checks[name]}"
        )
    del copies, buf, ref
    torch.cuda.empty_cache()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocabs", default="32000,49152,128256,151936,248320")
    parser.add_argument("--families", default="iid,sorted,bf16,clustered,lm_like,padding")
    parser.add_argument("--variant", action="append", default=[], help="NAME=JSON overrides of launch_config()")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--queued-ms",
        type=float,
        default=0.0,
        help="queue each timed call behind a GPU busy-wait of this many ms (0: an idle GPU)",
    )
    parser.add_argument("--bank", default="tests/fixtures/logit_bank", help="the logit bank of the real families")
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        help="[NAME=]FILE: a topk_fused.py (another commit's) timed in the same rounds as NAME "
        "(default: against); repeatable",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("tune_topk_fused: needs a CUDA device")
    variants = dict(parse_variant(v) for v in args.variant) or {"base": {}}
    against = {}
    for text in args.against:
        name, _, path = text.rpartition("=")
        against[name or "against"] = against_build(path)
    out = Path(os.environ.get("OUT", ".")) / "tuning.log"
    timing = f"queued behind a {args.queued_ms:g} ms GPU wait" if args.queued_ms else "on an idle GPU"
    lines = [
        f"{torch.cuda.get_device_name()}; {ROWS} rows, top_k {TOP_K}, top_p {TOP_P}, fp32, {timing}; variants: "
        + "; ".join(f"{n}={json.dumps(c)}" for n, c in variants.items())
        + "".join(
            f"; {t.rpartition('=')[0] or 'against'} = the kernels of {t.rpartition('=')[2]}" for t in args.against
        )
    ]
    for vocab in (int(v) for v in args.vocabs.split(",")):
        for family in args.families.split(","):
            cell = one_cell(vocab, family, variants, args.repeats, args.bank, against, args.queued_ms)
            lines += cell
            print("\n".join(cell), flush=True)
            out.write_text("\n".join(lines) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
