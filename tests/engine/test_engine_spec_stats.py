"""Speculative decoding through the whole server (HTTP in, tokens out):

- with sampled drafts, block verification accepts more per step than token-wise (Sun et al.);
- with greedy (point-mass) drafts the two agree within sampling error, and the server warns;
- the output has the target model's distribution: a chi-square test on a 4-token vocabulary, with the
  same samples shown to reject what an always-accepting or wrong-residual verifier would produce.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy import stats
from serverutil import engine_server, generate_concurrently, post_json

from harness.engine.model import SyntheticLM
from harness.models.presets import get_preset

pytestmark = pytest.mark.slow

MINI = [
    "--model-path",
    "embedded:mini",
    "--speculative-algorithm",
    "DFLASH",
    "--speculative-num-draft-tokens",
    "8",
    "--draft-divergence",
    "1.0",
    "--max-running-requests",
    "64",
]


def accepted_per_step(args: list[str], n_requests: int = 96, max_new_tokens: int = 384) -> tuple[float, float]:
    """Correct drafts per verify step over the requests, and its standard error (requests as units)."""
    bodies = [
        {
            "input_ids": [i + 3, 2 * i + 5, 7],
            "sampling_params": {"temperature": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        }
        for i in range(n_requests)
    ]
    with engine_server(args) as server:
        replies = generate_concurrently(server.url, bodies, concurrency=n_requests)
        log = server.log_text()
    c = torch.tensor([r["meta_info"]["spec_num_correct_drafts"] for r in replies], dtype=torch.float64)
    v = torch.tensor([r["meta_info"]["spec_verify_ct"] for r in replies], dtype=torch.float64)
    ratio = float(c.sum() / v.sum())
    se = float(((c - ratio * v).pow(2).sum() / (n_requests * (n_requests - 1))).sqrt() / v.mean())
    accepted_per_step.last_log = log
    return ratio, se


def test_block_verification_accepts_more_with_sampled_drafts() -> None:
    token, se_t = accepted_per_step([*MINI, "--draft-mode", "sampled"])
    block, se_b = accepted_per_step([*MINI, "--draft-mode", "sampled", "--speculative-use-block-verification"])
    z = (block - token) / math.hypot(se_t, se_b)
    assert z > 3, f"block {block:.3f} +- {se_b:.3f} vs token {token:.3f} +- {se_t:.3f} (z = {z:.1f})"


def test_greedy_drafts_make_block_and_token_agree() -> None:
    token, se_t = accepted_per_step([*MINI, "--draft-mode", "greedy"], n_requests=64, max_new_tokens=256)
    block, se_b = accepted_per_step(
        [*MINI, "--draft-mode", "greedy", "--speculative-use-block-verification"], n_requests=64, max_new_tokens=256
    )
    assert "--speculative-use-block-verification has no effect for this DFLASH draft" in accepted_per_step.last_log
    assert "sampling_enabled=False" in accepted_per_step.last_log  # the Resolved config line
    assert "DFLASH draft greedy head folded into the draft cuda graph" in accepted_per_step.last_log
    z = (block - token) / math.hypot(se_t, se_b)
    assert abs(z) < 4, f"block {block:.3f} +- {se_b:.3f} vs token {token:.3f} +- {se_t:.3f} (z = {z:.1f})"


# ---------------------------------------------------------------------- the output distribution

TINY_DIVERGENCE = 1.5
PROMPT = [1, 2, 3]
N_SAMPLES = 3000


def joint_distributions() -> dict[str, dict[tuple[int, ...], float]]:
    """Exact P(t1, t2, t3) after PROMPT: the target's, and what wrong verifiers would produce.

    t1 always comes from the target (prefill); t2, t3 from the first verify step. 'always_accept' emits
    the drafts: t2 ~ q, t3 ~ q. 'wrong_residual' resamples a rejected t2 from p instead of
    norm(max(p - q, 0)): P(t2) = min(p, q) + (1 - sum min(p, q)) p (only (t1, t2) is scored for it).
    """
    model = SyntheticLM.build(get_preset("embedded:tiny"), TINY_DIVERGENCE)
    vocab = model.vocab_size

    def dist(context: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        window = torch.tensor([model.windows(context)])
        return (
            torch.softmax(model.target_logits(window)[0].double(), -1),
            torch.softmax(model.draft_logits(window)[0].double(), -1),
        )

    out: dict[str, dict] = {"target": {}, "always_accept": {}, "wrong_residual": {}}
    for t1, t2, t3 in itertools.product(range(vocab), repeat=3):
        p1, _ = dist(PROMPT)
        p2, q2 = dist([*PROMPT, t1])
        p3, q3 = dist([*PROMPT, t1, t2])
        out["target"][(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
        out["always_accept"][(t1, t2, t3)] = float(p1[t1] * q2[t2] * q3[t3])
        overlap = torch.minimum(p2, q2)
        wrong = overlap + (1 - overlap.sum()) * p2
        out["wrong_residual"][(t1, t2)] = float(p1[t1] * wrong[t2])
    return out


def chi_square_p(counts: dict[tuple, int], probs: dict[tuple, float]) -> float:
    """Pearson's test of counts against probs, cells with expected < 5 pooled into one."""
    n = sum(counts.values())
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for cell, p in probs.items():
        if n * p < 5:
            pool_o, pool_e = pool_o + counts.get(cell, 0), pool_e + n * p
        else:
            obs.append(counts.get(cell, 0))
            exp.append(n * p)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.fixture(scope="module")
def distributions() -> dict[str, dict[tuple[int, ...], float]]:
    return joint_distributions()


@pytest.mark.parametrize("verifier", [[], ["--speculative-use-block-verification"]], ids=["token", "block"])
def test_speculative_output_has_the_target_distribution(distributions, verifier: list[str]) -> None:
    args = [
        "--model-path",
        "embedded:tiny",
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-num-draft-tokens",
        "4",
        "--draft-mode",
        "sampled",
        "--draft-divergence",
        str(TINY_DIVERGENCE),
        "--max-running-requests",
        "256",
        *verifier,
    ]
    body = {
        "input_ids": [PROMPT] * N_SAMPLES,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 3, "ignore_eos": True},
    }
    with engine_server(args) as server:
        status, replies = post_json(server.url + "/generate", body)
    assert status == 200, replies
    triples = [tuple(r["output_ids"]) for r in replies]
    assert all(len(t) == 3 for t in triples)
    counts3 = {cell: triples.count(cell) for cell in set(triples)}
    pairs = [t[:2] for t in triples]
    counts2 = {cell: pairs.count(cell) for cell in set(pairs)}
    assert chi_square_p(counts3, distributions["target"]) > 1e-3
    # the test has the power to see a wrong verifier in these very samples
    assert chi_square_p(counts3, distributions["always_accept"]) < 1e-6
    assert chi_square_p(counts2, distributions["wrong_residual"]) < 1e-6
