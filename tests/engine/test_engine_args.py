"""Flags of `python -m harness.engine`: SGLang's names, aliases, and errors that say what is wrong."""

from __future__ import annotations

import asyncio

import pytest

from harness.engine import service as service_mod
from harness.engine.args import DEFAULT_NUM_DRAFT_TOKENS, parse_args

BASE = ["--model-path", "embedded:mini"]


def error_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_defaults_are_plain_decoding_on_loopback() -> None:
    args = parse_args(BASE)
    assert args.host == "127.0.0.1"
    assert args.speculative_algorithm is None and args.gamma == 0 and not args.speculative
    assert not args.enable_deterministic_inference and not args.sampling_enabled
    assert args.vocab_size == 2048


def test_sglang_speculative_flags() -> None:
    args = parse_args(
        [
            *BASE,
            "--speculative-algorithm",
            "DFLASH",
            "--speculative-num-draft-tokens",
            "5",
            "--speculative-use-block-verification",
            "--draft-mode",
            "sampled",
            "--max-running-requests",
            "7",
            "--random-seed",
            "3",
            "--enable-deterministic-inference",
            "--verify-probs-builder",
            "topk_first",
        ]
    )
    assert (args.speculative_algorithm, args.gamma, args.max_running_requests) == ("DFLASH", 4, 7)
    assert args.block_verification and args.sampling_enabled and args.random_seed == 3
    info = args.to_dict()
    assert info["enable_deterministic_inference"] is True and info["speculative_num_draft_tokens"] == 5
    assert "sampling_enabled=True" in args.describe()


def test_block_size_aliases_and_default() -> None:
    assert (
        parse_args([*BASE, "--speculative-algorithm", "DFLASH"]).speculative_num_draft_tokens
        == DEFAULT_NUM_DRAFT_TOKENS
    )
    assert parse_args([*BASE, "--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "16"]).gamma == 15
    # SGLang's meanings (0.5.23, speculative_hook): DSPARK's block size is gamma, the window gamma + 1
    dspark = ["--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size"]
    assert parse_args([*BASE, *dspark, "4"]).gamma == 4
    assert parse_args([*BASE, *dspark, "7", "--speculative-num-draft-tokens", "8"]).gamma == 7
    assert parse_args([*BASE, *dspark, "1"]).gamma == 1
    assert (
        parse_args([*BASE, "--speculative-algorithm", "DSPARK", "--speculative-dflash-block-size", "5"]).gamma
        == DEFAULT_NUM_DRAFT_TOKENS - 1
    )  # DFLASH's flag: ignored, as SGLang does


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            [
                "--speculative-algorithm",
                "DFLASH",
                "--speculative-num-draft-tokens",
                "4",
                "--speculative-dflash-block-size",
                "8",
            ],
            "conflicting",
        ),
        (
            [
                "--speculative-algorithm",
                "DSPARK",
                "--speculative-num-draft-tokens",
                "7",
                "--speculative-dspark-block-size",
                "7",
            ],
            "conflicting verify windows",
        ),
        (["--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size", "0"], "must be >= 1 (it is gamma"),
        (["--speculative-algorithm", "EAGLE"], "SGLang-only"),
        (["--speculative-algorithm", "dflash"], "not valid"),
        (["--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "1"], ">= 2"),
        (["--tp-size", "2"], "one device"),
        (["--max-running-requests", "0"], ">= 1"),
        (["--speculative-draft-model-path", "embedded:small"], "drafts with the model itself"),
        (["--draft-divergence", "-1"], "must be in [0, 1000]"),
        (["--speculative-use-block-verification"], "needs --speculative-algorithm DFLASH or DSPARK"),
        (["--vocab-size", "10000000000"], "must be in [3, 2,097,152]"),
        (["--speculative-algorithm", "NONE", "--speculative-use-block-verification"], "needs --speculative-algorithm"),
        (["--draft-divergence", "nan"], "must be in [0, 1000]"),
        (["--draft-divergence", "inf"], "must be in [0, 1000]"),
        (["--verify-probs-builder", "nope"], "invalid choice"),
        (["--no-such-flag"], "unrecognized arguments"),
        (["--model", "x"], "unrecognized arguments"),  # no abbreviations of --model-path
    ],
)
def test_bad_flags_fail_with_a_message(argv: list[str], message: str, capsys) -> None:
    assert message in error_of([*BASE, *argv], capsys)


def test_unknown_model_lists_the_presets(capsys) -> None:
    err = error_of(["--model-path", "Qwen/Qwen3-8B"], capsys)
    assert "embedded:tiny" in err and "embedded:small" in err


def test_a_warm_up_that_fails_stops_the_start_up(monkeypatch) -> None:
    """A server whose first request fails would fail every request: it never reports ready."""

    def broken(self, batch):
        raise ValueError("a row of the target distribution has no probability mass")

    svc = service_mod.EngineService(parse_args([*BASE, "--speculative-algorithm", "DFLASH", "--num-threads", "1"]))
    real_scheduler = service_mod.Scheduler

    def scheduler(worker, *args):
        monkeypatch.setattr(type(worker), "prefill", broken)
        return real_scheduler(worker, *args)

    monkeypatch.setattr(service_mod, "Scheduler", scheduler)

    async def start() -> None:
        try:
            await svc.start()
        finally:
            await svc.stop()

    with pytest.raises(RuntimeError, match="the warm-up request failed: internal error: ValueError: a row of"):
        asyncio.run(start())
    assert svc.status != "ready"
