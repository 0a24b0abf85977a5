"""The verify-step microbenchmark: target logits + draft tokens + coins -> accepted tokens, dense vs sparse.

`python -m harness.micro.verify_step [--families iid,sorted] [--vocabs 32000] [--steps 64] [--gamma 7]`
times, interleaved in the same rounds (harness.micro.measure.time_interleaved, rotated input copies):
- `dense_topk_first`: topk_first's dense [rows, V] probabilities, then block verification (the seed's path);
- `dense_topk_fused`: topk_fused's (Triton on CUDA; topk_first elsewhere), then block verification;
- `sparse`: each row's top-k entries (harness.verify.sparse.sparse_probs), then the torch sparse block verifier;
- `sparse_fused`: harness.verify.sparse.verify_step with fused=True: topk_fused's kernels with a sparse output
  (one read of the logits, no dense write) and the verification (inside their finish, or the verify kernel of
  harness.verify.sparse_kernel behind them: topk_fused.launch_config), given the host's bound on top_k as a server
  knows it (max_top_k = top_k, SGLang's sampling_info.max_top_k: no synchronisation; --no-top-k-bound: none given,
  one synchronisation) (on a CPU the same as `sparse`);
- `read_floor`: one read of the logits (a row maximum), what a verify step cannot go below.
rows = steps x (gamma + 1) positions; drafts are point masses (greedy drafts) at each position's argmax
after noise, so that steps accept some drafts and reject others. Every path's accepted counts and tokens
are compared with dense_topk_first's (rows that differ are counted: a coin within float32 rounding of a
block-verification threshold may land differently). On CUDA each path's peak temporary memory (above its
inputs) is measured. Writes results.jsonl and report.md under --out (default results/micro-verify-step/<time>)
and prints the report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import track
from torch import Tensor

from harness.host import envinfo
from harness.host.devices import check_fits, resolve_device
from harness.micro import bank, measure
from harness.micro.families import FAMILIES, make_family
from harness.micro.inputs import rotated_copies
from harness.validation import ConfigError, new_out_dir
from harness.verify import radix_topk_backend, topk_first_probs, topk_fused_probs, verify_block
from harness.verify.sparse import verify_step

TOP_K, TOP_P, TEMPERATURE = 20, 0.95, 1.0
PATHS = ("dense_topk_first", "dense_topk_fused", "sparse", "sparse_fused")  # the report's columns, in order


def paths(steps: int, gamma: int, drafts: Tensor, coins: Tensor, bound: bool = True) -> dict[str, measure.Call]:
    """The timed calls, each logits [steps * (gamma + 1), V] -> the accepted tokens [steps, gamma + 1]. The rows'
    temperature, top_k and top_p are made once, outside the timed calls (a server holds them as tensors on the
    device, as SGLang's sampling_info does): a call times the step, not three fills on an idle GPU."""
    rows = steps * (gamma + 1)
    device = drafts.device
    params = (
        torch.full((rows,), TEMPERATURE, device=device),
        torch.full((rows,), TOP_K, device=device),
        torch.full((rows,), TOP_P, device=device),
    )

    def dense(builder):
        def call(x: Tensor) -> Tensor:
            target = builder(x, *params).view(steps, gamma + 1, -1)
            return verify_block(target, drafts, None, uniforms=coins).tokens

        return call

    def sparse(fused: bool):
        max_top_k = TOP_K if fused and bound else None

        def call(x: Tensor) -> Tensor:
            return verify_step(
                x, *params, drafts, None, block=True, fused=fused, uniforms=coins, max_top_k=max_top_k
            ).tokens

        return call

    return {
        "dense_topk_first": dense(topk_first_probs),
        "dense_topk_fused": dense(topk_fused_probs),
        "sparse": sparse(False),
        "sparse_fused": sparse(True),
        "read_floor": lambda x: x.amax(dim=-1),
    }


def draft_tokens(logits: Tensor, steps: int, gamma: int, seed: int) -> Tensor:
    """Point-mass drafts: the argmax of each of the first gamma positions' logits after Gaussian noise of a
    tenth of the row's spread (mostly the target's favourite, at times a neighbour in rank)."""
    gen = torch.Generator(device=logits.device).manual_seed(seed)
    view = logits.view(steps, gamma + 1, -1)[:, :gamma].float()
    scale = view.std(dim=-1, keepdim=True)
    return (view + 0.1 * scale * torch.randn(view.shape, generator=gen, device=logits.device)).argmax(dim=-1)


def peak_bytes(call: measure.Call, x: Tensor) -> int | None:
    """Peak memory a call allocates above what is allocated before it (CUDA only)."""
    if not x.is_cuda:
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call(x)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def cell_inputs(
    family: str, vocab: int, steps: int, gamma: int, device: torch.device, bank_dir: Path | None
) -> tuple[Tensor, Tensor, Tensor]:
    """A cell's seeded inputs: the family's logits [steps * (gamma + 1), V], the point-mass drafts [steps, gamma]
    and the coins [steps, gamma + 1]."""
    model = FAMILIES[family].bank
    bank_rows = bank.load_rows(bank_dir, model)[0] if model and bank_dir else None
    logits = make_family(family, steps * (gamma + 1), vocab, seed=0, device=device, bank_rows=bank_rows)
    drafts = draft_tokens(logits, steps, gamma, seed=1)
    coins = torch.rand(steps, gamma + 1, generator=torch.Generator().manual_seed(2)).to(device)
    return logits, drafts, coins


def one_cell(
    family: str,
    vocab: int,
    steps: int,
    gamma: int,
    device: torch.device,
    repeats: int,
    bank_dir: Path | None,
    queued_ms: float = 0.0,
    bound: bool = True,
) -> dict:
    rows = steps * (gamma + 1)
    logits, drafts, coins = cell_inputs(family, vocab, steps, gamma, device, bank_dir)
    calls = paths(steps, gamma, drafts, coins, bound)
    ref = calls["dense_topk_first"](logits)
    differ = {n: int((calls[n](logits) != ref).any(dim=-1).sum()) for n in calls if n != "read_floor"}
    peaks = {n: peak_bytes(c, logits) for n, c in calls.items()}
    times = measure.time_interleaved(
        calls, rotated_copies(logits, 256 * 2**20), warmup=3, repeats=repeats, queued_ms=queued_ms
    )
    med = {n: statistics.median(t) for n, t in times.items()}
    accepted = float((ref >= 0).sum(dim=-1).float().mean() - 1)
    return {
        "family": family,
        "vocab": vocab,
        "steps": steps,
        "gamma": gamma,
        "rows": rows,
        "device": str(device),
        "median_ms": med,
        "read_floor_ms": med["read_floor"],
        "rows_differ": differ,
        "peak_bytes": peaks,
        "mean_accepted": accepted,
        "repeats": repeats,
        "radix_topk": radix_topk_backend(device),
        "queued_ms": queued_ms,
        "sparse_fused_max_top_k": TOP_K if bound else None,
        **_bank_rows(family, rows, bank_dir),
    }


def _bank_rows(family: str, rows: int, bank_dir: Path | None) -> dict:
    """A real family's source: the bank and how many distinct rows were tiled to the cell's rows."""
    model = FAMILIES[family].bank
    if not model or bank_dir is None:
        return {}
    return {"bank": str(bank_dir), "bank_rows": min(rows, int(bank.load_rows(bank_dir, model)[0].shape[0]))}


def machine_line(device: torch.device) -> str:
    """Where the set ran: the device (GPU name, or the CPU's model and threads), torch, the code's commit."""
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU {envinfo.host_info().cpu}, {torch.get_num_threads()} torch threads"
    )
    git = envinfo.git_info()
    sha = (git.git_sha or "no checkout")[:10] + (" (dirty)" if git.dirty else "")
    return f"{where}, torch {torch.__version__}, git {sha}"


