"""The synthetic target and draft models: deterministic, batch-invariant to the bit, a realistic
distribution shape, a draft whose divergence knob spans acceptance rates 0.5 to 0.9, and a cost model
where the target reads far more weights than the draft."""

from __future__ import annotations

import pytest
import torch

from harness.engine.exact import IntLinear
from harness.engine.model import SyntheticLM, weight_bytes
from harness.models.presets import PRESETS, get_preset
from harness.verify import full_vocab_probs


def random_contexts(model: SyntheticLM, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randint(0, model.vocab_size, (n, model.context_window), generator=g)
    ctx[:3, :2] = -1  # a few windows at the start of a sequence
    return ctx


def probs(logits: torch.Tensor) -> torch.Tensor:
    n = logits.shape[0]
    return full_vocab_probs(logits, torch.ones(n), torch.full((n,), -1), torch.ones(n))


def test_int_linear_is_exact() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randint(-127, 128, (77, 300), generator=g, dtype=torch.int8)  # [out, in]
    x = torch.randint(-20, 21, (9, 300), generator=g, dtype=torch.int8)
    out = IntLinear.on(w, torch.device("cpu"), max_input=20)(x)
    assert out.dtype == torch.float32 and out.shape == (9, 77)
    assert torch.equal(out.double(), x.double() @ w.double().T)
    with pytest.raises(ValueError, match="exact"):
        IntLinear.on(torch.full((2, 2**17), 127, dtype=torch.int8), torch.device("cpu"), max_input=15)


def test_float_path_of_other_devices_is_exact_too() -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-127, 128, (64, 500), generator=g, dtype=torch.int8)
    x = torch.randint(0, 16, (33, 500), generator=g, dtype=torch.uint8)
    cpu = torch.device("cpu")
    fast = IntLinear.on(w, cpu, 15, signed=False)(x)
    plain = IntLinear.on(w, cpu, 15, signed=False, onednn=False)(x)
    assert torch.equal(fast, plain) and torch.equal(plain.double(), x.double() @ w.double().T)


def test_weights_are_deterministic_from_the_preset_seed() -> None:
    a, b = (SyntheticLM.build(get_preset("embedded:mini"), 0.5) for _ in range(2))
    ctx = random_contexts(a, 16)
    assert torch.equal(a.target_logits(ctx), b.target_logits(ctx))
    assert torch.equal(a.draft_logits(ctx), b.draft_logits(ctx))


@pytest.mark.parametrize("name", ["tiny", "mini"])
def test_logits_of_a_row_do_not_depend_on_the_batch(name: str) -> None:
    model = SyntheticLM.build(get_preset(f"embedded:{name}"), 1.0)
    ctx = random_contexts(model, 96)
    full_t, full_d = model.target_logits(ctx), model.draft_logits(ctx)  # [96, V]
    assert full_t.shape == (96, model.vocab_size) and torch.isfinite(full_t).all()
    for rows in ([5], [0, 1], list(range(7, 24)), list(range(90, 96)), list(range(0, 96, 3))):
        sub = ctx[rows]
        assert torch.equal(model.target_logits(sub), full_t[rows]), rows
        assert torch.equal(model.draft_logits(sub), full_d[rows]), rows


def sample_trajectory_stats(model: SyntheticLM, steps: int = 40, batch: int = 48):
    """Sample sequences from the target; per visited context, the target and draft distributions."""
    g = torch.Generator().manual_seed(2)
    seqs = torch.randint(1, model.vocab_size, (batch, model.context_window), generator=g)
    ps, qs = [], []
    for _ in range(steps):
        ctx = seqs[:, -model.context_window :]
        p, q = probs(model.target_logits(ctx)), probs(model.draft_logits(ctx))
        ps.append(p)
        qs.append(q)
        seqs = torch.cat([seqs, torch.multinomial(p, 1, generator=g)], dim=1)
    return torch.cat(ps), torch.cat(qs)


def test_target_has_a_peaked_head_and_a_long_tail() -> None:
    model = SyntheticLM.build(get_preset("embedded:mini"), 0.5)
    p, _ = sample_trajectory_stats(model)
    top1 = p.max(dim=-1).values
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
    assert 0.4 < float(top1.median()) < 0.97  # usually one clear favourite ...
    assert float((top1 < 0.3).float().mean()) > 0.05  # ... but a share of uncertain positions
    assert 0.3 < float(entropy.mean()) < 4.0
    assert bool((p > 0).all())  # every token keeps some mass: a tail, not a truncated head
    assert float(((p > 0) & (p < 1e-4)).float().mean()) > 0.5  # most of the vocabulary is tail


def test_draft_divergence_tunes_the_acceptance_rate() -> None:
    rates = []
    for divergence in (0.0, 0.5, 1.0, 3.0):
        p, q = sample_trajectory_stats(SyntheticLM.build(get_preset("embedded:mini"), divergence))
        rates.append(float(torch.minimum(p, q).sum(-1).mean()))  # sampled-draft acceptance = 1 - TV
    assert rates == sorted(rates, reverse=True), rates
    assert rates[0] > 0.88 and rates[-1] < 0.6, rates


def test_target_reads_far_more_weights_than_the_draft() -> None:
    for name in ("small", "large"):
        costs = weight_bytes(PRESETS[name])
        assert costs["target"] >= 10 * costs["draft"], (name, costs)
    assert weight_bytes(PRESETS["small"])["target"] > 256 * 2**20  # bigger than any cache: memory-bound
