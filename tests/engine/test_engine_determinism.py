"""With --enable-deterministic-inference a request with a `sampling_seed` gets exactly the same tokens
whether it runs alone or among 31 others (SGLang's promise); the seed still matters."""

from __future__ import annotations

import re

import pytest
from serverutil import engine_server, generate_concurrently, get_json, post_json

pytestmark = pytest.mark.slow

SAMPLING = {"temperature": 1.0, "top_k": 20, "top_p": 0.95, "max_new_tokens": 64, "ignore_eos": True}
SPEC = ["--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "6", "--draft-mode", "sampled"]


def body(i: int, seed: int) -> dict:
    return {
        "text": f"Problem {i}: how many primes are below {10 * i + 7}?",
        "sampling_params": {**SAMPLING, "sampling_seed": seed},
    }


@pytest.mark.parametrize(
    "algorithm_args",
    [[], SPEC, [*SPEC, "--speculative-use-block-verification"]],
    ids=["none", "dflash-token", "dflash-block"],
)
def test_seeded_outputs_do_not_depend_on_concurrency(algorithm_args: list[str]) -> None:
    args = [
        "--model-path",
        "embedded:mini",
        "--enable-deterministic-inference",
        "--max-running-requests",
        "32",
        "--decode-log-interval",
        "4",
        *algorithm_args,
    ]
    with engine_server(args) as server:
        assert get_json(server.url + "/server_info")["enable_deterministic_inference"] is True
        probes = [body(i, 1000 + i) for i in range(4)]
        alone = [post_json(server.url + "/generate", b)[1]["output_ids"] for b in probes]
        fillers = [body(100 + i, i) for i in range(28)]
        mixed = generate_concurrently(server.url, fillers[:14] + probes + fillers[14:], concurrency=32)
        assert [m["output_ids"] for m in mixed[14:18]] == alone
        other_seed = post_json(server.url + "/generate", body(0, 7))[1]["output_ids"]
        assert other_seed != alone[0]
        batch_sizes = [int(n) for n in re.findall(r"#running-req: (\d+)", server.log_text())]
        assert max(batch_sizes) >= 16  # the probes really ran inside a large batch


def test_fold_seed_mixes_the_high_word():
    """Seeds 2**32 apart (two seed streams) must give different generator seeds; low seeds are kept."""
    from harness.engine.service import fold_seed  # noqa: PLC0415

    assert [fold_seed(s) for s in (0, 1, 980406, 2**32 - 1)] == [0, 1, 980406, 2**32 - 1]
    assert fold_seed(980406 + 2**32) != fold_seed(980406)
    assert len({fold_seed(7 + k * 2**32) for k in range(64)}) == 64
