"""Token-wise and block verification: they preserve the target distribution (chi-square, with a wrong
residual shown to fail), the closed form of token-wise acceptance, and block >= token-wise."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy import stats

from harness.verify import draw_uniforms, sample_from_probs, verifiers, verify_block, verify_tokenwise

VERIFIERS = {"token": verify_tokenwise, "block": verify_block}

# A tiny order-1 Markov target and a draft that differs from it: p(. | previous token).
P_CHAIN = torch.tensor(
    [
        [0.50, 0.30, 0.15, 0.05],
        [0.10, 0.20, 0.30, 0.40],
        [0.25, 0.25, 0.25, 0.25],
        [0.70, 0.05, 0.05, 0.20],
    ]
)
Q_CHAIN = torch.tensor(
    [
        [0.20, 0.40, 0.30, 0.10],
        [0.40, 0.30, 0.20, 0.10],
        [0.10, 0.60, 0.10, 0.20],
        [0.25, 0.25, 0.25, 0.25],
    ]
)


def draft_round(ctx: torch.Tensor, gamma: int, greedy: bool, g: torch.Generator):
    """Draft gamma tokens from the Q chain after `ctx`, and the target/draft rows of every prefix.

    ctx: [B] last token. -> target_probs [B, G+1, V], draft_tokens [B, G], draft_probs [B, G, V] | None.
    """
    last, tokens, q_rows, p_rows = ctx, [], [], []
    for _ in range(gamma):
        q = Q_CHAIN[last]
        x = q.argmax(dim=-1) if greedy else torch.multinomial(q, 1, generator=g).squeeze(-1)
        p_rows.append(P_CHAIN[last])
        q_rows.append(q)
        tokens.append(x)
        last = x
    p_rows.append(P_CHAIN[last])
    draft_probs = None if greedy else torch.stack(q_rows, dim=1)
    return torch.stack(p_rows, dim=1), torch.stack(tokens, dim=1), draft_probs


def first_two_tokens(verifier, n: int, gamma: int, greedy: bool, seed: int) -> torch.Tensor:
    """Emit tokens after context 0 until two are out; return the first two. -> [n, 2]."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.zeros(n, dtype=torch.long)
    target, drafts, q = draft_round(ctx, gamma, greedy, g)
    out = verifier(target, drafts, q, uniforms=torch.rand(n, gamma + 1, generator=g))
    first, second = out.tokens[:, 0], out.tokens[:, 1].clone()
    short = out.num_emitted < 2  # one token emitted: a second round from it
    if bool(short.any()):
        t2, d2, q2 = draft_round(first[short], gamma, greedy, g)
        out2 = verifier(t2, d2, q2, uniforms=torch.rand(int(short.sum()), gamma + 1, generator=g))
        second[short] = out2.tokens[:, 0]
    return torch.stack([first, second], dim=1)


