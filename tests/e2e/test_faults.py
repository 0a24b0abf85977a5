"""Fault injection on real subprocesses: every fault ends as a failed run and a non-zero exit, nothing
recorded is lost, no server is left behind.

Faults: a port already taken by another server, a server that answers on our port but is not ours,
a server that hangs (SIGSTOP) or dies (SIGKILL) mid-run, two runners on one campaign, bad sampling
values on both routes, one bad request in a batch of good ones, an audit that fails.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from campaigns import (
    SMALL,
    engine_processes,
    ports_of,
    read_jsonl,
    running_server_of_first_run,
    wait_for,
)
from serverutil import engine_server, post_json, post_raw

from harness.server.config import LogChecks
from harness.server.launch import Launch
from harness.server.process import Server, ServerError

pytestmark = pytest.mark.slow

MINI = ["--model-path", "embedded:mini"]


def bench_cmd(tmp: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "harness.bench", f"results_dir={tmp}", *overrides]


def run_bench(tmp: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(bench_cmd(tmp, *overrides), capture_output=True, text=True, timeout=timeout)


def manifests(root: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in root.glob("runs/*/manifest.json")}


# ---------------------------------------------------------------------------------------------
# someone else's server


def test_port_taken_by_another_server_fails_every_run(tmp_path):
    with engine_server(MINI) as other:
        proc = run_bench(
            tmp_path,
            "experiment=embedded_aa",
            "experiment.base_seeds=[1]",
            *SMALL,
            f"server.port={other.port}",
            "server.log_checks.must=[]",
        )
        assert other.alive()  # untouched
    assert proc.returncode == 1, proc.stdout + proc.stderr
    root = next((tmp_path / "embedded_aa").iterdir())
    for man in manifests(root).values():
        assert man["status"] == "failed"
        assert f"port {other.port} on 127.0.0.1 is already in use by pid {other.proc.pid}" in man["error"]
    assert not list(root.glob("runs/*/records.jsonl")) or all(
        not read_jsonl(p) for p in root.glob("runs/*/records.jsonl")
    )  # nothing measured on the other server


def test_a_server_answering_on_our_port_that_we_did_not_start_is_refused(tmp_path):
    """The readiness probe gets 200, but from a process outside the launched one's tree."""
    with engine_server(MINI) as other:
        spec = Launch(
            argv=[sys.executable, "-c", "import time; time.sleep(60)"],
            env_overrides={},
            host="127.0.0.1",
            port=other.port,
            log_path=tmp_path / "server.log",
            log_checks=LogChecks(),
            ready_timeout_s=30,
            stop_timeout_s=5,
        )
        # our process started without the port check, as after a race (the port was free a moment before)
        ours = Server(spec, proc=subprocess.Popen(spec.argv, start_new_session=True))
        try:
            with pytest.raises(
                ServerError,
                match=rf"port {other.port} answers, but not from the server this run "
                rf"started \(pid {ours.proc.pid}\); it is held by pid "
                rf"{other.proc.pid}",
            ):
                asyncio.run(ours.wait_ready())
        finally:
            ours.stop()
        assert other.alive()


# ---------------------------------------------------------------------------------------------
# hang and death mid-run


