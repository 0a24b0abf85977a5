"""The declared draft length is audited (issue 52 item 5): a run whose server drafted another length than its
command declares fails the audit, naming the run. A real way to get there through the embedded server's own args:
DSPARK's block-size flag declares 3 draft tokens, but the server runs DFLASH, which ignores that flag (as SGLang
does) and drafts its default 7."""

from __future__ import annotations

import json

import pytest
from campaigns import SMALL, bench, campaign_dir

from analysis.audit import run_audit
from analysis.load import load
from analysis.selection import pick

pytestmark = pytest.mark.slow
NAME = "Each run drafted the draft length its command declares"


def test_a_server_that_ignored_the_draft_length_flag_fails_the_audit(tmp_path):
    proc = bench(
        tmp_path,
        *SMALL,
        "experiment.base_seeds=[11]",
        "server.args=[--speculative-algorithm,DFLASH,--draft-mode,sampled,--enable-deterministic-inference]",
        "experiment.arms.1.args=[--speculative-use-block-verification,--speculative-dspark-block-size,'3']",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # (report=false: the runs themselves are fine)
    root = campaign_dir(tmp_path)
    declared = {
        json.loads(p.read_text())["arm"]: json.loads(p.read_text())["declared_draft_length"]
        for p in root.glob("runs/*/manifest.json")
    }
    assert declared == {"token": 7, "block": 3}
    data = load([root])
    checks = {c.name: c for c in run_audit(data, pick(data), ["token", "block"], "token", [], False).checks}
    check = checks[NAME]
    assert check.status == "fail" and len(check.details) == 1
    assert (
        "-block-s11-r0 (arm block): its command declares 3 draft token(s) per verify step, its records show 7"
        in (check.details[0])
    )
