"""The verify API checks its arguments at the entry of each public function: a bad one is a ValueError naming it
(float draft ids, ids outside the vocabulary, tensors on different devices, B = 0, a vocabulary of 0, coins
outside [0, 1)), not torch's error from deep inside; and the sparse verifiers never emit an id outside the
vocabulary, even where the values are not checked (on a GPU: it would cost a synchronisation)."""

from __future__ import annotations

import pytest
import torch

from harness import verify
from harness.verify import checks
from harness.verify.sparse import (
    SparseProbs,
    block_weights_sparse,
    fused_sparse_probs,
    sparse_probs,
    verify_block_sparse,
    verify_step,
    verify_tokenwise_sparse,
)

V, B, G = 40, 3, 4
ROWS = B * (G + 1)


def inputs(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, V, generator=g)
    params = (torch.ones(ROWS), torch.full((ROWS,), 10), torch.full((ROWS,), 0.95))
    dense = verify.topk_first_probs(logits, *params).view(B, G + 1, V)
    s = sparse_probs(logits, *params)
    target = SparseProbs(s.values.view(B, G + 1, -1), s.ids.view(B, G + 1, -1), V)
    return {
        "logits": logits,
        "params": params,
        "dense": dense,
        "target": target,
        "drafts": torch.randint(0, V, (B, G), generator=g),
        "u": torch.rand(B, G + 1, generator=g),
    }


def dense_calls(x: dict, drafts, u):
    return {
        "verify_tokenwise": lambda: verify.verify_tokenwise(x["dense"], drafts, None, uniforms=u),
        "verify_block": lambda: verify.verify_block(x["dense"], drafts, None, uniforms=u),
        "block_weights": lambda: verify.block_weights(x["dense"], drafts, None),
    }


def sparse_calls(x: dict, drafts, u):
    return {
        "verify_tokenwise_sparse": lambda: verify_tokenwise_sparse(x["target"], drafts, None, uniforms=u),
        "verify_block_sparse": lambda: verify_block_sparse(x["target"], drafts, None, uniforms=u),
        "block_weights_sparse": lambda: block_weights_sparse(x["target"], drafts, None),
        "verify_step": lambda: verify_step(
            x["logits"], *x["params"], drafts, None, block=True, fused=False, uniforms=u
        ),
        "verify_step tokenwise fused": lambda: verify_step(
            x["logits"], *x["params"], drafts, None, block=False, fused=True, uniforms=u
        ),
    }


BAD_DRAFTS = {
    "float ids": (lambda d: d.float(), "draft_tokens has dtype torch.float32: token ids are an integer tensor"),
    "an id of V": (
        lambda d: d.index_put((torch.tensor([1]), torch.tensor([2])), torch.tensor(V)),
        f"draft_tokens[1, 2] = {V} is outside the vocabulary [0, {V})",
    ),
    "a negative id": (
        lambda d: d.index_put((torch.tensor([0]), torch.tensor([0])), torch.tensor(-3)),
        f"draft_tokens[0, 0] = -3 is outside the vocabulary [0, {V})",
    ),
    "another device": (lambda d: d.to("meta"), "draft_tokens is on meta but"),
    "one dimension": (lambda d: d[0], "draft_tokens has shape (4,); expected [B, G]"),
}


@pytest.mark.parametrize("bad", list(BAD_DRAFTS))
def test_bad_draft_tokens_are_named_by_every_verifier(bad):
    x = inputs()
    change, says = BAD_DRAFTS[bad]
    drafts = change(x["drafts"])
    for call in {**dense_calls(x, drafts, x["u"]), **sparse_calls(x, drafts, x["u"])}.values():
        with pytest.raises(ValueError) as raised:
            call()
        assert str(raised.value).startswith(says), str(raised.value)


