"""Where topk_fused's finish spends its time, on a GPU: the kernels as they are, and two diagnostic variants made
from harness/verify/topk_fused.py by text substitution at run time (their outputs are wrong by design, never
used): `nomerge` (the tile merge skipped: the pass, the pick of the k largest groups and the write of the
probabilities; the pick's floor is written in rank 0, else the compiler drops the pick with the merge: the sm_90
cubin of the sparse finish is 64 KB with it, 19 KB without) and `nopick_nomerge` (the group pick skipped too: the
pass and the write). So pick = nomerge -
nopick_nomerge and merge = kernels - nomerge, per family and vocabulary. Each is timed queued behind a 1 ms GPU
busy-wait (harness.micro.measure.time_interleaved, queued_ms=1: the host's work hidden), in the same rounds as one
read of the logits, for the sparse mode (run_sparse: pass, then a finish kernel) and the dense one (run: the finish
in each row's last pass program), 4096 rows, top_k 20, top_p 0.95, T 1, fp32. Writes $OUT/probe_finish_parts.log
(default: the current folder). From the repository root on a CUDA host:

    python lab/scripts/probe_finish_parts.py [vocabs, comma-separated] [families, comma-separated]
"""

import importlib.util
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.micro import bank, measure  # noqa: E402
from harness.micro.families import FAMILIES, make_family  # noqa: E402
from harness.verify import topk_fused  # noqa: E402

ROWS = 4096
_NO_MERGE = ("                if start < picks:  # tiles past the k groups", "                if start < 0:  # tiles")
# the floor (the pick's result) written in rank 0, so that the compiler cannot drop the pick with the merge
_KEEP_PICK = ("            _write_probs(top, k,", "            _write_probs(tl.where(ranks == 0, floor, top), k,")
EDITS = {  # variant -> (text, replacement) pairs applied to topk_fused.py
    "nomerge": [_NO_MERGE, _KEEP_PICK],
    "nopick_nomerge": [_NO_MERGE, _KEEP_PICK, ("        for i in range(picks):", "        for i in range(0):")],
}


def variants(folder: Path) -> dict:
    source = Path(topk_fused.__file__).read_text()
    out = {"kernels": topk_fused}
    for name, edits in EDITS.items():
        text = source
        for old, new in edits:
            if old not in text:
                sys.exit(f"probe_finish_parts: {name}: the line {old.strip()!r} is not in topk_fused.py any more")
            text = text.replace(old, new)
        path = folder / f"topk_fused_{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"topk_fused_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out[name] = module
    return out


def cell(family: str, vocab: int, modules: dict) -> str:
    model = FAMILIES[family].bank
    rows = bank.load_rows(bank.find_bank(None), model)[0] if model else None
    x = make_family(family, ROWS, vocab, seed=0, device=torch.device("cuda"), bank_rows=rows)
    t, k, p = (torch.ones(ROWS, device="cuda"), torch.full((ROWS,), 20, device="cuda"),
               torch.full((ROWS,), 0.95, device="cuda"))
    calls = {"read": lambda x: x.amax(dim=-1)}
    for name, module in modules.items():
        calls[f"sparse {name}"] = lambda x, m=module: m.run_sparse(x, t, k, p)[0]
        calls[f"dense {name}"] = lambda x, m=module: m.run(x, t, k, p)[0]
    times = measure.time_interleaved(calls, [x], warmup=2, repeats=15, queued_ms=1.0)
    med = {n: statistics.median(ms) for n, ms in times.items()}
    parts = []
    for mode in ("sparse", "dense"):
        full, nomerge, bare = (med[f"{mode} {n}"] for n in ("kernels", "nomerge", "nopick_nomerge"))
        parts.append(f"{full:.3f} | {bare:.3f} | {nomerge - bare:.3f} | {full - nomerge:.3f}")
    return f"| {family} | {vocab:,} | {med['read']:.3f} | " + " | ".join(parts) + " |"


def main() -> None:
    vocabs = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "248320,32000").split(",")]
    families = (sys.argv[2] if len(sys.argv) > 2 else "iid,clustered,lm_like,smollm2").split(",")
    lines = [f"{torch.cuda.get_device_name()}: ms, 4096 rows, queued behind a 1 ms GPU wait, median of 15 rounds",
             "| family | vocab | read | sparse: kernels | pass + write | group pick | tile merge "
             "| dense: kernels | pass + write | group pick | tile merge |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as folder:
        modules = variants(Path(folder))
        for vocab in vocabs:
            for family in families:
                lines.append(cell(family, vocab, modules))
                print(lines[-1], flush=True)
    (Path(os.environ.get("OUT", ".")) / "probe_finish_parts.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