def start_runner(tmp: Path, campaign: str, *extra: str) -> subprocess.Popen:
    args = [
        f"campaign={campaign}",
        *SMALL[:-1],
        "client.concurrency=1",
        "sampling.max_new_tokens=256",
        "sampling.ignore_eos=true",
        "report=false",
        *extra,
    ]
    return subprocess.Popen(bench_cmd(tmp, *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(runner: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, _ = runner.communicate(timeout=timeout)
    finally:
        if runner.poll() is None:
            runner.kill()
    return out


@pytest.mark.parametrize("fault", ["hang", "death"])
def test_server_that_hangs_or_dies_mid_run_fails_the_run(tmp_path, fault):
    root = tmp_path / "embedded_block_vs_token" / fault
    runner = start_runner(
        tmp_path, fault, "client.timeout_s=4", "experiment.base_seeds=[3]", "server.stop_timeout_s=2"
    )  # a stopped server ignores SIGTERM: SIGKILL after 2 s
    victim = wait_for(lambda: running_server_of_first_run(root))
    written = len(read_jsonl(next(root.glob("runs/*/records.jsonl"))))
    victim.send_signal(signal.SIGSTOP if fault == "hang" else signal.SIGKILL)
    out = finish(runner)
    assert runner.returncode == 1, out
    first = json.loads((root / "campaign.json").read_text())["plan"][0]["run_id"]
    man = manifests(root)[first]
    assert man["status"] == "failed", man
    assert "request(s) errored, timed out or were aborted" in man["error"]
    assert man["failed_requests"] >= 1
    records = read_jsonl(root / "runs" / first / "records.jsonl")
    assert len(records) >= written  # what was recorded before the fault is kept
    if fault == "hang":
        assert any("timeout after 4s" in (r["error"] or "") for r in records)
    time.sleep(0.5)
    assert not engine_processes(ports_of(root))  # the stopped server was killed too


def test_server_that_hangs_after_the_last_request_fails_the_run(tmp_path):
    """Every request came back, then the server stopped answering: /health at the end catches it."""
    from harness.runner.runs import check_server_health  # noqa: PLC0415

    with engine_server(MINI) as srv:
        launch = Launch(
            argv=[],
            env_overrides={},
            host="127.0.0.1",
            port=srv.port,
            log_path=srv.log_path,
            log_checks=LogChecks(),
            ready_timeout_s=5,
            stop_timeout_s=5,
            health_timeout_s=2,
        )
        server = Server(launch, proc=srv.proc)
        ctx = type("Ctx", (), {"launch": launch})()
        asyncio.run(check_server_health(ctx, server))  # healthy: no exception
        srv.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(Exception, match=r"did not answer /health within 2 s \(server.health_timeout_s\)"):
                asyncio.run(check_server_health(ctx, server))
        finally:
            srv.proc.send_signal(signal.SIGCONT)


# ---------------------------------------------------------------------------------------------
# two runners, one campaign


def test_second_runner_on_a_live_campaign_is_refused(tmp_path):
    root = tmp_path / "embedded_block_vs_token" / "shared"
    # 256 tokens a request (start_runner's): the second runner's preflight takes seconds, and the first must
    # still be running when it asks for the lock
    first = start_runner(tmp_path, "shared", "experiment.base_seeds=[4]")
    try:
        wait_for(lambda: running_server_of_first_run(root))
        second = run_bench(
            tmp_path,
            "campaign=shared",
            *SMALL[:-1],
            "client.concurrency=1",
            "sampling.max_new_tokens=256",
            "sampling.ignore_eos=true",
            "report=false",
            "experiment.base_seeds=[4]",
        )
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"campaign {root} (shard 0) is being run by pid {first.pid}" in second.stdout.replace("\n", "")
        assert not (root / "attempts").exists()  # the live run was not set aside
    finally:
        out = finish(first)
    assert first.returncode == 0, out
    assert all(m["status"] == "finished" for m in manifests(root).values())


# ---------------------------------------------------------------------------------------------
# bad values on every route, and one bad request among good ones


@pytest.fixture(scope="module")
def spec_server():
    with engine_server(
        [*MINI, "--speculative-algorithm", "DFLASH", "--draft-mode", "sampled", "--enable-deterministic-inference"]
    ) as srv:
        yield srv


BAD_SAMPLING = [
    ("temperature", float("nan"), "temperature=nan must be a finite number >= 0"),
    ("temperature", float("inf"), "temperature=inf must be a finite number >= 0"),
    ("top_p", float("nan"), "top_p=nan must be in (0, 1]"),
    ("min_p", float("nan"), "min_p=nan must be in [0, 1]"),
    ("top_k", 2**70, "top_k=1180591620717411303424 must be -1 (whole vocabulary) or an integer in [1, 2147483647]"),
]
ROUTES = ("/generate", "/v1/chat/completions", "/v1/completions")


def route_body(route: str, key: str, value) -> dict:
    if route == "/generate":
        return {"text": "hello", "sampling_params": {"max_new_tokens": 4, key: value}}
    body = {"model": "embedded:mini", "max_tokens": 4, key: value}
    if route == "/v1/chat/completions":
        return {**body, "messages": [{"role": "user", "content": "hello"}]}
    return {**body, "prompt": "hello"}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(("key", "value", "message"), BAD_SAMPLING)
def test_bad_sampling_values_get_400_on_every_route(spec_server, route, key, value, message):
    status, body = post_json(spec_server.url + route, route_body(route, key, value))
    assert status == 400, body
    assert message in json.dumps(body)


@pytest.mark.parametrize("route", ROUTES)
def test_seed_beyond_64_bits_gets_400(spec_server, route):
    key = "sampling_seed" if route == "/generate" else "seed"
    status, body = post_json(spec_server.url + route, route_body(route, key, 2**70))
    assert status == 400 and "must be a 64-bit integer" in json.dumps(body), body


@pytest.mark.parametrize("route", ROUTES)
def test_deeply_nested_json_gets_400(spec_server, route):
    status, text = post_raw(spec_server.url + route, b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nests JSON arrays or objects too deeply" in text, text[:300]
    assert spec_server.alive()


def test_flush_cache_timeout_must_be_a_finite_number(spec_server):
    for bad in ("nan", "inf", "-1", "abc"):
        status, text = post_raw(spec_server.url + f"/flush_cache?timeout={bad}", b"")
        assert status == 400 and "must be a number of seconds in [0, 3600]" in text, (bad, text)
    assert post_raw(spec_server.url + "/flush_cache?timeout=1", b"")[0] == 200


def test_one_bad_request_among_good_ones_is_refused_alone(spec_server):
    """Four good requests and a bad one sent together: the good ones finish, the bad one is a 400."""

    async def send_all() -> list[tuple[int, dict]]:
        async with aiohttp.ClientSession() as session:

            async def one(body):
                async with session.post(spec_server.url + "/generate", json=body) as resp:
                    return resp.status, await resp.json(content_type=None)

            good = {
                "text": "count to ten",
                "sampling_params": {"max_new_tokens": 32, "ignore_eos": True, "sampling_seed": 5},
            }
            bad = {"text": "count to ten", "sampling_params": {"max_new_tokens": 32, "top_k": 2**70}}
            return await asyncio.gather(*(one(b) for b in (good, good, bad, good, good)))

    replies = asyncio.run(send_all())
    assert replies[2][0] == 400 and "top_k=" in json.dumps(replies[2][1])
    for status, body in replies[:2] + replies[3:]:
        assert status == 200 and body["meta_info"]["finish_reason"]["type"] == "length", body
        assert body["meta_info"]["completion_tokens"] == 32
    assert len({tuple(body["output_ids"]) for _, body in replies[:2] + replies[3:]}) == 1  # same seed, same tokens


# ---------------------------------------------------------------------------------------------
# a campaign whose audit fails


def test_failed_audit_makes_bench_exit_1_unless_told_otherwise(tmp_path):
    """Every request times out, the runs may have that many failures (so they finish), the audit fails."""
    args = [
        "experiment=embedded_aa",
        "experiment.base_seeds=[1]",
        *SMALL[:-1],
        "client.timeout_s=0.001",
        "experiment.max_failed_requests=100",
        "experiment.warmup.requests=0",
    ]
    strict = run_bench(tmp_path / "strict", *args)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "AUDIT FAILED" in strict.stdout and "exit 1 (strict_audit=false keeps exit 0)" in strict.stdout
    root = next((tmp_path / "strict" / "embedded_aa").iterdir())
    assert all(m["status"] == "finished" and m["failed_requests"] == 4 for m in manifests(root).values())
    assert "AUDIT FAILED" in (root / "report.md").read_text()
    (root / "report.md").unlink()
    # the same campaign again (every run kept: strict_audit does not change what is measured), lenient now
    lenient = run_bench(tmp_path / "strict", *args, f"campaign={root.name}", "strict_audit=false")
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    assert "AUDIT FAILED" in lenient.stdout and "exit 0 (strict_audit=false)" in lenient.stdout
    assert "AUDIT FAILED" in (root / "report.md").read_text()
