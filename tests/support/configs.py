"""The bench config composed as the command composes it, and its dry run as text (shared by the runner, host and
conformance tests)."""

from __future__ import annotations

import io

from hydra import compose, initialize_config_dir
from rich.console import Console

from harness.hydra_setup import CONFIG_DIR
from harness.runner.command import to_typed
from harness.runner.config import BenchConfig, register_configs
from harness.runner.dryrun import print_dry_run
from harness.runner.plan import planned_launches

SGLANG_PATHS = ["server.model_path=/models/target", "server.draft_model_path=/models/draft"]


SKIP = (
    "server.preflight=skip"  # the argv preflight needs SGLang: tests/conformance/test_sglang_argv.py runs it for real
)


NEEDS = {
    "dflash_block_vs_token": [*SGLANG_PATHS, SKIP],
    "dspark_block_vs_token": [*SGLANG_PATHS, SKIP],
    "dflash_verify_probs_speedbench": [
        *SGLANG_PATHS,
        SKIP,
        "experiment.arms.0.python=/envs/before/bin/python",
        "experiment.arms.1.python=/envs/after/bin/python",
    ],
    "openai_two_servers": ["server.model_path=MODEL"],  # (the model name the two servers serve)
}


def composed(*overrides: str) -> BenchConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return to_typed(compose(config_name="bench", overrides=list(overrides)))


def dry_run(cfg: BenchConfig) -> tuple[int, str]:
    buf = io.StringIO()
    code = print_dry_run(cfg, Console(file=buf, width=400), planned_launches(cfg))
    return code, buf.getvalue()


def dry_run_text(cfg: BenchConfig) -> str:
    code, text = dry_run(cfg)
    assert code == 0, text
    return text
