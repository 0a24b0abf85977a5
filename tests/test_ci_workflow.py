"""The GitHub Actions workflow of docs/ci/ (docs/gate.md) is valid YAML of the workflow's shape, and every command
its steps run names something real: a make target of the Makefile, a console script of pyproject.toml, an
experiment of configs/experiment/, and bench overrides that compose (Hydra, against the typed schema)."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from analysis.report import parser
from harness.contract import parse_gate_rule

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "docs" / "ci" / "specbench-gate.yml"
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
TARGETS = set(re.findall(r"^([a-zA-Z0-9_-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
EXPRESSION = re.compile(r"\$\{\{[^}]*\}\}")  # ${{ github.run_id }} and the like, as Actions fills them in


def steps() -> list[tuple[str, dict]]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return [(job, step) for job, spec in doc["jobs"].items() for step in spec["steps"]]


def commands() -> list[tuple[str, list[str]]]:
    out = []
    for job, step in steps():
        if "run" in step:
            for line in step["run"].strip().splitlines():
                out.append((job, shlex.split(EXPRESSION.sub("X1", line))))
    return out


def test_the_workflow_has_the_shape_of_one():
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert doc["name"] and "pull_request" in doc[True]  # YAML 1.1 reads the key `on` as true
    assert set(doc["jobs"]) == {"cpu-embedded", "gpu-sglang"}
    assert doc["jobs"]["gpu-sglang"]["runs-on"][0] == "self-hosted"
    for job, step in steps():
        assert ("run" in step) != ("uses" in step), (job, step)
    assert len(commands()) >= 6


@pytest.mark.parametrize(("job", "argv"), commands(), ids=lambda x: x if isinstance(x, str) else " ".join(x)[:50])
def test_every_command_is_real(job, argv):
    head = argv[0]
    if head == "make":
        assert set(argv[1:]) <= TARGETS, argv
        return
    script = head.removeprefix(".venv/bin/")
    assert script in SCRIPTS, f"{job}: {head} is no console script of pyproject.toml"
    if script == "specbench-report":
        args = parser().parse_args(argv[1:])  # argparse exits on an unknown option
        assert args.fail_on and all(parse_gate_rule(str(r)) for r in args.fail_on) and args.junit
    if script == "specbench-bench":
        from configs import composed  # noqa: PLC0415

        overrides = [a for a in argv[1:] if not a.startswith(("results_dir=", "campaign="))]
        experiment = next(a.split("=", 1)[1] for a in overrides if a.startswith("experiment="))
        assert (ROOT / "configs" / "experiment" / f"{experiment}.yaml").is_file()
        refs = [a for a in overrides if ".source.ref=" not in a]  # the refs are the PR's (not in this clone)
        cfg = composed(*refs, "server.preflight=skip") if "sglang" in job else composed(*refs)
        assert cfg.experiment.name == experiment and cfg.report is False
