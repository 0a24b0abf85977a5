"""Resume re-hashes every input (issue 53): a jsonl workload edited between an interrupted campaign and its
resume is refused, naming the file and both SHA-256s, and nothing is run; so is a changed model file."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from campaigns import SMALL, bench, campaign_dir

from harness.runner.folder import Campaign, input_hashes
from harness.validation import ConfigError
from workloads.base import Workload

ITEMS = [
    {"id": i, "prompt": f"What is {i} plus {i}? Put the answer in \\boxed{{}}.", "answer": 2 * i} for i in range(4)
]


def write_items(path: Path, items: list[dict]) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in items))


@pytest.mark.slow
def test_an_edited_jsonl_workload_refuses_the_resume(tmp_path):
    items = tmp_path / "items.jsonl"
    write_items(items, ITEMS)
    small = [o for o in SMALL if not o.startswith("workload.n_items")]
    args = ["workload=jsonl", f"workload.path={items}", "experiment.base_seeds=[1]", *small]
    proc = bench(tmp_path / "results", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = campaign_dir(tmp_path / "results")
    old_sha = json.loads((root / "campaign.json").read_text())["workload"]["sha256"]
    (run,) = [p for p in (root / "runs").iterdir() if "block" in p.name]
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["status"] = "failed"  # interrupted: the resume would run it again
    (run / "manifest.json").write_text(json.dumps(manifest))
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.name.startswith(".lock")}
    write_items(items, [{**ITEMS[0], "prompt": "What is 1 plus 2?"}, *ITEMS[1:]])  # one prompt edited
    proc = bench(tmp_path / "results", *args, f"campaign={root.name}")
    out = (proc.stdout + proc.stderr).replace("\n", "")
    assert proc.returncode != 0, out
    assert f"the workload {items.resolve()} changed" in out and old_sha in out, out
    new_sha = next(w for w in out.split() if len(w) == 64 and w != old_sha and all(c in "0123456789abcdef" for c in w))
    assert f"it is {new_sha} now" in out
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.name.startswith(".lock")}
    assert after == before  # nothing was run again


def test_a_changed_model_file_refuses_the_resume(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    workload = Workload(name="w", dataset_id="d", revision=None, sha256="0" * 64, items=[])
    campaign = Campaign(
        cfg=SimpleNamespace(server=SimpleNamespace(model_path=str(model))),  # type: ignore[arg-type]
        config_dict={},
        workload=workload,
        plan=[],
        root=tmp_path / "c",
    )
    old = {"workload": {"sha256": workload.sha256}, "input_files": input_hashes(str(model))}
    campaign.check_inputs(old)  # unchanged: resumes
    (was,) = old["input_files"].values()
    model.write_bytes(b"GGUF" + bytes(99) + b"\1")
    with pytest.raises(ConfigError) as err:
        campaign.check_inputs(old)
    (now,) = input_hashes(str(model)).values()
    assert f"the model file {model.resolve()} changed" in str(err.value)
    assert was in str(err.value) and now in str(err.value)
