"""The sparse verify path (harness/verify/sparse.py): the sparse builder is topk_first without its zeros, the
sparse verifiers make the dense verifiers' decisions row for row with the same coins, and they preserve the
target distribution (chi-square, with a wrong residual shown to fail)."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from harness.micro.families import make_family
from harness.verify import (
    block_weights,
    full_vocab_probs,
    topk_first_probs,
    verify_block,
    verify_tokenwise,
)
from harness.verify import sparse as sp
from harness.verify.sparse import SparseProbs, sparse_probs

DENSE = {"token": verify_tokenwise, "block": verify_block}
SPARSE = {"token": sp.verify_tokenwise_sparse, "block": sp.verify_block_sparse}


def mixed_params(n: int, whole_vocab: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of every kind: greedy (T 0, top_k 1), top_k 20 / top_p 0.95, top_k 5 / top_p 0.5, top_k 64 /
    top_p 1, and (whole_vocab) top_k -1 / top_p 0.9."""
    kinds = [(0.0, 20, 1.0), (1.0, 1, 1.0), (1.0, 20, 0.95), (0.7, 5, 0.5), (1.3, 64, 1.0)]
    if whole_vocab:
        kinds.append((1.0, -1, 0.9))
    rows = [kinds[i % len(kinds)] for i in range(n)]
    return (torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]), torch.tensor([r[2] for r in rows]))


@pytest.mark.parametrize("family", ["iid", "sorted", "bf16", "padding", "clustered"])
@pytest.mark.parametrize("whole_vocab", [False, True], ids=["topk", "with-whole-vocab-rows"])
def test_the_sparse_builder_is_topk_first_without_its_zeros(family, whole_vocab):
    logits = make_family(family, 24, 4096, seed=1, device=torch.device("cpu"))
    t, k, p = mixed_params(24, whole_vocab)
    got = sparse_probs(logits, t, k, p)
    assert got.width == (4096 if whole_vocab else 64)  # the batch's largest top_k
    assert torch.equal(got.densify(), topk_first_probs(logits, t, k, p))  # bitwise, zeros and all
    kept = got.ids < 4096
    assert torch.equal(kept, got.values > 0)  # entries first, then padding (id V, value 0)
    assert bool((got.ids[:, 1:] >= got.ids[:, :-1]).all())  # ids ascending
    assert torch.equal(kept.sum(dim=-1), (topk_first_probs(logits, t, k, p) > 0).sum(dim=-1))


def test_sparse_probs_round_trip_and_lookups():
    dense = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 1.0, 0.0]])
    s = SparseProbs.from_dense(dense)
    assert s.width == 4 and torch.equal(s.densify(), dense)
    assert s.at(torch.tensor([1, 3, 0])).tolist() == [0.5, 0.25, 0.0]
    assert SparseProbs.from_dense(dense[[0, 2]]).ids.tolist() == [[1, 3], [2, 4]]  # padded with id V
    with pytest.raises(ValueError, match="width 1 is below"):
        SparseProbs.from_dense(dense, width=1)


def random_case(n: int, vocab: int, gamma: int, draft: str, seed: int, near: float | None = None):
    """A batch of verify steps: the target built by full_vocab (top_k 8, top_p 0.9, T 0.8: sparse), drafts
    from another distribution (dense, top_k 16) or point masses at its argmax; one coin per position. The
    draft's logits are independent of the target's, or (near) the target's plus `near` x Gaussian noise, so
    that acceptances, rejections and bonus tokens all happen."""
    g = torch.Generator().manual_seed(seed)
    rows = n * (gamma + 1)
    ones = torch.ones(rows)
    logits = torch.randn(rows, vocab, generator=g) * 2
    target = full_vocab_probs(logits, ones * 0.8, torch.full((rows,), 8), ones * 0.9).view(n, gamma + 1, vocab)
    qrows = n * gamma
    if near is None:
        q_logits = torch.randn(qrows, vocab, generator=g) * 2
    else:
        q_logits = (
            logits.view(n, gamma + 1, vocab)[:, :gamma] + near * torch.randn(n, gamma, vocab, generator=g)
        ).reshape(qrows, vocab)
    q = full_vocab_probs(q_logits, torch.ones(qrows), torch.full((qrows,), 16), torch.ones(qrows)).view(n, gamma, vocab)
    if draft == "greedy":
        drafts, q_arg = q.argmax(dim=-1), None
    else:
        drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(n, gamma)
        q_arg = q
    return target, drafts, q_arg, torch.rand(n, gamma + 1, generator=g)


