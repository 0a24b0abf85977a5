"""A sharded campaign through a real SLURM (`make test-slurm`: scripts/slurm_local.sh brings up slurmctld and
slurmd on this machine, then this runs). Opt-in (marker `slurm`): `make test` leaves it out; where it is
asked for, a missing SLURM fails it rather than skipping it."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from campaigns import SMALL, jobs_of

from analysis.report import build_report

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PARTITION = "debug"  # the partition scripts/slurm_local.sh creates


def test_a_sweep_of_shards_runs_as_slurm_jobs_into_one_campaign(tmp_path, run_bench):
    assert shutil.which("sinfo"), "no SLURM here: run `make test-slurm` (scripts/slurm_local.sh up) first"
    state = subprocess.run(["sinfo", "-h", "-p", PARTITION, "-o", "%T"], capture_output=True, text=True)
    assert state.returncode == 0 and "idle" in state.stdout, f"partition {PARTITION} is not idle: {state}"
    proc = run_bench(
        "hydra/launcher=submitit_slurm",
        f"hydra.launcher.partition={PARTITION}",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.mem_gb=4",
        "hydra.launcher.timeout_min=20",
        "shard=range(0,3)",
        *SMALL[:-1],
        "experiment.base_seeds=[1,2,3]",
        multirun=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (root,) = (tmp_path / "embedded_block_vs_token").iterdir()
    jobs = jobs_of(tmp_path)
    assert sorted(j["shard"] for j in jobs) == [0, 1, 2] and all(j["code"] == 0 for j in jobs)
    slurm_ids = set()
    for manifest in root.glob("runs/*/manifest.json"):
        env = json.loads(manifest.read_text())["env_full"]
        slurm_ids.add(env.get("SLURM_JOB_ID"))  # the runner ran inside a SLURM job
    assert None not in slurm_ids and len(slurm_ids) == 3, slurm_ids  # one job per shard
    report = build_report([root])
    assert report.audit.passed, [c for c in report.audit.checks if c.status == "fail"]
    assert report.audit.coverage["planned"].sum() == 3 * 2 * 4
    print(proc.stdout[-3000:])
