"""Hydra entry point: `python -m harness.micro [overrides]` (see `configs/microbench.yaml`)."""

from __future__ import annotations

import sys
from typing import Any, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.hydra_setup import CONFIG_DIR, HYDRA_VERSION_BASE
from harness.micro.app import RunResult, check_config, progress_steps, run
from harness.micro.bank import BankError
from harness.micro.config import MicroAppConfig, register_configs
from harness.micro.families import FamilyError
from harness.micro.impls import ImplError
from harness.micro.writeup import console_table, write_micro_report
from harness.validation import ConfigError

PIPE_WIDTH = 160  # console width when stdout is not a terminal (logs, CI)


def _run_with_progress(app: MicroAppConfig, resolved: dict, overrides: list[str], console: Console) -> RunResult:
    micro = app.micro
    total = progress_steps(micro)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("timing", total=total)

        def step(label: str) -> None:
            progress.update(task, advance=1, description=label)

        def say(line: str) -> None:
            progress.console.print(line, markup=False, highlight=False)

        return run(micro, results_dir=app.results_dir, resolved=resolved, overrides=overrides, step=step, say=say)


def _typed_config(cfg: DictConfig) -> MicroAppConfig:
    """The typed config, checked (values, implementation and family names); ConfigError, ImplError or
    FamilyError if wrong."""
    app = cast(MicroAppConfig, OmegaConf.to_object(cfg))  # cfg's schema is MicroAppConfig
    check_config(app.micro)
    return app


@hydra.main(version_base=HYDRA_VERSION_BASE, config_path=str(CONFIG_DIR), config_name="microbench")
def hydra_main(cfg: DictConfig) -> None:
    """Check the config, run, write report.md, print the table and where everything went; exit 1 when a
    measurement raised or nothing could be measured."""
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    try:
        app = _typed_config(cfg)
        overrides = list(HydraConfig.get().overrides.task)
        resolved = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))  # of a DictConfig
        result = _run_with_progress(app, resolved, overrides, console)
    except (ConfigError, ImplError, FamilyError, BankError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:  # (run() said where its rows are)
        raise SystemExit(130) from None
    report = write_micro_report(result.out_dir, result.manifest, result.rows)
    console.print(
        console_table(result.rows, title=f"verify-probability builders on {result.manifest['device']['type']}")
    )
    console.print(
        f"results: {result.out_dir}/ (manifest.json, results.jsonl, {report.name})", highlight=False, soft_wrap=True
    )
    errors = sum(r.status == "error" for r in result.rows)
    if errors or not any(r.status == "ok" for r in result.rows):  # a set that lacks what it was asked to time
        print(
            f"failed: {errors} measurement(s) raised (the report's cells and notes say which)"
            if errors
            else "failed: nothing was measured: every implementation asked for was skipped (the notes above say why)",
            file=sys.stderr,
        )
        raise SystemExit(1)


def main() -> None:
    """`python -m harness.micro` and the `specbench-micro` command."""
    register_configs()
    hydra_main()


if __name__ == "__main__":
    main()
