"""Seed streams (issue 11 item 7): request seed = base seed + seed offset + seed_stream * 2**32.

Planned seeds per arm, the 64-bit bound, embedded_aa's arm b on stream 1 (the dry run shows it), a
campaign made before seed streams existed still resumes, and end to end arm b sends different seeds."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from campaigns import WITH_REPORT, bench, campaign_dir, read_jsonl
from mdtable import squash
from rich.console import Console

from configs import composed, dry_run_text
from harness.runner.config import request_seed
from harness.runner.folder import Campaign
from harness.runner.plan import check_request_seeds, make_plan, planned_requests
from harness.validation import ConfigError
from workloads import load_workload
from workloads.base import Item

TINY = ["workload.n_items=3", "experiment.warmup.requests=2"]


def test_planned_seeds_follow_each_arms_stream():
    cfg = composed("experiment=embedded_aa", *TINY)
    workload = load_workload(cfg.workload)
    assert [(a.name, a.seed_stream) for a in cfg.experiment.arms] == [("a", 0), ("b", 1)]
    for arm in cfg.experiment.arms:
        warm, measured = planned_requests(cfg, workload, 1000, arm.seed_stream)
        for spec in warm + measured:
            assert spec.request_seed == 1000 + spec.item.seed_offset + arm.seed_stream * 2**32
    unseeded = composed("experiment=embedded_aa", *TINY, "experiment.seeded_requests=false")
    warm, measured = planned_requests(unseeded, workload, 1000, 1)
    assert {s.request_seed for s in warm + measured} == {None}


def test_stream_must_be_non_negative_and_seeds_must_fit_64_bits():
    with pytest.raises(ConfigError, match=r"seed_stream=-1 must be >= 0"):
        composed("experiment=embedded_aa", "experiment.arms.1.seed_stream=-1")
    with pytest.raises(ConfigError, match=r"does not fit a 64-bit integer"):
        composed("experiment=embedded_aa", f"experiment.arms.1.seed_stream={2**31}")
    assert request_seed(2**63 - 1 - 2**32, 0, 1) == 2**63 - 1  # the largest that fits
    with pytest.raises(ConfigError, match=r"request seed 9223372032559808512 \+ 5 \+ 1 \* 2\*\*32"):
        request_seed(2**63 - 2**32, 5, 1)
    # the item's offset is only known with the workload: checked when the campaign is built, before any launch
    cfg = composed("experiment=embedded_aa", *TINY, f"experiment.base_seeds=[{2**63 - 1 - 2**32}]")
    workload = load_workload(cfg.workload)
    with pytest.raises(ConfigError, match="does not fit a 64-bit integer"):
        check_request_seeds(cfg, workload)
    workload.items = [Item("0", 0, "p", [])]
    check_request_seeds(cfg, workload)  # offset 0: the largest seed, still fits


def test_dry_run_shows_the_streams():
    text = dry_run_text(composed("experiment=embedded_aa", "dry_run=true"))
    assert "request seeds: base 980406 + item seed_offset + seed_stream 0 * 2**32" in text
    assert "request seeds: base 980406 + item seed_offset + seed_stream 1 * 2**32" in text
    assert "seed_stream 0 -> 1" in text  # the table of what differs from the baseline
    other = dry_run_text(composed("experiment=embedded_block_vs_token", "dry_run=true"))
    assert "(same seed stream)" in other


def old_campaign(tmp_path, cfg_dict: dict) -> None:
    """A campaign.json as the runner wrote it before seed streams and pinning existed."""
    old = json.loads(json.dumps(cfg_dict))
    for arm in old["experiment"]["arms"]:
        del arm["seed_stream"]
    del old["server"]["cpus"], old["client"]["cpus"]
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "campaign.json").write_text(json.dumps({"schema_version": 1, "config": old, "order_run": []}))


def campaign_at(root, *overrides: str) -> Campaign:
    from hydra import compose, initialize_config_dir  # noqa: PLC0415
    from omegaconf import OmegaConf  # noqa: PLC0415

    from harness.hydra_setup import CONFIG_DIR  # noqa: PLC0415
    from harness.runner.command import to_typed  # noqa: PLC0415
    from harness.runner.config import register_configs  # noqa: PLC0415

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        node = compose(config_name="bench", overrides=list(overrides))
    cfg = to_typed(node)
    return Campaign(
        cfg=cfg,
        config_dict=OmegaConf.to_container(node, resolve=True),
        workload=load_workload(cfg.workload),
        plan=make_plan(cfg.experiment),
        root=root,
        console=Console(file=io.StringIO()),
    )


def test_a_campaign_made_before_seed_streams_resumes(tmp_path):
    base = ["experiment=embedded_block_vs_token", *TINY]
    fresh = campaign_at(tmp_path / "c", *base)
    old_campaign(tmp_path / "c", fresh.config_dict)
    fresh.open()  # missing seed_stream / cpus read as 0 / []: the same config
    assert "resuming" in fresh.console.file.getvalue()
    fresh.close()
    changed = campaign_at(tmp_path / "c", *base, "experiment.arms.1.seed_stream=1")
    with pytest.raises(ConfigError, match=r"differs at: experiment.arms"):
        changed.open()  # a stream that is not 0 is a different experiment


def test_a_campaign_resumes_with_longer_server_timeouts_but_not_another_measurement(tmp_path):
    """A run that failed on a server start slower than server.ready_timeout_s can be redone with a longer one;
    a timeout that decides which requests fail (client.timeout_s) is part of the experiment."""
    base = ["experiment=embedded_block_vs_token", *TINY]
    first = campaign_at(tmp_path / "c", *base, "server.ready_timeout_s=0.5", "campaign=c")
    first.open()
    assert "new campaign" in first.console.file.getvalue()  # campaign=c named none: said, in case it was mistyped
    first.close()
    again = campaign_at(
        tmp_path / "c", *base, "server.ready_timeout_s=120", "server.stop_timeout_s=5", "server.health_timeout_s=3"
    )
    again.open()
    assert "resuming" in again.console.file.getvalue()
    again.close()
    with pytest.raises(ConfigError, match=r"differs at: client.timeout_s"):
        campaign_at(tmp_path / "c", *base, "client.timeout_s=7").open()


def test_a_base_seed_given_twice_is_refused():
    with pytest.raises(ConfigError, match=r"experiment.base_seeds=\[1, 2, 1\] names \[1\] more than once"):
        campaign_at(Path("/nonexistent"), "experiment=embedded_block_vs_token", *TINY, "experiment.base_seeds=[1,2,1]")


@pytest.fixture(scope="module")
def aa_campaign(tmp_path_factory):
    """embedded_aa end to end, once for the tests below: (campaign.json, {arm: {item_id: measured record}})."""
    tmp = tmp_path_factory.mktemp("aa")
    proc = bench(tmp, "experiment=embedded_aa", "experiment.base_seeds=[7]", *WITH_REPORT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = campaign_dir(tmp, "embedded_aa")
    campaign = json.loads((root / "campaign.json").read_text())
    campaign["_root"] = str(root)
    by_arm = {}
    for run in campaign["plan"]:
        records = read_jsonl(root / "runs" / run["run_id"] / "records.jsonl")
        by_arm[run["arm"]] = {r["item_id"]: r for r in records if not r["warmup"]}
    return campaign, by_arm


@pytest.mark.slow
def test_embedded_aa_arm_b_sends_other_seeds(aa_campaign):
    campaign, by_arm = aa_campaign
    assert {a["name"]: a["seed_stream"] for a in campaign["arms"]} == {"a": 0, "b": 1}
    assert "seed stream 1" in campaign["declared_difference"]
    assert by_arm["a"].keys() == by_arm["b"].keys() and len(by_arm["a"]) == 4
    for arm, stream in (("a", 0), ("b", 1)):
        for rec in by_arm[arm].values():
            assert rec["request_seed"] == 7 + rec["seed_offset"] + stream * 2**32


@pytest.mark.slow
def test_embedded_aa_arms_sample_differently(aa_campaign):
    _, by_arm = aa_campaign
    differing = [i for i, rec in by_arm["a"].items() if rec["output_text"] != by_arm["b"][i]["output_text"]]
    assert len(differing) >= len(by_arm["a"]) // 2, differing


@pytest.mark.slow
def test_embedded_aa_report_shows_a_measured_al_noise_floor(aa_campaign):
    """The report that `make bench experiment=embedded_aa` writes: the arms draw different seed streams, so the
    acceptance-length line of the noise-floor table is a measured (non-zero) change, said to be sampling noise."""
    campaign, _ = aa_campaign
    report = squash((Path(campaign["_root"]) / "report.md").read_text())
    section = report.split("## Noise floor (A/A)", 1)[1].split("\n## ", 1)[0]
    assert "The arms draw different seed streams (0 and 1" in section
    al_row = next(line for line in section.splitlines() if line.startswith("| Acceptance length |"))
    change = al_row.split("|")[2].strip()
    assert change.startswith(("+", "-")) and not change.startswith(("+0.00%", "-0.00%")), al_row
