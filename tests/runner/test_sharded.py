"""Sharded campaigns: a Hydra multirun over `shard=` (submitit_local here, submitit_slurm on a cluster) runs
each (base seed, repeat) slot as its own job into one campaign folder; the sweep ends with one merged
report whose audit covers every shard; a failed shard is resubmitted alone. Also: per-shard locks, and
the audit's node and GPU-placement checks."""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

import pytest
from campaigns import SMALL, jobs_of
from conftest import bench_process

from analysis.report import MismatchError, build_report
from harness.runner.folder import lock_slots, slot_lock_name
from harness.validation import ConfigError

SHARDED = [*SMALL[:-1], "experiment.base_seeds=[1,2]"]  # 2 slots = 2 shards of 2 runs each; report on


def check(report, name: str):
    return next(c for c in report.audit.checks if c.name == name)


@pytest.mark.slow
def test_submitit_local_sweep_runs_shards_into_one_campaign_with_one_merged_report(tmp_path, run_bench):
    proc = run_bench("hydra/launcher=submitit_local", "shard=range(0,2)", *SHARDED, multirun=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    roots = list((tmp_path / "embedded_block_vs_token").iterdir())
    assert len(roots) == 1, roots  # both jobs joined one campaign
    root = roots[0]
    jobs = jobs_of(tmp_path)
    assert sorted(j["shard"] for j in jobs) == [0, 1] and {j["campaign"] for j in jobs} == {str(root)}
    assert all(j["code"] == 0 for j in jobs)
    assert list(tmp_path.glob(".multirun/*/.submitit/*"))  # the jobs went through submitit
    doc = json.loads((root / "campaign.json").read_text())
    assert sorted(r["run_id"] for r in doc["order_run"]) == sorted(r["run_id"] for r in doc["plan"])
    assert all(r["status"] == "finished" and r["host"] for r in doc["order_run"])
    report = build_report([root])
    assert report.audit.passed, [c for c in report.audit.checks if c.status == "fail"]
    assert report.audit.coverage["planned"].sum() == 4 * 4  # 2 slots x 2 arms x 4 items, from both shards
    assert "audit: passed" in proc.stdout and (root / "report.md").exists()  # written once, at the sweep's end


@pytest.mark.slow
def test_a_failed_shard_fails_the_sweep_and_is_resubmitted_alone(tmp_path, run_bench):
    root = tmp_path / "embedded_block_vs_token" / "sharded"
    root.mkdir(parents=True)
    held = lock_slots(root, [1])  # another runner holds shard 1: its job fails, shard 0 goes on
    try:
        both = run_bench("campaign=sharded", "shard=0,1", *SHARDED, multirun=True)
    finally:
        for handle in held:
            handle.close()
    out = both.stdout + both.stderr
    assert both.returncode == 1, out
    assert "(shard 1) is being run by pid" in out and "sweep failed: 1 of 2 job(s) failed" in out
    assert "resume each failed job alone (no -m): " in out and " campaign=sharded shard=1" in out.replace("\n", "")
    assert "AUDIT FAILED: " in out and "Runs finished, log checks passed" in out  # the merged report: what is missing
    missing = check(build_report([root]), "Runs finished, log checks passed")
    assert missing.status == "fail" and "2/4 planned runs finished" in missing.summary

    again = run_bench("campaign=sharded", "shard=1", *SHARDED)  # shard 1 alone completes the campaign
    assert again.returncode == 0, again.stdout + again.stderr
    assert "finished earlier" not in again.stdout  # shard 0's runs are not this runner's
    assert "audit: passed" in again.stdout  # the last shard writes the campaign's report
    assert build_report([root]).audit.passed


def test_shards_lock_their_own_slots(tmp_path):
    first = lock_slots(tmp_path, [0])
    second = lock_slots(tmp_path, [1])  # another shard of the same campaign: allowed
    with pytest.raises(ConfigError, match=r"\(shard 0\) is being run by pid"):
        lock_slots(tmp_path, [0, 1])  # a whole-campaign runner needs every slot
    for handle in [*first, *second]:
        handle.close()
    with open(tmp_path / slot_lock_name(1)) as probe:  # the refused runner released what it took
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_shard_that_does_not_exist_is_refused_before_anything_runs(tmp_path, run_bench):
    proc = run_bench("shard=2", *SHARDED)
    assert proc.returncode == 2
    assert "shard=2 does not exist: this campaign has 2 shard(s), shard=0 to shard=1" in proc.stdout.replace("\n", "")
    assert not (tmp_path / "embedded_block_vs_token").exists()


@pytest.fixture(scope="module")
def parallel_campaign(tmp_path_factory) -> Path:
    """Parallel placement (one 'GPU' per arm; the embedded server on CPU ignores CUDA_VISIBLE_DEVICES):
    the arms swap GPUs slot by slot, as planned."""
    tmp = tmp_path_factory.mktemp("parallel")
    proc = bench_process(tmp, "campaign=par", "experiment.placement=parallel", "experiment.gpus=[0,1]", *SHARDED)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / "embedded_block_vs_token" / "par"


def edited_copy(src: Path, dst: Path, run_id: str, edit) -> Path:
    shutil.copytree(src, dst)
    path = dst / "runs" / run_id / "manifest.json"
    man = json.loads(path.read_text())
    edit(man)
    path.write_text(json.dumps(man))
    return dst


@pytest.mark.slow
def test_planned_gpu_swap_passes_and_a_wrong_gpu_fails(parallel_campaign, tmp_path):
    report = build_report([parallel_campaign])
    assert report.audit.passed, [c for c in report.audit.checks if c.status == "fail"]
    assert check(report, "Each run on the GPU the plan gave it").summary == "4/4 runs on their planned GPU"
    commands = check(report, "Commands and environments differ only as declared")
    assert commands.status == "ok" and "only the declared difference" in commands.summary

    run_id = sorted(p.name for p in (parallel_campaign / "runs").iterdir())[0]

    def wrong_gpu(man):
        man["env"]["CUDA_VISIBLE_DEVICES"] = str(1 - man["gpu"])

    bad = build_report([edited_copy(parallel_campaign, tmp_path / "bad", run_id, wrong_gpu)])
    placement = check(bad, "Each run on the GPU the plan gave it")
    assert placement.status == "fail" and "3/4" in placement.summary and run_id in placement.details[0]
    assert check(bad, "Commands and environments differ only as declared").status == "fail"  # not masked


@pytest.mark.slow
def test_a_pair_split_across_nodes_and_mixed_hardware_fail_the_audit(parallel_campaign, tmp_path):
    ok = check(build_report([parallel_campaign]), "Paired runs on one node, one node type")
    assert ok.status == "ok" and "on 1 node(s)" in ok.summary
    run_ids = sorted(p.name for p in (parallel_campaign / "runs").iterdir())

    def other_host(man):
        man["host"]["hostname"] = "node-b"

    split = check(
        build_report([edited_copy(parallel_campaign, tmp_path / "split", run_ids[0], other_host)]),
        "Paired runs on one node, one node type",
    )
    assert split.status == "fail" and "split across nodes" in split.details[0] and "node-b" in split.details[0]

    def other_cpu(man):
        man["host"]["cpu"] = "Some Other CPU"

    mixed = check(
        build_report([edited_copy(parallel_campaign, tmp_path / "cpu", run_ids[0], other_cpu)]),
        "Paired runs on one node, one node type",
    )
    assert mixed.status == "fail" and any("mixed hardware: CPU Some Other CPU" in d for d in mixed.details)

    def other_gpu(man):
        man["gpu_info"] = {"name": "NVIDIA H100", "driver_version": "550.1", "count": 8}

    gpu = edited_copy(parallel_campaign, tmp_path / "gpu", run_ids[0], other_gpu)
    with pytest.raises(MismatchError, match="gpu_name: NVIDIA H100"):  # another GPU model: refused outright
        build_report([gpu])
    mixed = check(build_report([gpu], allow_mismatch=True), "Paired runs on one node, one node type")
    assert mixed.status == "fail" and any("mixed hardware: 8 x NVIDIA H100" in d for d in mixed.details)