def test_an_empty_batch_and_an_empty_vocabulary_are_named():
    x = inputs()
    with pytest.raises(ValueError, match="draft_tokens has B = 0 rows"):
        verify.verify_block(x["dense"][:0], x["drafts"][:0], None, uniforms=x["u"][:0])
    with pytest.raises(ValueError, match="draft_tokens has B = 0 rows"):
        verify_step(
            x["logits"][:0],
            *[p[:0] for p in x["params"]],
            x["drafts"][:0],
            None,
            block=True,
            fused=False,
            uniforms=x["u"][:0],
        )
    empty = torch.zeros(ROWS, 0)
    for builder in (*verify.BUILDERS.values(), sparse_probs, fused_sparse_probs):
        with pytest.raises(ValueError, match="logits has a vocabulary of 0 ids"):
            builder(empty, *x["params"])
    with pytest.raises(ValueError, match="logits has a vocabulary of 0 ids"):
        verify_step(empty, *x["params"], x["drafts"], None, block=True, fused=False, uniforms=x["u"])
    with pytest.raises(ValueError, match="target_probs has a vocabulary of 0 ids"):
        verify.verify_tokenwise(x["dense"][..., :0], x["drafts"], None, uniforms=x["u"])
    with pytest.raises(ValueError, match="probs has a vocabulary of 0 ids"):
        verify.sample_from_probs(torch.zeros(2, 0), torch.rand(2))
    assert verify.full_vocab_probs(x["logits"][:0], *[p[:0] for p in x["params"]]).shape == (0, V)  # an empty batch


def test_a_dense_draft_q_on_another_device_and_coins_outside_0_1_are_named():
    x = inputs()
    q = torch.full((B, G, V), 1 / V)
    with pytest.raises(ValueError, match="draft_probs is on meta but target_probs on cpu"):
        verify.verify_block(x["dense"], x["drafts"], q.to("meta"), uniforms=x["u"])
    for coin in (-0.5, 1.0, float("nan")):
        u = x["u"].clone()
        u[2, 1] = coin
        calls = {**dense_calls(x, x["drafts"], u), **sparse_calls(x, x["drafts"], u)}
        for name, call in calls.items():
            if name.startswith("block_weights"):
                continue  # (no coins)
            with pytest.raises(ValueError, match=rf"^uniforms\[2, 1\] = {coin} is outside \[0, 1\)"):
                call()


def test_the_sparse_verifiers_never_emit_an_id_outside_the_vocabulary(monkeypatch):
    """Where the values are not checked (a GPU: monkeypatched here), negative coins accept any draft of the
    dense verifiers' kind; the sparse verifiers still never emit a draft outside [0, V) (it emitted them)."""
    monkeypatch.setattr(checks, "values_checked", lambda t: False)
    for seed in range(20):
        x = inputs(seed)
        drafts = x["drafts"].clone()
        drafts[:, seed % G] = V + seed  # one draft outside the vocabulary in every step
        drafts[0, 0] = -1 - seed
        u = x["u"].clone()
        u[:, :G] = -0.5  # coins below 0 accept everything they may
        for block in (True, False):
            out = verify_step(x["logits"], *x["params"], drafts, None, block=block, fused=False, uniforms=u)
            assert bool(((out.tokens >= -1) & (out.tokens < V)).all()), (seed, block, out.tokens)
            emitted = out.tokens[out.tokens >= 0]
            assert bool(((emitted >= 0) & (emitted < V)).all())
    in_range = inputs(1)
    out = verify_step(
        in_range["logits"],
        *in_range["params"],
        in_range["drafts"],
        None,
        block=True,
        fused=False,
        uniforms=in_range["u"],
    )
    ref = verify.verify_block(in_range["dense"], in_range["drafts"], None, uniforms=in_range["u"])
    assert torch.equal(out.tokens, ref.tokens)  # the guard changes nothing for valid drafts


def test_a_sparse_target_with_ids_outside_the_vocabulary_is_named():
    x = inputs()
    t = x["target"]
    bad = SparseProbs(t.values, t.ids.clone(), V)
    bad.ids[0, 0, 0] = V + 9
    with pytest.raises(ValueError, match=f"target.ids holds {V + 9}, outside \\[0, {V}\\]"):
        verify_block_sparse(bad, x["drafts"], None, uniforms=x["u"])
    with pytest.raises(ValueError, match="target.ids has dtype torch.float32"):
        verify_block_sparse(SparseProbs(t.values, t.ids.float(), V), x["drafts"], None, uniforms=x["u"])
