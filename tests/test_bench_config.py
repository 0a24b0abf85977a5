"""Every experiment file composes and dry-runs; bad overrides fail with the valid keys listed."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from rich.console import Console

from harness.bench import GROUPS, to_typed
from harness.cli import CONFIG_DIR, OverrideError, check_overrides, group_options
from harness.config import BenchConfig, ConfigError, register_configs
from harness.dryrun import print_dry_run
from harness.plan import make_plan

SGLANG_PATHS = ["server.model_path=/models/target", "server.draft_model_path=/models/draft"]
NEEDS = {
    "dflash_block_vs_token": SGLANG_PATHS,
    "dspark_block_vs_token": SGLANG_PATHS,
    "dflash_verify_probs_speedbench": SGLANG_PATHS + ["experiment.arms.0.python=/envs/before/bin/python",
                                                      "experiment.arms.1.python=/envs/after/bin/python"],
}


def composed(*overrides: str) -> BenchConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return to_typed(compose(config_name="bench", overrides=list(overrides)))


def dry_run_text(cfg: BenchConfig) -> str:
    buf = io.StringIO()
    print_dry_run(cfg, Console(file=buf, width=400))
    return buf.getvalue()


@pytest.mark.parametrize("name", group_options("experiment"))
def test_every_experiment_composes_and_dry_runs(name):
    cfg = composed(f"experiment={name}", "dry_run=true", *NEEDS.get(name, []))
    text = dry_run_text(cfg)
    plan = make_plan(cfg.experiment)
    assert len(plan) == len(cfg.experiment.arms) * len(cfg.experiment.base_seeds) * cfg.experiment.repeats
    for run in plan:
        assert run.run_id in text
    assert "nothing was launched" in text
    # the arms differ in argv (or interpreter), except in the A/A experiment
    assert ("(same argv)" in text) == (name == "embedded_aa")


def test_seed_protocol_block_vs_token_is_exact():
    cfg = composed("experiment=dflash_block_vs_token", *SGLANG_PATHS)
    assert cfg.experiment.base_seeds == [980406, 981406, 982406]
    assert cfg.sampling.max_new_tokens == 32768 and cfg.client.concurrency == 8
    assert (cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.top_k) == (1.0, 0.95, 20)
    assert "--disable-radix-cache" in cfg.server.args and "--enable-deterministic-inference" in cfg.server.args
    assert cfg.workload.kind == "aime25" and cfg.experiment.warmup.requests == 8
    text = dry_run_text(cfg)
    assert "+ --speculative-use-block-verification" in text
    assert "sglang.launch_server" in text and "--speculative-draft-model-path /models/draft" in text


def test_speedbench_runs_arms_side_by_side_on_two_gpus():
    cfg = composed("experiment=dflash_verify_probs_speedbench", *NEEDS["dflash_verify_probs_speedbench"])
    plan = make_plan(cfg.experiment)
    for slot in {r.slot for r in plan}:
        gpus = sorted(r.gpu for r in plan if r.slot == slot)
        assert gpus == [0, 1]
    text = dry_run_text(cfg)
    assert "CUDA_VISIBLE_DEVICES=0" in text and "CUDA_VISIBLE_DEVICES=1" in text
    assert "- /envs/before/bin/python; + /envs/after/bin/python" in text


def test_missing_model_path_is_named():
    with pytest.raises(Exception, match="model_path"):
        composed("experiment=dflash_block_vs_token")


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match="experiment.order='zigzag'.*alternate, fixed"):
        composed("experiment.order=zigzag")
    with pytest.raises(ConfigError, match="experiment.baseline='c'"):
        composed("experiment.baseline=c")
    with pytest.raises(ConfigError, match="sampling.top_p=1.5"):
        composed("sampling.top_p=1.5")


@pytest.mark.parametrize("override, message", [
    ("client.concurency=3", "client has no key 'concurency'; valid keys: route, stream, concurrency"),
    ("experiment.warmup.request=3", "warmup has no key 'request'; valid keys: requests, max_new_tokens"),
    ("bogus=1", "the top level has no key 'bogus'"),
    ("experiment=nope", "valid experiment configs: dflash_block_vs_token"),
    ("server=vllm", "valid server configs: embedded, sglang"),
])
def test_bad_overrides_list_the_valid_keys(override, message):
    with pytest.raises(OverrideError) as err:
        check_overrides([override], BenchConfig, GROUPS)
    assert message in str(err.value)


def test_good_overrides_pass():
    check_overrides(["client.concurrency=4", "experiment.arms.0.args=[--x]", "server.env.FOO=1",
                     "experiment=embedded_aa", "+extra=1", "hydra.verbose=true",
                     "client.concurrency=64,128"], BenchConfig, GROUPS)


def test_cli_bad_override_exits_with_the_valid_keys():
    proc = subprocess.run([sys.executable, "-m", "harness.bench", "client.concurency=3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "concurrency" in proc.stderr and "concurency" in proc.stderr


def test_cli_dry_run_prints_argv_and_launches_nothing():
    proc = subprocess.run([sys.executable, "-m", "harness.bench", "dry_run=true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("-m harness.engine") == 6
    assert "nothing was launched" in proc.stdout


def test_plan_alternates_arm_order_by_seed():
    cfg = composed("experiment.repeats=2")
    plan = make_plan(cfg.experiment)
    order = [(r.base_seed, r.repeat, r.arm) for r in plan]
    assert order == [
        (980406, 0, "token"), (980406, 0, "block"), (980406, 1, "block"), (980406, 1, "token"),
        (981406, 0, "token"), (981406, 0, "block"), (981406, 1, "block"), (981406, 1, "token"),
        (982406, 0, "token"), (982406, 0, "block"), (982406, 1, "block"), (982406, 1, "token"),
    ]
    assert [r.index for r in plan] == list(range(12)) and len({r.run_id for r in plan}) == 12
    fixed = make_plan(composed("experiment.order=fixed").experiment)
    assert [r.arm for r in fixed] == ["token", "block"] * 3