def chi_square_pvalue(pairs: torch.Tensor) -> float:
    vocab = P_CHAIN.shape[0]
    counts = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab).double()
    joint = (P_CHAIN[0].unsqueeze(1) * P_CHAIN).reshape(-1).double()
    expected = joint / joint.sum() * pairs.shape[0]
    return float(stats.chisquare(counts.numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("name", ["token", "block"])
@pytest.mark.parametrize("greedy", [False, True])
def test_output_has_the_target_distribution(name, greedy):
    pairs = first_two_tokens(VERIFIERS[name], 60_000, gamma=3, greedy=greedy, seed=11)
    assert chi_square_pvalue(pairs) > 1e-3


@pytest.mark.parametrize("name", ["token", "block"])
def test_a_wrong_residual_is_caught(name, monkeypatch):
    """Sampling the correction from p instead of the residual biases the output: the test sees it."""
    monkeypatch.setattr(verifiers, "_residual", lambda scale, p_row, q_row, q_token: p_row)
    pairs = first_two_tokens(VERIFIERS[name], 60_000, gamma=3, greedy=False, seed=11)
    assert chi_square_pvalue(pairs) < 1e-6


# ---------------------------------------------------------------------------------------------
# expected accepted drafts, context-independent p and q
# ---------------------------------------------------------------------------------------------


def iid_round(p: torch.Tensor, q: torch.Tensor | None, n: int, gamma: int, g: torch.Generator):
    """Drafts i.i.d. from q (point mass at argmax q when `q` is a one-hot), target p at every position."""
    vocab = p.numel()
    target = p.expand(n, gamma + 1, vocab)
    drafts = torch.multinomial(q.expand(n, vocab), gamma, replacement=True, generator=g)
    return target, drafts, q.expand(n, gamma, vocab).contiguous()


def exact_block_expectation(p: list[float], q: list[float], gamma: int) -> float:
    """E[accepted drafts] of block verification by enumerating every draft block (Sun et al.'s h_i),
    written independently of the module with plain Python floats."""
    total = 0.0
    for xs in itertools.product(range(len(p)), repeat=gamma):
        weight = math.prod(q[x] for x in xs)
        if weight == 0:
            continue
        acc = [1.0]
        for x in xs:
            acc.append(min(1.0, acc[-1] * p[x] / q[x]))
        h = []
        for i in range(1, gamma):
            r = sum(max(acc[i] * px - qx, 0.0) for px, qx in zip(p, q, strict=True))
            denom = r + 1.0 - acc[i]
            h.append(r / denom if denom > 0 else 0.0)
        h.append(acc[gamma])
        expected_tau = sum((i + 1) * h[i] * math.prod(1 - hj for hj in h[i + 1 :]) for i in range(gamma))
        total += weight * expected_tau
    return total


def exact_token_expectation(p: list[float], q: list[float], gamma: int) -> float:
    alpha = sum(min(a, b) for a, b in zip(p, q, strict=True))
    return sum(alpha**i for i in range(1, gamma + 1))


def mc_accepted(verifier, p, q, gamma, n=100_000, seed=3) -> tuple[float, float]:
    g = torch.Generator().manual_seed(seed)
    target, drafts, qs = iid_round(torch.tensor(p), torch.tensor(q), n, gamma, g)
    out = verifier(target, drafts, qs, uniforms=torch.rand(n, gamma + 1, generator=g))
    acc = out.num_accepted.double()
    return float(acc.mean()), float(acc.std() / math.sqrt(n))


P_IID, Q_IID = [0.6, 0.3, 0.1], [0.2, 0.3, 0.5]


def test_tokenwise_matches_the_closed_form():
    gamma = 4
    mean, se = mc_accepted(verify_tokenwise, P_IID, Q_IID, gamma)
    assert abs(mean - exact_token_expectation(P_IID, Q_IID, gamma)) < 4 * se


def test_block_matches_its_exact_expectation_and_beats_tokenwise():
    gamma = 4
    exact_block = exact_block_expectation(P_IID, Q_IID, gamma)
    exact_token = exact_token_expectation(P_IID, Q_IID, gamma)
    assert exact_block > exact_token + 0.02  # theory: strictly better on this pair
    block_mean, block_se = mc_accepted(verify_block, P_IID, Q_IID, gamma)
    token_mean, token_se = mc_accepted(verify_tokenwise, P_IID, Q_IID, gamma)
    assert abs(block_mean - exact_block) < 4 * block_se
    assert block_mean - token_mean > 4 * math.hypot(block_se, token_se)


def test_block_is_never_below_tokenwise():
    g = torch.Generator().manual_seed(7)
    for _ in range(25):
        p = torch.distributions.Dirichlet(torch.ones(3)).sample().tolist()
        q = torch.distributions.Dirichlet(torch.full((3,), 0.7)).sample().tolist()
        for gamma in (1, 2, 3):
            assert exact_block_expectation(p, q, gamma) >= exact_token_expectation(p, q, gamma) - 1e-12
    del g


def test_point_mass_drafts_give_equal_expectations():
    gamma, n = 4, 100_000
    p = torch.tensor(P_IID)
    g = torch.Generator().manual_seed(5)
    target = p.expand(n, gamma + 1, 3)
    drafts = torch.zeros(n, gamma, dtype=torch.long)  # greedy draft: always token 0
    u = torch.rand(n, gamma + 1, generator=g)
    token = verify_tokenwise(target, drafts, None, uniforms=u).num_accepted.double()
    block = verify_block(target, drafts, None, uniforms=torch.rand(n, gamma + 1, generator=g)).num_accepted.double()
    exact = sum(P_IID[0] ** i for i in range(1, gamma + 1))
    onehot = [1.0, 0.0, 0.0]
    assert abs(exact_block_expectation(P_IID, onehot, gamma) - exact) < 1e-12
    se = math.hypot(token.std(), block.std()) / math.sqrt(n)
    assert abs(float(token.mean() - block.mean())) < 4 * se
    assert abs(float(token.mean()) - exact) < 4 * float(token.std()) / math.sqrt(n)


# ---------------------------------------------------------------------------------------------
# mechanics
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["token", "block"])
def test_generators_make_rows_independent_of_the_batch(name):
    """A row's result depends on its own generator only, not on its neighbours."""
    gamma, vocab = 3, 50
    torch.manual_seed(0)
    target = torch.softmax(torch.randn(6, gamma + 1, vocab), -1)
    q = torch.softmax(torch.randn(6, gamma, vocab), -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1).reshape(6, gamma)
    full = VERIFIERS[name](target, drafts, q, generators=[torch.Generator().manual_seed(100 + i) for i in range(6)])
    alone = VERIFIERS[name](target[2:3], drafts[2:3], q[2:3], generators=[torch.Generator().manual_seed(102)])
    assert torch.equal(full.tokens[2:3], alone.tokens) and torch.equal(full.num_accepted[2:3], alone.num_accepted)


def test_emitted_tokens_are_the_accepted_prefix_plus_one():
    gamma, vocab = 4, 30
    torch.manual_seed(1)
    target = torch.softmax(torch.randn(200, gamma + 1, vocab), -1)
    q = torch.softmax(torch.randn(200, gamma, vocab), -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1).reshape(200, gamma)
    for verifier in VERIFIERS.values():
        out = verifier(target, drafts, q, uniforms=torch.rand(200, gamma + 1))
        for r in range(200):
            n = int(out.num_accepted[r])
            assert torch.equal(out.tokens[r, :n], drafts[r, :n])
            assert 0 <= int(out.tokens[r, n]) < vocab
            assert bool((out.tokens[r, n + 1 :] == -1).all())


def test_bad_arguments_are_named():
    target, drafts = torch.rand(2, 3, 5), torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="exactly one"):
        verify_tokenwise(target, drafts, None)
    with pytest.raises(ValueError, match="target_probs"):
        verify_block(torch.rand(2, 2, 5), drafts, None, uniforms=torch.rand(2, 3))
    with pytest.raises(ValueError, match="uniforms has shape"):
        verify_block(target, drafts, None, uniforms=torch.rand(2, 2))


def test_sample_from_probs_never_picks_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).expand(5, 5)
    u = torch.tensor([0.0, 0.49999, 0.5, 0.99999994, 0.75])
    assert sample_from_probs(probs, u).tolist() == [1, 1, 3, 3, 3]
    assert sample_from_probs(probs[:1], torch.tensor([1.0])).tolist() == [3]  # overshoot: last token with mass
    gens = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)]
    a = draw_uniforms(gens, 4, "cpu")
    assert torch.equal(a[0], a[1]) and bool(((a >= 0) & (a < 1)).all())
