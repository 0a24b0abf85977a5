"""Commands the runner prints work as printed (issue 53): the resume hint names an interpreter that has the
project's packages (`.venv/bin/python` after `make bench`, not the system's `python`); llama.cpp's model refusal
names the target that installs its model; a report of a folder of several experiments says briefly what to give."""

from __future__ import annotations

import importlib.metadata
import shlex
import subprocess
from pathlib import Path

import pytest

from analysis.report import main
from harness.backends import llamacpp
from harness.runner.command import resume_hint
from harness.validation import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_the_resume_hint_runs_with_its_interpreter(monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(resume_hint(None, "20261206-000000-c8-abcdef", None, False))
    assert argv[1:] == ["-m", "harness.bench", "campaign=20261206-000000-c8-abcdef"]
    # the interpreter as printed, from where the command ran: it imports what harness.bench needs
    proc = subprocess.run([argv[0], "-c", "import hydra, harness.bench"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{argv[0]}: {proc.stderr}"


def test_llamacpp_model_refusal_names_make_bench_llamacpp(monkeypatch):
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ConfigError, match=r"`make bench-llamacpp` installs it") as err:
        llamacpp.model_file("hf:smollm2-135m-instruct")
    assert "bench-real" not in str(err.value)


def test_a_folder_of_several_experiments_is_refused_briefly(capsys):
    assert main([str(ROOT / "results")]) == 2
    err = capsys.readouterr().err
    assert "campaigns of" in err and "experiments; a report compares the campaigns of one experiment" in err
    assert "llamacpp_cpu_20261205" in err and len(err) < 4000, len(err)
