"""Embedded model presets: the names `--model-path` accepts (`embedded:<name>`).

A preset fixes every shape and constant of the synthetic target and draft models, including the
weight seed, so a model path names one exact set of weights, as a checkpoint would.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

PREFIX = "embedded:"


@dataclass(frozen=True)
class ModelPreset:
    """Shapes and constants of one synthetic target + draft pair (see `model.py` for their roles)."""

    name: str
    vocab_size: int  # V, token 0 is end-of-sequence
    hidden: int  # H, the target's last hidden layer; the output projection is [H, V] int8
    draft_hidden: int  # H_d < H: the leading "head" units the draft shares with the target
    head_tokens: int  # tokens each head unit promotes (the peaked head of the distribution)
    context_window: int = 4  # C, tokens the model conditions on
    embed_dim: int = 64  # D, width of the hashed context features
    embed_rows: int = 4096  # rows of each hashed embedding table
    head_active: float = 0.03  # fraction of head units active in a typical context (~4 of 128)
    detail_active: float = 0.15  # fraction of detail units active in a typical context
    logit_scale: float = 0.012  # nats per integer logit unit
    detail_weight_max: int = 1  # detail weights are uniform integers in [-max, max]
    zipf: float = 0.8  # unigram prior: bias_v = -zipf * ln(1 + rank_v)
    eos_prior: float | None = -2.0  # the prior logit of end-of-sequence; None = its Zipf rank
    draft_divergence: float = 0.5  # default --draft-divergence (std, in nats, of the draft's own noise)
    noise_rank: int = 16  # R, width of the draft's noise features
    context_length: int = 65536  # longest prompt + output, in tokens
    weight_seed: int = 20250406

    @property
    def path(self) -> str:
        return PREFIX + self.name


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        # four tokens, for exact distribution tests: every conditional is easy to enumerate
        ModelPreset(
            name="tiny",
            vocab_size=4,
            hidden=32,
            draft_hidden=16,
            head_tokens=1,
            context_window=3,
            embed_dim=16,
            embed_rows=64,
            head_active=0.2,
            detail_active=0.3,
            logit_scale=0.001,
            detail_weight_max=2,
            zipf=0.0,
            eos_prior=None,
            draft_divergence=1.5,
            noise_rank=8,
            context_length=4096,
        ),
        # fast end-to-end tests: byte-level text, millisecond steps
        ModelPreset(
            name="mini",
            vocab_size=2048,
            hidden=256,
            draft_hidden=64,
            head_tokens=4,
            embed_rows=1024,
            head_active=0.06,
            detail_weight_max=3,
        ),
        # the default: a 32k vocabulary whose target step is dominated by a 64 MB output projection
        ModelPreset(name="small", vocab_size=32000, hidden=16384, draft_hidden=128, head_tokens=4, detail_active=0.02),
        # the seed models' vocabulary (248,320); meant for a GPU
        ModelPreset(name="large", vocab_size=248320, hidden=2048, draft_hidden=128, head_tokens=4),
    )
}


class PresetError(ValueError):
    """`--model-path` does not name an embedded preset; the message lists them."""


def preset_names() -> list[str]:
    return [PREFIX + n for n in PRESETS]


MAX_VOCAB = 1 << 21  # 2,097,152 ids: 8x the largest real vocabularies; more only exhausts memory at start-up


def get_preset(model_path: str, vocab_size: int | None = None) -> ModelPreset:
    """The preset named by `model_path` (`embedded:<name>`), its vocabulary optionally overridden."""
    name = model_path[len(PREFIX) :] if model_path.startswith(PREFIX) else None
    if name not in PRESETS:
        raise PresetError(
            f"--model-path {model_path!r} is not an embedded model; "
            f"valid: {', '.join(preset_names())}; or a real model: hf:smollm2-135m-instruct, "
            "a .gguf file, a Hugging Face model folder"
        )
    preset = PRESETS[name]
    if vocab_size is None:
        return preset
    if not 3 <= vocab_size <= MAX_VOCAB:
        raise PresetError(
            f"--vocab-size {vocab_size} must be in [3, {MAX_VOCAB:,}] (end-of-sequence and two text "
            "tokens at least; the largest real vocabularies hold about 262,144)"
        )
    return replace(preset, vocab_size=vocab_size)
