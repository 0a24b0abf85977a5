"""Scoring leaves the measured path (issue 11 item 3): responses are scored once the run's last request
has returned, into scores.jsonl, and a slow scorer does not stretch the measured window.

The campaign runs in this process (the runner's asyncio loop, the embedded server as a subprocess) so
that the scorer can be replaced by one that sleeps and notes when it was called, on the same monotonic
clock as the records."""

from __future__ import annotations

import asyncio
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from campaigns import SMALL, check_schema2_run, read_jsonl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from rich.console import Console

from harness.hydra_setup import CONFIG_DIR
from harness.runner.command import to_typed
from harness.runner.config import register_configs
from harness.runner.folder import build_campaign
from harness.runner.plan import planned_launches
from harness.runner.runs import run_campaign
from workloads import load_workload
from workloads.scoring import Score, Scorer

pytestmark = pytest.mark.slow

DELAY_S = 0.25


@dataclass(frozen=True)
class SlowScorer(Scorer):
    """The real scorer, after a sleep; notes the monotonic time of each call."""

    calls: list[float] = field(default_factory=list)

    def score(self, output_text: str | None, reference: str | None) -> Score:
        self.calls.append(time.monotonic())
        time.sleep(DELAY_S)
        return super().score(output_text, reference)


@dataclass(frozen=True)
class BrokenScorer(Scorer):
    def score(self, output_text: str | None, reference: str | None) -> Score:
        raise ValueError("sympy fell over")


def run_in_process(tmp: Path, scorer: Scorer, *overrides: str) -> tuple[Path, dict[str, str]]:
    """A campaign of embedded_aa (one base seed: two runs) with `scorer` in place of the workload's."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        node = compose(
            config_name="bench",
            overrides=["experiment=embedded_aa", "experiment.base_seeds=[5]", f"results_dir={tmp}", *SMALL, *overrides],
        )
    cfg = to_typed(node)
    workload = load_workload(cfg.workload)
    workload.scorer = scorer
    campaign = build_campaign(
        cfg,
        OmegaConf.to_container(node, resolve=True),
        workload,
        planned_launches(cfg),
        Console(file=io.StringIO(), width=200),
    )
    campaign.open()
    try:
        statuses = asyncio.run(run_campaign(campaign))
    finally:
        campaign.close()
    return campaign.root, statuses


def test_a_slow_scorer_runs_after_the_window_and_does_not_stretch_it(tmp_path):
    scorer = SlowScorer()
    root, statuses = run_in_process(tmp_path, scorer, "client.store_output_text=false")
    assert set(statuses.values()) == {"finished"}
    n_scored = 0
    for run_dir in sorted((root / "runs").iterdir()):
        manifest, records, scores = check_schema2_run(run_dir)
        assert all(r["output_text"] is None for r in records)  # not stored, yet scored from memory
        assert manifest["scoring"]["seconds"] >= DELAY_S * len(records) - 0.01
        measured = [r for r in records if not r["warmup"]]
        window = max(r["t_end"] for r in measured) - min(r["t_sent"] for r in measured)
        assert window < DELAY_S * len(records)  # the sleeps are not inside it
        assert manifest["machine"]["during"]["wall_s"] < manifest["scoring"]["seconds"]
        calls = scorer.calls[n_scored : n_scored + len(records)]
        assert len(calls) == len(records) and min(calls) > max(r["t_end"] for r in records)  # after the last request
        n_scored += len(records)
        assert all(isinstance(s["correct"], bool) for s in scores)  # every synthetic item has a reference
    assert len(scorer.calls) == n_scored


def test_a_scoring_failure_fails_the_run_loudly(tmp_path):
    root, statuses = run_in_process(tmp_path, BrokenScorer())
    assert set(statuses.values()) == {"failed"}
    for run_dir in (root / "runs").iterdir():
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["status"] == "failed"
        assert "scoring request_index 0 (item 0) with boxed+math-verify" in manifest["error"]
        assert "ValueError: sympy fell over" in manifest["error"]
        assert manifest["scoring"]["scored"] == 0
        assert len(read_jsonl(run_dir / "records.jsonl")) == 6  # the records stay


def test_parallel_runs_score_only_when_every_run_of_the_slot_is_done(tmp_path):
    """With placement=parallel the runs of a slot share the event loop: none scores while another measures
    (arm b serves one request at a time with a far larger vocabulary, so it measures for seconds after arm a
    is done)."""
    scorer = SlowScorer()
    root, statuses = run_in_process(
        tmp_path,
        scorer,
        "experiment.placement=parallel",
        "experiment.gpus=[0,1]",
        "experiment.arms.1.args=[--max-running-requests,'1',--vocab-size,'65536']",
        "sampling.max_new_tokens=256",
        "sampling.ignore_eos=true",
    )
    assert set(statuses.values()) == {"finished"}
    records = [r for f in root.glob("runs/*/records.jsonl") for r in read_jsonl(f)]
    assert {r["arm"] for r in records} == {"a", "b"}
    assert len(scorer.calls) == len(records) and min(scorer.calls) > max(r["t_end"] for r in records)
    ends = {arm: max(r["t_end"] for r in records if r["arm"] == arm) for arm in ("a", "b")}
    assert ends["b"] - ends["a"] > 2.0, ends  # arm a was done long before arm b: it waited to score
    for run_dir in (root / "runs").iterdir():
        check_schema2_run(run_dir)
