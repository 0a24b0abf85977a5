"""Sealed records (issue 53): a finished embedded campaign's records.jsonl and scores.jsonl are sealed in their
manifests; the report fails its audit, naming the file, when one is edited, truncated or deleted afterwards
(`--allow-edited` reports anyway, with a banner in every output); a copied campaign folder is refused, naming
both folders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from campaigns import SMALL, bench, campaign_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished campaign of the embedded server (no report yet), copied by each test before it changes it."""
    tmp = tmp_path_factory.mktemp("sealed")
    proc = bench(tmp, "experiment.base_seeds=[1]", *SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return campaign_dir(tmp)


def copy_of(finished: Path, tmp_path: Path) -> Path:
    dst = tmp_path / finished.parent.name / finished.name
    shutil.copytree(finished, dst)
    return dst


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analysis.report", "--bootstrap", "50", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


def measured_run(root: Path) -> Path:
    """The run of the speculative arm (block), whose records carry accepted-draft counts."""
    (run,) = [p for p in sorted((root / "runs").iterdir()) if "block" in p.name]
    return run


def test_a_clean_campaign_verifies_its_seals(finished, tmp_path):
    root = copy_of(finished, tmp_path)
    proc = report(str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((root / "summary.json").read_text())
    assert summary["edited_records"] is None and "Records sealed" not in " ".join(summary["audit"]["warned"])


def test_an_edited_accepted_draft_count_fails_the_audit_naming_the_file(finished, tmp_path):
    root = copy_of(finished, tmp_path)
    path = measured_run(root) / "records.jsonl"
    lines = path.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if not json.loads(line)["warmup"])
    rec = json.loads(lines[i])
    rec["spec_num_correct_drafts"] += 1  # one more accepted draft than the server reported
    lines[i] = json.dumps(rec, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n")
    proc = report(str(root))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Records sealed" in proc.stderr and str(path) in proc.stderr  # the terminal names the file too
    md = (root / "report.md").read_text()
    assert f"{path}: edited" in md
    # --allow-edited: reported, a banner in every output; the server's own counters still catch this edit (exit 1)
    proc = report(str(root), "--allow-edited")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "AUDIT FAILED: Per-request counts add up to the server's own counters" in proc.stdout + proc.stderr
    assert "EDITED RECORDS (--allow-edited)" in proc.stdout and str(path) in proc.stdout
    for name in ("report.md", "pr.md"):
        assert (root / name).read_text().startswith("> **EDITED RECORDS (--allow-edited)"), name
    assert str(path) in json.loads((root / "summary.json").read_text())["edited_records"]


def test_a_truncated_records_file_fails_the_audit(finished, tmp_path):
    root = copy_of(finished, tmp_path)
    path = measured_run(root) / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    proc = report(str(root))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{path}: truncated: {len(lines) - 1} of its {len(lines)} sealed line(s)" in (root / "report.md").read_text()


def test_a_deleted_scores_file_fails_the_audit(finished, tmp_path):
    root = copy_of(finished, tmp_path)
    path = measured_run(root) / "scores.jsonl"
    path.unlink()
    proc = report(str(root))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{path}: deleted" in (root / "report.md").read_text()


def test_a_copied_campaign_folder_is_refused_naming_both(finished, tmp_path):
    root = copy_of(finished, tmp_path)
    backup = root.with_name(root.name + ".bak")
    shutil.copytree(root, backup)  # cp -r C C.bak inside results/<experiment>/
    proc = report(str(root.parent))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(root) in proc.stderr and str(backup) in proc.stderr and "both hold campaign" in proc.stderr
    assert not (root.parent / "report.md").exists()
