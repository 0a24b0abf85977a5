"""The synthetic target and draft language models, deterministic from the preset's weight seed.

Both read the last C tokens of a sequence (a window; there is no KV cache):

    features  x = sum over F hashed n-gram tables of their int8 rows        [N, D]   (C unigrams,
                                                                                     a bigram, a trigram)
    hidden    h = quantized_relu(x @ A)                                     [N, H]   values 0..15
    target    logits = scale * (h @ W) + prior                              [N, V]
    draft     logits = scale * (h[:, :H_d] @ W[:H_d]) + prior + divergence * noise(x)

W is [H, V] int8 (stored transposed, [V, H], the layout the kernels read). Its first H_d rows are
sparse "head" units: each promotes a few tokens with large weights, so a context with a few active
head units yields a peaked head of plausible next tokens. The remaining H - H_d rows are dense "detail"
units with small weights that reshape the long tail and nudge the head; the prior is a Zipf-like
unigram bias. The target pays for the whole [H, V] projection (the weight read that dominates a GPU
decode step; 512 MiB for embedded:small); the draft reads only the H_d head rows plus a rank-R noise
projection, ~H/(H_d+R) times less, and it diverges from the target by the detail it does not see and
by its own context-dependent noise, whose size `divergence` (nats) tunes the acceptance rate. All
products are exact integer sums (`exact.py`), so each row's logits are bitwise independent of the batch
they are computed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import torch
from torch import Tensor

from harness.engine.exact import LEVELS, IntLinear, quantized_relu
from harness.engine.tokenizer import EOS_ID
from harness.models.presets import ModelPreset

HASH_PRIME = 2_147_483_647  # 2**31 - 1
EMBED_MAX = 4  # embedding entries are integers in [-EMBED_MAX, EMBED_MAX]
MLP_MAX = 4
HEAD_WEIGHT_MAX = 127
NOISE_WEIGHT_STD = 8.0
HEAD_LEVELS = 16  # head units step by 1/16 of a standard deviation: strong, graded activations
DETAIL_LEVELS = 4  # detail and noise units by 1/4


@dataclass
class FeatureHasher:
    """Hashed n-gram features of a context window: C unigrams, the last bigram and the last trigram."""

    hash_mult: Tensor  # [F, C] int64, zero where feature f does not read position c
    embed: Tensor  # [F, M, D] int16

    def to(self, device: torch.device) -> FeatureHasher:
        return FeatureHasher(self.hash_mult.to(device), self.embed.to(device))

    def __call__(self, contexts: Tensor) -> Tensor:
        """contexts: [N, C] int64 token ids, oldest first, -1 = before the start -> x: [N, D] int8."""
        codes = (contexts + 1).unsqueeze(1) * self.hash_mult.unsqueeze(0)  # [N, F, C] int64
        rows = codes.sum(dim=-1).remainder(HASH_PRIME).remainder(self.embed.shape[1])  # [N, F]
        tables = torch.arange(self.embed.shape[0], device=contexts.device).unsqueeze(0)  # [1, F]
        return self.embed[tables, rows].sum(dim=1).to(torch.int8)  # [N, D]


@dataclass
class HiddenLayer:
    """x @ A followed by a quantised ReLU with per-unit thresholds."""

    proj: IntLinear  # [units, D]
    threshold: Tensor  # [units] float32 integers
    step: Tensor  # [units] float32 integers >= 1

    @classmethod
    def on(cls, weights: Tensor, threshold: Tensor, step: Tensor, device: torch.device, max_input: int) -> HiddenLayer:
        """weights: [units, D] int8."""
        return cls(IntLinear.on(weights, device, max_input), threshold.to(device), step.to(device))

    def __call__(self, x: Tensor) -> Tensor:
        """x: [N, D] int8 -> [N, units] uint8 in 0..LEVELS."""
        return quantized_relu(self.proj(x), self.threshold, self.step)


@dataclass
class RawWeights:
    """Every weight, generated on the CPU from the preset's seed (then packed for the device)."""

    features: FeatureHasher
    mlp: Tensor  # [H, D] int8; units :H_d are the head, the rest the detail
    threshold: Tensor  # [H] float32
    step: Tensor  # [H] float32
    out: Tensor  # [V, H] int8: W transposed (generated in the layout the kernels read)
    prior: Tensor  # [V] float32
    noise_mlp: Tensor  # [R, D] int8, the draft's own
    noise_threshold: Tensor  # [R]
    noise_step: Tensor  # [R]
    noise_out: Tensor  # [V, R] int8
    noise_std: float  # std of the integer noise over random contexts (calibrates --draft-divergence)


