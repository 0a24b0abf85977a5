"""One decoding step, in process: speculative decoding is lossless at temperature 0, and a seeded
request gets the same tokens whatever batch it runs in (deterministic mode)."""

from __future__ import annotations

import itertools

import pytest
import torch

from harness.engine.model import SyntheticLM
from harness.engine.worker import BatchInput, Worker, WorkerConfig
from harness.models.presets import get_preset

GAMMA = 5


@pytest.fixture(scope="module")
def model() -> SyntheticLM:
    return SyntheticLM.build(get_preset("embedded:mini"), 1.0)


def generate(
    model: SyntheticLM,
    config: WorkerConfig,
    prompts: list[list[int]],
    seeds: list[int],
    n_tokens: int,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
) -> list[list[int]]:
    """Run prefill + decode steps until every sequence has n_tokens outputs; what the scheduler does."""
    worker = Worker(model, config)
    seqs, outs = [list(p) for p in prompts], [[] for _ in prompts]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    n = len(prompts)

    def batch() -> BatchInput:
        return BatchInput(
            [model.windows(s) for s in seqs], [temperature] * n, [top_k] * n, [top_p] * n, [0.0] * n, gens
        )

    step = worker.prefill
    while min(len(o) for o in outs) < n_tokens:
        result = step(batch())
        for seq, out, tokens in zip(seqs, outs, result.tokens, strict=True):
            seq += tokens
            out += tokens
        step = worker.decode
    return [o[:n_tokens] for o in outs]


PROMPTS = [[5, 6, 7], [100, 200], [9], [1500, 3, 3, 3]]


@pytest.mark.parametrize("draft_mode, block", list(itertools.product(["greedy", "sampled"], [False, True])))
def test_temperature_zero_speculation_equals_plain_greedy(model, draft_mode: str, block: bool) -> None:
    plain = generate(model, WorkerConfig(0, "greedy", False, "full_vocab", False), PROMPTS, [0] * 4, 60, 0.0)
    spec = generate(model, WorkerConfig(GAMMA, draft_mode, block, "full_vocab", False), PROMPTS, [1] * 4, 60, 0.0)
    assert spec == plain


@pytest.mark.parametrize(
    "gamma, draft_mode, block",
    [(0, "greedy", False), (GAMMA, "sampled", False), (GAMMA, "sampled", True), (GAMMA, "greedy", True)],
)
def test_seeded_request_is_independent_of_its_batch(model, gamma: int, draft_mode: str, block: bool) -> None:
    config = WorkerConfig(gamma, draft_mode, block, "full_vocab", deterministic=True)
    kwargs = {"temperature": 1.0, "top_k": 20, "top_p": 0.95}
    alone = generate(model, config, [[5, 6, 7]], [42], 50, **kwargs)[0]
    others = [[i, i + 1] for i in range(10, 40)]
    crowd = generate(
        model,
        config,
        others[:13] + [[5, 6, 7]] + others[13:],
        list(range(13)) + [42] + list(range(13, 30)),
        50,
        **kwargs,
    )[13]
    assert crowd == alone
    assert generate(model, config, [[5, 6, 7]], [43], 50, **kwargs)[0] != alone  # the seed matters


def test_speculative_step_emits_accepted_prefix_plus_one(model) -> None:
    worker = Worker(model, WorkerConfig(GAMMA, "sampled", False, "full_vocab", False))
    gens = [torch.Generator().manual_seed(i) for i in range(16)]
    batch = BatchInput(
        [model.windows([i, 2 * i]) for i in range(16)], [1.0] * 16, [-1] * 16, [1.0] * 16, [0.0] * 16, gens
    )
    out = worker.decode(batch)
    assert out.num_accepted is not None and len(out.tokens) == 16
    for tokens, n in zip(out.tokens, out.num_accepted, strict=True):
        assert 0 <= n <= GAMMA and len(tokens) == n + 1
        assert all(0 <= t < model.vocab_size for t in tokens)
    assert len({len(t) for t in out.tokens}) > 1  # acceptance varies across rows


@pytest.mark.parametrize("draft_mode, block", [("sampled", False), ("sampled", True), ("greedy", True)])
def test_the_sparse_verify_path_emits_the_dense_paths_tokens(model, draft_mode: str, block: bool) -> None:
    """--verify-path sparse: each row's top-k entries instead of a dense target, the sparse verifiers; with the
    same seeds a request gets the dense path's tokens (the coins agree: no rounding tie in these 4 x 80)."""
    kwargs = {"temperature": 1.0, "top_k": 20, "top_p": 0.95}
    dense = generate(
        model, WorkerConfig(GAMMA, draft_mode, block, "full_vocab", True), PROMPTS, [3, 4, 5, 6], 80, **kwargs
    )
    sparse = generate(
        model,
        WorkerConfig(GAMMA, draft_mode, block, "full_vocab", True, verify_path="sparse"),
        PROMPTS,
        [3, 4, 5, 6],
        80,
        **kwargs,
    )
    assert sparse == dense
    greedy = generate(
        model,
        WorkerConfig(GAMMA, draft_mode, block, "full_vocab", False, verify_path="sparse"),
        PROMPTS,
        [1] * 4,
        40,
        0.0,
    )
    plain = generate(model, WorkerConfig(0, "greedy", False, "full_vocab", False), PROMPTS, [0] * 4, 40, 0.0)
    assert greedy == plain  # lossless at temperature 0 on the sparse path too


def test_an_unknown_verify_path_is_named(model) -> None:
    with pytest.raises(ValueError, match="verify_path 'sparce'"):
        Worker(model, WorkerConfig(GAMMA, "sampled", False, "full_vocab", False, verify_path="sparce"))