def render(results: list[dict], device_name: str) -> str:
    lines = [
        f"# Verify step: dense vs sparse ({device_name})",
        "",
        f"top_k {TOP_K}, top_p {TOP_P}, T {TEMPERATURE}, fp32 logits, point-mass drafts, block verification; "
        "median ms of interleaved rounds; (x) = multiples of the one-read floor timed in the same rounds; "
        "rows differ = steps whose tokens differ from dense_topk_first's; the radix top-k of dense_topk_first "
        f"and sparse: {', '.join(sorted({r['radix_topk'] for r in results}))}; sparse_fused: "
        f"{_bound_text(results)}.",
        "",
        _timing(results),
        "",
        *_real_rows(results),
        "| family | vocab | steps x (gamma+1) | read floor ms | dense_topk_first | dense_topk_fused | sparse | "
        "sparse_fused | rows differ (fused, sparse, sparse_fused) | peak MiB (first, fused, sparse, sparse_fused) "
        "| accepted/step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        m, floor = r["median_ms"], r["read_floor_ms"]
        cell = {n: f"{m[n]:.3f} ({m[n] / floor:.2f}x)" for n in PATHS}
        peaks = r["peak_bytes"]
        mib = ", ".join("n/a" if peaks[n] is None else f"{peaks[n] / 2**20:.1f}" for n in PATHS)
        differ = ", ".join(str(r["rows_differ"][n]) for n in PATHS[1:])
        lines.append(
            f"| {r['family']} | {r['vocab']:,} | {r['steps']} x {r['gamma'] + 1} | {floor:.3f} | "
            + " | ".join(cell[n] for n in PATHS)
            + f" | {differ} | {mib} | {r['mean_accepted']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _bound_text(results: list[dict]) -> str:
    """How the rows' top_k bound reached the fused step (verify_step's max_top_k)."""
    bounds = sorted({str(r.get("sparse_fused_max_top_k")) for r in results})
    return (
        "given the host's bound on top_k (max_top_k " + ", ".join(bounds) + ", as SGLang's "
        "sampling_info.max_top_k: no synchronisation)"
        if "None" not in bounds
        else "no bound on top_k given (one synchronisation reads the rows the kernels left)"
    )


def _real_rows(results: list[dict]) -> list[str]:
    """A line (and a blank one) naming the real families' rows, or nothing."""
    real = sorted({(r["family"], r["bank"], r["bank_rows"], r["rows"], r["vocab"]) for r in results if r.get("bank")})
    if not real:
        return []
    return [
        "Real rows (from a logit bank, each model's rows truncated or padded to the vocabulary): "
        + "; ".join(f"{f} at {v:,}: {n} distinct rows of {b} tiled to {rows}" for f, b, n, rows, v in real)
        + ".",
        "",
    ]


def _timing(results: list[dict]) -> str:
    starts = sorted({(r.get("queued_ms", 0.0), not str(r.get("device", "cuda")).startswith("cpu")) for r in results})
    return "Timing: " + "; ".join(measure.start_text(q, gpu) for q, gpu in starts) + "."


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.micro.verify_step", description=__doc__.splitlines()[0])
    p.add_argument(
        "--families",
        default="iid,sorted,clustered,bf16,lm_like",
        help=f"logit families, comma-separated (of: {', '.join(FAMILIES)})",
    )
    p.add_argument("--vocabs", default="32000", help="vocabularies, comma-separated (e.g. 32000,248320)")
    p.add_argument(
        "--steps", type=int, default=64, help="verify steps per batch (requests); rows = steps x (gamma + 1)"
    )
    p.add_argument("--gamma", type=int, default=7, help="draft tokens per step (default 7, the seed's)")
    p.add_argument("--repeats", type=int, default=10, help="timed rounds (default 10)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--bank", default=None, help="the logit bank of the real families (default: the first found)")
    p.add_argument("--out", default=None, help="output folder (default results/micro-verify-step/<time>)")
    p.add_argument(
        "--queued-ms",
        type=float,
        default=0.0,
        help="CUDA: queue each timed call behind a GPU busy-wait of about this many ms, so that the "
        "host's launches overlap GPU work as in a server (default 0: the GPU as the previous call "
        "left it)",
    )
    p.add_argument(
        "--no-top-k-bound",
        action="store_true",
        help="sparse_fused without the host's bound on top_k (max_top_k): one synchronisation reads the rows "
        "the kernels left, as a caller that does not know the batch's largest top_k",
    )
    args = p.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        p.error(
            f"--families {args.families!r}: unknown {unknown}"
            if unknown
            else f"--families {args.families!r} names no family" + f" (valid: {', '.join(FAMILIES)})"
        )
    if args.steps < 1 or args.gamma < 1 or args.repeats < 1:
        p.error(f"--steps {args.steps}, --gamma {args.gamma} and --repeats {args.repeats} must each be >= 1")
    try:
        vocabs = [int(v) for v in args.vocabs.split(",")]
    except ValueError:
        p.error(f"--vocabs {args.vocabs!r}: not a comma-separated list of integers, e.g. 32000,248320")
    if any(v <= TOP_K for v in vocabs):
        p.error(f"--vocabs {args.vocabs!r}: each must be above top_k {TOP_K} (the step keeps the top {TOP_K})")
    try:
        device = resolve_device(args.device, "--device")
        # each cell holds at least its fp32 logits [steps * (gamma + 1), V] and a dense path's fp32 probabilities
        check_fits(
            args.steps * (args.gamma + 1) * max(vocabs) * 8,
            device,
            f"--vocabs {max(vocabs)} x {args.steps * (args.gamma + 1)} rows (--steps {args.steps} x (--gamma "
            f"{args.gamma} + 1); fp32 logits and probabilities)",
            "lower --vocabs or --steps",
        )
    except ConfigError as exc:
        p.error(str(exc))
    if args.queued_ms < 0 or (args.queued_ms and device.type != "cuda"):
        p.error(
            f"--queued-ms {args.queued_ms:g}: needs a CUDA device and a value >= 0 (a CPU has no queue to "
            "hide the host's work behind); leave it at 0 here"
        )
    bank_dir = bank.find_bank(args.bank)
    models = sorted({m for f in families if (m := FAMILIES[f].bank)})
    if models and bank_dir is None:
        p.error(
            f"the real families {[f for f in families if FAMILIES[f].bank]} need a logit bank: make logit-bank, "
            "or --bank DIR"
        )
    try:  # the bank's rows readable before anything is timed
        for model in models:
            bank.load_rows(bank_dir or Path(), model)
    except bank.BankError as exc:
        p.error(str(exc))
    try:
        out = Path(new_out_dir("--out", args.out or f"results/micro-verify-step/{time.strftime('%Y%m%d-%H%M%S')}"))
    except ConfigError as exc:
        p.error(str(exc))
    cells = [(f, v) for v in vocabs for f in families]
    results: list[dict] = []
    try:
        for family, vocab in track(cells, description="verify-step cells"):
            results.append(
                one_cell(
                    family,
                    vocab,
                    args.steps,
                    args.gamma,
                    device,
                    args.repeats,
                    bank_dir,
                    args.queued_ms,
                    not args.no_top_k_bound,
                )
            )
            (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    except KeyboardInterrupt:
        Console(stderr=True).print(
            f"interrupted: {len(results)} of {len(cells)} cells measured, kept in "
            f"{out / 'results.jsonl'} (no report.md)",
            highlight=False,
            soft_wrap=True,
        )
        return 130
    report = render(results, machine_line(device))
    (out / "report.md").write_text(report)
    print(report)
    Console().print(f"wrote {out / 'report.md'} and {out / 'results.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