class SyntheticLM:
    """A target model and its draft; build with `SyntheticLM.build(preset, divergence, device)`."""

    def __init__(self, preset: ModelPreset, raw: RawWeights, divergence: float, device: torch.device) -> None:
        p, max_x = preset, _max_feature(preset)
        self.preset = preset
        self.device = device
        self.vocab_size = p.vocab_size
        self.context_window = p.context_window
        self.features = raw.features.to(device)
        self._hidden = HiddenLayer.on(raw.mlp, raw.threshold, raw.step, device, max_x)
        self._out = IntLinear.on(raw.out, device, LEVELS, signed=False)  # the big read of every target forward
        self._prior = raw.prior.to(device)
        self._noise_scale = divergence / max(raw.noise_std, 1e-9)
        self._with_noise = divergence > 0
        hd = p.draft_hidden
        # the draft's hidden units: the target's head units, then (with noise) its own R noise units
        mlp = torch.cat([raw.mlp[:hd], raw.noise_mlp]) if self._with_noise else raw.mlp[:hd]
        thr = torch.cat([raw.threshold[:hd], raw.noise_threshold]) if self._with_noise else raw.threshold[:hd]
        step = torch.cat([raw.step[:hd], raw.noise_step]) if self._with_noise else raw.step[:hd]
        self._draft_hidden = HiddenLayer.on(mlp.contiguous(), thr, step, device, max_x)
        self._draft_out = IntLinear.on(raw.out[:, :hd].contiguous(), device, LEVELS, signed=False)
        self._noise_out = IntLinear.on(raw.noise_out, device, LEVELS, signed=False) if self._with_noise else None

    @classmethod
    def build(cls, preset: ModelPreset, divergence: float, device: torch.device | str = "cpu") -> SyntheticLM:
        """Generate the weights from `preset.weight_seed` (on the CPU, so every device gets the same)."""
        if divergence < 0:
            raise ValueError(f"draft divergence {divergence} must be >= 0")
        return cls(preset, generate_weights(preset), divergence, torch.device(device))

    # ------------------------------------------------------------------ forward

    def target_logits(self, contexts: Tensor) -> Tensor:
        """contexts: [N, C] -> logits [N, V] float32 (one batched forward over all N positions)."""
        h = self._hidden(self.features(contexts))  # [N, H] uint8
        return self._out(h) * self.preset.logit_scale + self._prior  # [N, V]

    def draft_logits(self, contexts: Tensor) -> Tensor:
        """contexts: [N, C] -> logits [N, V] float32 from the head units and the draft's noise."""
        hd = self.preset.draft_hidden
        h = self._draft_hidden(self.features(contexts))  # [N, H_d (+ R)] uint8
        logits = self._draft_out(h[:, :hd].contiguous()) * self.preset.logit_scale + self._prior  # [N, V]
        if self._noise_out is not None:  # with noise (divergence > 0)
            logits = logits + self._noise_out(h[:, hd:].contiguous()) * self._noise_scale
        return logits

    def windows(self, tokens: list[int]) -> list[int]:
        """The last C tokens of a sequence, left-padded with -1."""
        tail = tokens[-self.context_window :]
        return [-1] * (self.context_window - len(tail)) + tail


# ---------------------------------------------------------------------- weight generation


def generate_weights(p: ModelPreset) -> RawWeights:
    """All weights of a preset, deterministic from its seed (the draft's noise from seed + 1)."""
    gen = torch.Generator().manual_seed(p.weight_seed)
    features = _feature_hasher(p, gen)
    n_detail = p.hidden - p.draft_hidden
    mlp, threshold, step = _layer(
        gen,
        p,
        [p.head_active] * p.draft_hidden + [p.detail_active] * n_detail,
        [HEAD_LEVELS] * p.draft_hidden + [DETAIL_LEVELS] * n_detail,
    )
    out = _output_weights(p, gen)
    prior = _prior(p, gen)
    noise_gen = torch.Generator().manual_seed(p.weight_seed + 1)
    noise_mlp, noise_threshold, noise_step = _layer(noise_gen, p, [0.5] * p.noise_rank, [DETAIL_LEVELS] * p.noise_rank)
    noise_out = torch.randn(p.vocab_size, p.noise_rank, generator=noise_gen) * NOISE_WEIGHT_STD
    noise_out = noise_out.round_().clamp_(-127, 127).to(torch.int8)
    probe = torch.randint(0, p.vocab_size, (2048, p.context_window), generator=noise_gen)  # [n, C]
    cpu = torch.device("cpu")
    g = HiddenLayer.on(noise_mlp, noise_threshold, noise_step, cpu, _max_feature(p))(features(probe))
    noise_std = float(IntLinear.on(noise_out, cpu, LEVELS, signed=False)(g).std())
    return RawWeights(
        features, mlp, threshold, step, out, prior, noise_mlp, noise_threshold, noise_step, noise_out, noise_std
    )