@pytest.mark.parametrize("name", ["token", "block"])
@pytest.mark.parametrize("draft", ["greedy", "dense-q", "sparse-q"])
def test_the_sparse_verifiers_make_the_dense_decisions(name, draft):
    """4,000 steps of gamma 5 over 256 ids: the same accepted counts and emitted tokens as the dense verifier
    with the same coins, but where a block-verification coin lies within float32 rounding of h_i (the
    residual's total summed over K entries instead of V): none such here, and none differs otherwise."""
    target, drafts, q, u = random_case(4000, 256, 5, "greedy" if draft == "greedy" else "sampled", seed=7)
    dense = DENSE[name](target, drafts, q, uniforms=u)
    q_sparse = SparseProbs.from_dense(q) if draft == "sparse-q" else q
    got = SPARSE[name](SparseProbs.from_dense(target), drafts, q_sparse, uniforms=u)
    differ = (got.num_accepted != dense.num_accepted) | (got.tokens != dense.tokens).any(dim=-1)
    if name == "block":
        _, h = block_weights(target, drafts, q)
        close = ((u[:, :5] - h).abs() < 1e-6).any(dim=-1)
        assert not bool((differ & ~close).any())
    assert int(differ.sum()) == 0
    assert 0 < float(dense.num_accepted.float().mean()) < 5  # rejections and acceptances both happen


def test_the_sparse_block_weights_equal_the_dense_ones_to_rounding():
    target, drafts, q, _ = random_case(2000, 256, 5, "sampled", seed=8)
    p_d, h_d = block_weights(target, drafts, q)
    p_s, h_s = sp.block_weights_sparse(SparseProbs.from_dense(target), drafts, SparseProbs.from_dense(q))
    assert torch.equal(p_d, p_s)  # the same float32 products
    assert float((h_d - h_s).abs().max()) < 1e-6


def test_seeded_generators_give_the_dense_outputs():
    target, drafts, q, _ = random_case(64, 128, 4, "sampled", seed=9)
    gens = [torch.Generator().manual_seed(100 + i) for i in range(64)]
    gens2 = [torch.Generator().manual_seed(100 + i) for i in range(64)]
    a = verify_tokenwise(target, drafts, q, generators=gens)
    b = sp.verify_tokenwise_sparse(SparseProbs.from_dense(target), drafts, q, generators=gens2)
    assert torch.equal(a.tokens, b.tokens)


def test_bad_shapes_are_named():
    target, drafts, q, u = random_case(4, 32, 3, "sampled", seed=1)
    s = SparseProbs.from_dense(target)
    with pytest.raises(ValueError, match=r"must be \[B, G\+1, K\]"):
        sp.verify_block_sparse(s.select((slice(None), slice(0, 3))), drafts, q, uniforms=u)
    with pytest.raises(ValueError, match=r"draft_probs .* must be \[B, G, V\]"):
        sp.verify_tokenwise_sparse(s, drafts, q[:, :, :16], uniforms=u)
    with pytest.raises(ValueError, match="exactly one"):
        sp.verify_tokenwise_sparse(s, drafts, q)


@pytest.mark.parametrize("bad", ["nan logits", "top_p 0"])
@pytest.mark.parametrize("block", [True, False])
def test_a_target_row_without_mass_is_an_error_not_a_made_up_token(bad, block):
    """Dense and sparse alike: no token can be sampled from a row without probability mass (the sparse path once
    returned the padding id V, the dense one token 0)."""
    bsz, gamma, vocab = 2, 3, 32
    logits = torch.randn(bsz * (gamma + 1), vocab, generator=torch.Generator().manual_seed(0))
    temperature, top_k, top_p = torch.ones(len(logits)), torch.full((len(logits),), 5), torch.ones(len(logits))
    if bad == "nan logits":
        logits[:] = float("nan")
    else:
        top_p[:] = 0.0
    drafts, coins = torch.zeros(bsz, gamma, dtype=torch.long), torch.rand(bsz, gamma + 1)
    with pytest.raises(ValueError, match="has no probability mass"):
        sp.verify_step(logits, temperature, top_k, top_p, drafts, None, block=block, fused=False, uniforms=coins)
    target = full_vocab_probs(logits, temperature, top_k, top_p).view(bsz, gamma + 1, vocab)
    with pytest.raises(ValueError, match="has no probability mass"):
        (verify_block if block else verify_tokenwise)(target, drafts, None, uniforms=coins)


