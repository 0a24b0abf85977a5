"""Faults of the disk under a campaign, injected for real: a small tmpfs that fills up while a run measures, a
campaign folder made read-only under a running run (tests/support/mountns.py: a private mount namespace, nothing is
mounted on the host), and a resume over campaign files that were cut short or replaced.

Each ends as the README's Faults table says: one message naming the file and the system's reason, a non-zero
exit, no traceback, nothing written before lost, no server left; the campaign stops at once (no run after
another failing the same way); a resume over a corrupt file names it, says what to do and changes nothing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from campaigns import SMALL, engine_processes, ports_of, read_jsonl
from mountns import can_unshare, run_in_mount_namespace

pytestmark = pytest.mark.slow

ONE_SEED = ["experiment.base_seeds=[3]", *SMALL]
NO_NAMESPACE = can_unshare()


def squash(text: str) -> str:
    return " ".join(text.split())


def check_clean_stop(log: str, reason: str) -> None:
    flat = squash(log)
    assert "Traceback" not in log and "Exception ignored" not in log, log
    assert (
        reason in flat
        and "The campaign stopped at once" in flat
        and re.search(r"resume with \S+ -m harness\.bench .*campaign=disk", flat)
    ), log


@pytest.mark.skipif(NO_NAMESPACE is not None, reason=str(NO_NAMESPACE))
def test_a_disk_that_fills_up_mid_run_stops_the_campaign_and_a_resume_redoes_the_run(tmp_path):
    outcome = run_in_mount_namespace(
        {
            "out": str(tmp_path),
            "size": "4m",
            "fault": "full",
            "campaign": "disk",
            "experiment": "embedded_aa",
            "args": ONE_SEED,
            "resume": True,
        }
    )
    first, second = outcome["log"]
    assert outcome["rc"][0] == 1, first
    check_clean_stop(first, "No space left on device")
    assert first.count(" failed:") == 1, first  # one run failed, the second never started
    root = tmp_path / "results" / "embedded_aa" / "disk"
    # the resume after space was freed: the stopped run set aside (its records kept there) and run again
    assert outcome["rc"][1] == 0, second
    attempts = list((root / "attempts").iterdir())
    assert len(attempts) == 1 and len([r for r in read_jsonl(attempts[0] / "records.jsonl") if r["warmup"]]) == 2
    order = json.loads((root / "campaign.json").read_text())["order_run"]
    assert [o["status"] for o in order][-2:] == ["finished", "finished"]
    assert not engine_processes(ports_of(root))


@pytest.mark.skipif(NO_NAMESPACE is not None, reason=str(NO_NAMESPACE))
def test_a_campaign_folder_made_read_only_mid_run_stops_the_campaign_keeping_every_record(tmp_path):
    outcome = run_in_mount_namespace(
        {
            "out": str(tmp_path),
            "size": "64m",
            "fault": "readonly",
            "campaign": "disk",
            "experiment": "embedded_aa",
            "args": ONE_SEED,
        }
    )
    (log,) = outcome["log"]
    assert outcome["rc"] == [1], log
    check_clean_stop(log, "Read-only file system")
    root = tmp_path / "results" / "embedded_aa" / "disk"
    (run,) = list((root / "runs").iterdir())  # the second run never started
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "running"  # the last version the disk took: a resume redoes the run
    assert "manifest.json: Read-only file system" in squash(log)
    records = read_jsonl(run / "records.jsonl")  # the open file kept taking records: all of them are there
    assert len([r for r in records if r["warmup"]]) == 2 and len([r for r in records if not r["warmup"]]) == 4
    assert not engine_processes(ports_of(root))


# ---------------------------------------------------------------------------------------------
# resuming over corrupt campaign files


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished one-seed embedded_aa campaign `c` (two runs), made once."""
    tmp = tmp_path_factory.mktemp("finished")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.bench",
            f"results_dir={tmp}",
            "campaign=c",
            "experiment=embedded_aa",
            *ONE_SEED,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".lock")
    }


CORRUPT = {
    "truncated campaign.json": ("campaign.json", lambda t: t[: len(t) // 2], "is not valid JSON"),
    "empty campaign.json": ("campaign.json", lambda t: "", "is empty"),
    "campaign.json holding a list": ("campaign.json", lambda t: "[1, 2]", "holds a list, not an object"),
    "campaign.json without order_run": (
        "campaign.json",
        lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "order_run"}),
        "has no order_run list",
    ),
    "a truncated run manifest": ("runs/{run}/manifest.json", lambda t: t[:100], "is not valid JSON"),
    "a run manifest holding a list": ("runs/{run}/manifest.json", lambda t: "[]", "holds a list, not an object"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_resume_over_a_corrupt_campaign_file_names_it_and_changes_nothing(finished, tmp_path, run_bench, case):
    shutil.copytree(finished / "embedded_aa", tmp_path / "embedded_aa")
    root = tmp_path / "embedded_aa" / "c"
    name, corrupt, words = CORRUPT[case]
    path = root / name.format(run=sorted((root / "runs").iterdir())[0].name)
    path.write_text(corrupt(path.read_text()))
    before = snapshot(root)
    proc = run_bench("campaign=c", "experiment=embedded_aa", *ONE_SEED)
    out = squash(proc.stdout + proc.stderr)
    assert proc.returncode == 2 and "Traceback" not in out, out
    assert f"{path} {words}" in out and "Nothing was changed" in out, out
    assert snapshot(root) == before  # touched nothing
