"""Servers that break the protocol, and clients that break off: a DFLASH server whose replies carry no
spec_* fields (the campaign runs, the audit fails it, the command exits 1), a meta_info whose
completion_tokens is a string (that request fails alone, with the field named), and a client that closes its
connection in the middle of its request body (one line in the embedded server's log, no traceback)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from campaigns import SMALL, read_jsonl
from serverutil import engine_server, post_json

pytestmark = pytest.mark.slow

FAULTY = Path(__file__).resolve().parents[1] / "fixtures" / "servers"


def faulty(fault: str, nth: int = 1) -> list[str]:
    return [
        "server.module=faulty_engine",
        f"+server.env.PYTHONPATH={FAULTY}",
        f"+server.env.FAULTY_ENGINE={fault}",
        f"+server.env.FAULTY_NTH='{nth}'",
    ]


def test_a_speculative_server_without_verify_counts_fails_the_audit_and_the_command(run_bench, tmp_path):
    proc = run_bench("experiment=embedded_block_vs_token", "experiment.base_seeds=[3]", *SMALL[:-1], *faulty("no_spec"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert "runs: 2 finished" in out and "AUDIT FAILED" in out, out
    (root,) = (tmp_path / "embedded_block_vs_token").iterdir()
    report = (root / "report.md").read_text()
    assert "Audit: FAILED" in report and "Speculative runs report their verify counts" in report
    assert "carry no spec_verify_ct" in report


def test_a_malformed_meta_info_fails_its_request_not_the_run(run_bench, tmp_path):
    """In each run's server the 4th finished request (after the 2 warmup ones: a measured one) gets
    completion_tokens as a string: that request fails, named; the run goes on and, one failed request being
    allowed here, finishes."""
    proc = run_bench(
        "experiment=embedded_aa",
        "experiment.base_seeds=[3]",
        *SMALL,
        "experiment.max_failed_requests=1",
        *faulty("string_tokens", nth=4),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out
    (root,) = (tmp_path / "embedded_aa").iterdir()
    for run in sorted((root / "runs").iterdir()):
        records = read_jsonl(run / "records.jsonl")
        (bad,) = [r for r in records if r["error"]]
        assert len(records) == 6 and not bad["warmup"]
        assert bad["error"].startswith("malformed meta_info: completion_tokens is '") and "(str)" in bad["error"]
        assert bad["completion_tokens"] is None and isinstance(bad["meta_info"]["completion_tokens"], str)
        manifest = json.loads((run / "manifest.json").read_text())
        assert (manifest["status"], manifest["failed_requests"]) == ("finished", 1)


def test_a_client_that_closes_in_the_middle_of_its_body_is_one_log_line(tmp_path):
    with engine_server(["--model-path", "embedded:mini"]) as server:
        for path in ("/generate", "/v1/chat/completions"):
            with socket.create_connection(("127.0.0.1", server.port)) as sock:
                sock.sendall(
                    f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    "Content-Length: 1000\r\n\r\n".encode()
                    + b'{"text": "hel'
                )
                time.sleep(0.2)
        deadline = time.monotonic() + 10
        while server.log_text().count("closed the connection before its request body") < 2:
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.05)
        status, body = post_json(server.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}})
        assert status == 200 and body["meta_info"]["completion_tokens"] >= 1  # still serving
        log = server.log_text()
    assert "Traceback" not in log and "Error handling request" not in log, log