def _uniform_ints(gen: torch.Generator, bound: int, shape: tuple[int, ...], dtype=torch.int64) -> Tensor:
    return torch.randint(-bound, bound + 1, shape, generator=gen, dtype=dtype)


def _max_feature(p: ModelPreset) -> int:
    return (p.context_window + 2) * EMBED_MAX


def _feature_hasher(p: ModelPreset, gen: torch.Generator) -> FeatureHasher:
    """Hash multipliers [F, C] (C unigrams, the last bigram, the last trigram) and tables [F, M, D]."""
    c = p.context_window
    if c < 3:
        raise ValueError(f"context_window {c} must be >= 3")
    mult = torch.randint(1, HASH_PRIME, (c + 2, c), generator=gen, dtype=torch.int64)
    mask = torch.zeros(c + 2, c, dtype=torch.int64)
    mask[torch.arange(c), torch.arange(c)] = 1  # unigram j reads position j
    mask[c, c - 2 :] = 1  # bigram: the last two tokens
    mask[c + 1, c - 3 :] = 1  # trigram: the last three
    embed = _uniform_ints(gen, EMBED_MAX, (c + 2, p.embed_rows, p.embed_dim)).to(torch.int16)
    return FeatureHasher(hash_mult=mult * mask, embed=embed)


def _layer(
    gen: torch.Generator, p: ModelPreset, actives: list[float], levels: list[int]
) -> tuple[Tensor, Tensor, Tensor]:
    """Weights [units, D] int8, thresholds and steps [units] of a layer whose unit i fires (value >= 1)
    in about actives[i] of contexts and reaches 15 about 15/levels[i] standard deviations higher."""
    units = len(actives)
    weights = _uniform_ints(gen, MLP_MAX, (units, p.embed_dim)).to(torch.int8)
    var_one = ((2 * EMBED_MAX + 1) ** 2 - 1) / 12
    var_w = ((2 * MLP_MAX + 1) ** 2 - 1) / 12
    std_y = (p.embed_dim * var_w * (p.context_window + 2) * var_one) ** 0.5
    z = torch.tensor([NormalDist().inv_cdf(1 - a) for a in actives], dtype=torch.float64)
    threshold = (z * std_y).round().to(torch.float32)
    step = torch.tensor([max(1, round(std_y / lv)) for lv in levels], dtype=torch.float32)
    return weights, threshold, step


def _output_weights(p: ModelPreset, gen: torch.Generator) -> Tensor:
    """W transposed, [V, H] int8: sparse promoting head units (columns :H_d), then dense small detail."""
    if not 0 < p.draft_hidden < p.hidden:
        raise ValueError(f"draft_hidden {p.draft_hidden} must be in (0, hidden={p.hidden})")
    w = torch.empty(p.vocab_size, p.hidden, dtype=torch.int8)
    w[:, : p.draft_hidden] = _uniform_ints(gen, 1, (p.vocab_size, p.draft_hidden), torch.int8)
    promoted = torch.randint(1, p.vocab_size, (p.draft_hidden, p.head_tokens), generator=gen)  # never EOS
    strength = torch.linspace(HEAD_WEIGHT_MAX, HEAD_WEIGHT_MAX / 2, p.head_tokens).round().to(torch.int8)
    w[promoted, torch.arange(p.draft_hidden).unsqueeze(-1)] = strength
    w[:, p.draft_hidden :] = _uniform_ints(
        gen, p.detail_weight_max, (p.vocab_size, p.hidden - p.draft_hidden), torch.int8
    )
    return w


def _prior(p: ModelPreset, gen: torch.Generator) -> Tensor:
    """Unigram log-prior [V]: -zipf * ln(1 + rank) over a random ranking; EOS may get its own value."""
    rank = torch.randperm(p.vocab_size, generator=gen).to(torch.float32)
    prior = -p.zipf * torch.log1p(rank)
    if p.eos_prior is not None:
        prior[EOS_ID] = p.eos_prior
    return prior


def weight_bytes(p: ModelPreset) -> dict[str, int]:
    """Bytes of int8 weights each forward reads (the embedding gathers aside): the cost model."""
    return {
        "target": p.hidden * (p.embed_dim + p.vocab_size),
        "draft": (p.draft_hidden + p.noise_rank) * (p.embed_dim + p.vocab_size),
    }