# ---------------------------------------------------------------------------------------------
# the target distribution is preserved: an order-1 Markov target with 3 of 6 tokens possible after each
# token (as after top-k), a full-support draft (so that drafts fall outside the target's support)
# ---------------------------------------------------------------------------------------------

P_CHAIN = torch.tensor(
    [
        [0.50, 0.00, 0.30, 0.00, 0.20, 0.00],
        [0.00, 0.40, 0.00, 0.35, 0.25, 0.00],
        [0.60, 0.00, 0.00, 0.10, 0.00, 0.30],
        [0.00, 0.20, 0.50, 0.00, 0.00, 0.30],
        [0.25, 0.25, 0.00, 0.00, 0.50, 0.00],
        [0.00, 0.00, 0.45, 0.45, 0.00, 0.10],
    ]
)
Q_CHAIN = torch.full((6, 6), 1.0 / 12) + 0.5 * torch.eye(6).roll(1, dims=1)


def draft_round(ctx: torch.Tensor, gamma: int, g: torch.Generator):
    last, tokens, q_rows, p_rows = ctx, [], [], []
    for _ in range(gamma):
        q = Q_CHAIN[last]
        x = torch.multinomial(q, 1, generator=g).squeeze(-1)
        p_rows.append(P_CHAIN[last])
        q_rows.append(q)
        tokens.append(x)
        last = x
    p_rows.append(P_CHAIN[last])
    return SparseProbs.from_dense(torch.stack(p_rows, dim=1)), torch.stack(tokens, dim=1), torch.stack(q_rows, dim=1)


def first_two_tokens(verifier, n: int, gamma: int, seed: int, sparse_q: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)

    def step(ctx):
        target, drafts, q = draft_round(ctx, gamma, g)
        assert target.width == 3  # the sparse path proper: 3 entries of 6
        q_arg = SparseProbs.from_dense(q) if sparse_q else q
        return verifier(target, drafts, q_arg, uniforms=torch.rand(len(ctx), gamma + 1, generator=g))

    out = step(torch.zeros(n, dtype=torch.long))
    first, second = out.tokens[:, 0], out.tokens[:, 1].clone()
    short = out.num_emitted < 2
    if bool(short.any()):
        second[short] = step(first[short]).tokens[:, 0]
    return torch.stack([first, second], dim=1)


def chi_square(pairs: torch.Tensor) -> tuple[int, float]:
    """(pairs the target excludes, the chi-square p-value of the others against the target's joint)."""
    vocab = P_CHAIN.shape[0]
    counts = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab).double()
    joint = (P_CHAIN[0].unsqueeze(1) * P_CHAIN).reshape(-1).double()
    possible = joint > 0
    expected = joint[possible] / joint.sum() * int(counts[possible].sum())
    return int(counts[~possible].sum()), float(stats.chisquare(counts[possible].numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("name", ["token", "block"])
@pytest.mark.parametrize("sparse_q", [False, True], ids=["dense-q", "sparse-q"])
def test_the_sparse_output_has_the_target_distribution(name, sparse_q):
    excluded, pvalue = chi_square(first_two_tokens(SPARSE[name], 60_000, gamma=3, seed=11, sparse_q=sparse_q))
    assert excluded == 0 and pvalue > 1e-3


@pytest.mark.parametrize("name", ["token", "block"])
def test_a_wrong_sparse_residual_is_caught(name, monkeypatch):
    """Sampling the correction from p instead of the residual biases the output: the test sees it (block
    verification then even emits drafts the target excludes: its h_i no longer falls to 0 after one)."""
    monkeypatch.setattr(sp, "_residual", lambda scale, p, q, q_token: p.values)
    excluded, pvalue = chi_square(first_two_tokens(SPARSE[name], 60_000, gamma=3, seed=11, sparse_q=False))
    assert pvalue < 1e-6
    assert (excluded > 0) == (name == "block")
