"""The argv preflight against the installed SGLang: every shipped SGLang experiment's planned commands
are accepted by SGLang's own parser and checks, and what SGLang refuses fails with the flag named.

The interpreter under test (sys.executable, .venv-sglang under `make test`) stands in for the GPU
host's: each experiment is composed with the real Hydra entry point and `server.python` (and the
arms' `python:`) set to it. One probe subprocess answers for many commands.
"""

from __future__ import annotations

import io
import sys

import pytest
from hydra import compose, initialize_config_dir
from rich.console import Console
from sglang_support import import_sglang, pinned_sglang_version

from harness.backends.python_preflight import (
    EXIT_CODE,
    PlannedArgv,
    PreflightReport,
    check_planned,
    planned_argv,
)
from harness.hydra_setup import CONFIG_DIR
from harness.runner.command import to_typed
from harness.runner.config import BenchConfig, register_configs
from harness.runner.dryrun import print_dry_run
from harness.runner.overrides import group_options
from harness.runner.plan import planned_launches

pytestmark = pytest.mark.sglang

PLACEHOLDERS = ["server.model_path=/models/target", "server.draft_model_path=/models/draft"]
SHIPPED_SGLANG = {"dflash_block_vs_token", "dspark_block_vs_token", "dflash_verify_probs_speedbench"}


@pytest.fixture(scope="module")
def python() -> str:
    import_sglang()  # present and pinned, or skip / fail as the conformance suite says
    return sys.executable


def composed(name: str, python: str, *overrides: str) -> BenchConfig:
    register_configs()
    arms = (
        [f"experiment.arms.{i}.python={python}" for i in range(2)] if name == "dflash_verify_probs_speedbench" else []
    )
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        node = compose(
            config_name="bench",
            overrides=[f"experiment={name}", f"server.python={python}", *PLACEHOLDERS, *arms, *overrides],
        )
    return to_typed(node)


def sglang_experiments(python: str) -> dict[str, BenchConfig]:
    """Every experiment file whose server is SGLang, composed for `python`."""
    configs = {}
    for name in group_options("experiment"):
        register_configs()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            backend = compose(config_name="bench", overrides=[f"experiment={name}"]).server.backend
        if backend == "sglang":
            configs[name] = composed(name, python)
    return configs


def planned_argvs_of(cfg: BenchConfig) -> list[PlannedArgv]:
    """Every planned argv of an experiment, as the preflight checks them (the planned launches, walked once)."""
    return [planned_argv(launch) for launch in planned_launches(cfg)]


def variant(
    cfg: BenchConfig,
    label: str,
    replace: dict[str, str] | None = None,
    add: list[str] | None = None,
    arm: str = "block",
) -> PlannedArgv:
    """An arm's first planned argv with tokens replaced / added (a hand-made mistake)."""
    item = next(i for i in planned_argvs_of(cfg) if i.arm == arm)
    args = tuple((replace or {}).get(a, a) for a in item.args) + tuple(add or [])
    return PlannedArgv(label=label, arm=arm, python=item.python, args=args, env=item.env, flag_keys=item.flag_keys)


def mistakes(cfg: BenchConfig) -> list[PlannedArgv]:
    return [
        variant(
            cfg, "misspelled", replace={"--speculative-use-block-verification": "--speculative-use-blok-verification"}
        ),
        variant(cfg, "bad_choice", replace={"flashinfer": "flashinfo"}),
        variant(cfg, "bad_type", replace={"8": "eight"}),
        variant(cfg, "block_ngram", replace={"DFLASH": "NGRAM"}),
        variant(cfg, "block_on_cpu", add=["--device", "cpu"]),
    ]


@pytest.fixture(scope="module")
def shipped(python) -> dict[str, BenchConfig]:
    return sglang_experiments(python)


@pytest.fixture(scope="module")
def report(shipped) -> PreflightReport:
    """One check of every shipped planned argv plus the hand-made mistakes: one probe per environment."""
    planned = [item for cfg in shipped.values() for item in planned_argvs_of(cfg)]
    return check_planned(planned + mistakes(shipped["dflash_block_vs_token"]))


def test_every_planned_argv_of_every_sglang_experiment_is_accepted(python, shipped, report):
    assert set(shipped) == SHIPPED_SGLANG  # a new SGLang experiment joins automatically; none is lost
    planned = {i.label for cfg in shipped.values() for i in planned_argvs_of(cfg)}
    outcomes = [o for o in report.outcomes if o.planned.label in planned]
    assert len(outcomes) == 6 + 6 + 8
    assert [o.line() for o in outcomes if not o.ok] == []
    assert report.checked_by() == [f"SGLang {pinned_sglang_version()} in {python}"]
    for outcome in outcomes:
        stages = {s.stage: s.status for s in outcome.stages}
        assert stages["plugins"] == stages["parse"] == stages["model_independent"] == "passed", outcome.line()
        # the speculative gate ran: it passed, or stopped only where SGLang reads the draft checkpoint
        assert stages["speculative"] in ("passed", "stopped"), outcome.line()


@pytest.mark.parametrize(
    "label, expected_flag, stage, words",
    [
        ("misspelled", "--speculative-use-blok-verification", "parse", "unrecognized arguments"),
        ("bad_choice", "--attention-backend", "parse", "invalid choice: 'flashinfo'"),
        ("bad_type", "--max-running-requests", "parse", "invalid int value: 'eight'"),
        ("block_ngram", "--speculative-use-block-verification", "speculative", "only supports EAGLE"),
        ("block_on_cpu", "--speculative-use-block-verification", "speculative", "only supports CUDA"),
    ],
)
def test_what_sglang_refuses_fails_with_the_flag_named(report, label, expected_flag, stage, words):
    outcome = report.outcome_of(label)
    assert not outcome.ok and outcome.flag == expected_flag, outcome.line()
    assert outcome.failing_stage.stage == stage and words in outcome.failing_stage.message
    assert outcome.problem().startswith(expected_flag)
    assert not report.ok and any(p.startswith(expected_flag) for p in report.problems())


def dry_run(cfg: BenchConfig) -> tuple[int, str]:
    buf = io.StringIO()
    code = print_dry_run(cfg, Console(file=buf, width=400), planned_launches(cfg))
    return code, buf.getvalue()


def test_dry_run_says_sglang_accepted_every_argv(python):
    code, text = dry_run(composed("dspark_block_vs_token", python))
    assert code == 0, text
    assert text.count(f"preflight: accepted by SGLang {pinned_sglang_version()}") == 6
    assert "argv preflight passed" in text and "nothing was launched" in text


def test_dry_run_fails_naming_the_misspelled_flag_and_its_config_key(python):
    code, text = dry_run(
        composed("dspark_block_vs_token", python, "experiment.arms.1.args=[--speculative-use-blok-verification]")
    )
    assert code == EXIT_CODE
    assert "REFUSED by SGLang" in text and "argv preflight FAILED" in text
    assert "--speculative-use-blok-verification (from experiment.arms.1.args)" in text
    assert text.count("preflight: accepted") == 3  # the token arm's three runs are fine
