"""The llama.cpp backend: llama-server (built from the PyPI sdist by `make llamacpp`) driven by the harness.

Unit parts (no binary): the request body, the stream reader and the counts mapped from `timings`, the /metrics
parser, the 32-bit seed and route refusals. With the real binary (tests/support/llamacpp_support.py: FAIL under `make
test`, skip elsewhere): its parser refuses a misspelled or removed flag before anything launches, naming the flag
and its config key; the log lines the shipped experiments check are rendered by the binary itself; a small campaign
of llamacpp_spec_vs_none end to end (greedy: the same text in both arms; records equal to the /metrics deltas); and
the audit fails tampered copies of it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import bench_process
from gguf_files import tiny_gguf
from llamacpp_support import require_llama_server

from analysis.audit import run_audit
from analysis.load import load
from analysis.selection import pick
from harness.backends.launch import build_launch
from harness.backends.llamacpp import COUNTERS
from harness.backends.llamacpp_build import BuildError, find_binary
from harness.backends.llamacpp_preflight import identity_problem, parse_run
from harness.backends.llamacpp_stream import LlamaStream, meta_info, payload
from harness.client.config import ClientConfig, SamplingConfig
from harness.client.requests import Outcome, RequestPlan, StreamError
from harness.hydra_setup import CONFIG_DIR
from harness.server.config import ArmConfig, ServerConfig
from harness.server.logs import check_log
from harness.server.process import Server, free_port
from workloads.base import Item

EXPERIMENTS = ("llamacpp_spec_vs_none", "llamacpp_draft_max")
SMALL = (
    "experiment=llamacpp_spec_vs_none",
    "experiment.base_seeds=[980406]",
    "workload.n_items=3",
    "sampling.max_new_tokens=24",
    "client.concurrency=1",
    "load_sample_s=0.1",
)


def item() -> Item:
    return Item(
        item_id="7",
        seed_offset=7,
        prompt="What is 2 + 2?",
        messages=[{"role": "user", "content": "2+2?"}],
        answer="4",
        category=None,
    )


# ---------------------------------------------------------------------- unit


def test_payload_turns_off_the_prompt_cache_and_sends_the_seed():
    spec = RequestPlan(item(), 980413, False, 24)
    chat = payload("chat", SamplingConfig(temperature=0.0), ClientConfig(route="chat"), spec, "m")
    assert chat["cache_prompt"] is False and chat["timings_per_token"] is True and chat["seed"] == 980413
    assert chat["messages"] == item().messages and "prompt" not in chat and chat["max_tokens"] == 24
    assert chat["stream_options"] == {"include_usage": True}
    plain = payload("completions", SamplingConfig(), ClientConfig(route="completions", stream=False), spec, "m")
    assert plain["prompt"] == "What is 2 + 2?" and "messages" not in plain and "stream_options" not in plain


def test_counts_come_from_the_timings():
    timings = {"predicted_n": 20, "draft_n": 30, "draft_n_accepted": 7, "prompt_n": 40}
    meta = meta_info("stop", {"completion_tokens": 20, "prompt_tokens": 40}, timings)
    assert (
        meta["completion_tokens"],
        meta["spec_verify_ct"],
        meta["spec_num_correct_drafts"],
        meta["spec_num_proposed_drafts"],
    ) == (20, 12, 7, 30)
    assert meta["raw"]["timings"] is timings and meta["finish_reason"] == {"type": "stop"}
    plain = meta_info("length", {"completion_tokens": 5}, {"predicted_n": 5})  # nothing drafted: keys absent
    assert (plain["spec_verify_ct"], plain["spec_num_correct_drafts"], plain["spec_num_proposed_drafts"]) == (4, 0, 0)
    with pytest.raises(StreamError, match="completion_tokens 6 != timings.predicted_n 5"):
        meta_info("stop", {"completion_tokens": 6}, {"predicted_n": 5})
    with pytest.raises(StreamError, match="no `timings`"):
        meta_info("stop", {"completion_tokens": 6}, None)


def test_stream_reader_counts_each_chunks_tokens():
    """A chat stream as llama-server sends it with timings_per_token (the shape seen from the real binary)."""
    events = [
        {"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": "The"}}], "timings": {"predicted_n": 1}},
        {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": " cat"}}], "timings": {"predicted_n": 2}},
        {
            "choices": [{"finish_reason": None, "index": 0, "delta": {"content": "."}}],
            "timings": {"predicted_n": 3, "draft_n": 4},
        },
        {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}]},
        {
            "choices": [],
            "usage": {"completion_tokens": 4, "prompt_tokens": 9},
            "timings": {"predicted_n": 4, "draft_n": 4, "draft_n_accepted": 2},
        },
    ]
    reader, out = LlamaStream(), Outcome(t_scheduled=0.0)
    for t, event in enumerate(events):
        reader.feed(json.dumps(event).encode(), float(t))
    reader.finish(out)
    assert out.text == "The cat."
    assert out.chunk_tokens == [1, 1, 1, 1] and out.chunk_times == [1.0, 2.0, 3.0, 5.0]  # the EOS token: last event
    assert out.meta_info["spec_verify_ct"] == 1 and out.meta_info["finish_reason"] == {"type": "stop"}


def test_metrics_parser_and_deltas():
    text = (
        "# HELP llamacpp:n_decode_total x\n# TYPE llamacpp:n_decode_total counter\nllamacpp:n_decode_total 62\n"
        "llamacpp:tokens_predicted_total 60\nllamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        '{position="0"} 1\nllamacpp:predicted_tokens_seconds 44.6261\n'
    )
    metrics = COUNTERS.read(text)  # (prometheus_client's parser; a labelled metric summed over its labels)
    assert metrics == {
        "n_decode_total": 62.0,
        "tokens_predicted_total": 60.0,
        "spec_decode_num_accepted_tokens_per_pos_total": 1.0,
        "predicted_tokens_seconds": 44.6261,
    }
    assert COUNTERS.delta(metrics, {**metrics, "n_decode_total": 70.0}) == {
        "n_decode_total": 8.0,
        "tokens_predicted_total": 0.0,
    }


def test_binary_given_but_not_executable_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "llama-server"
    fake.write_text("not a program")
    with pytest.raises(BuildError, match="server.binary=.*is not an executable file"):
        find_binary(str(fake))
    monkeypatch.setenv("LLAMA_SERVER", str(tmp_path / "missing"))
    with pytest.raises(BuildError, match="LLAMA_SERVER=.*make llamacpp"):
        find_binary(None)


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["experiment.arms.1.seed_stream=1"], "does not fit llama-server's 32-bit seed"),
        (["experiment.base_seeds=[4294967290]"], "does not fit llama-server's 32-bit seed"),
        (["experiment.warmup.flush_cache=true"], "llama-server has no /flush_cache"),
        (["client.route=generate"], "llama-server does not serve"),
    ],
)
def test_refused_before_anything_launches(tmp_path, overrides, said):
    done = bench_process(tmp_path, "experiment=llamacpp_spec_vs_none", "dry_run=true", *overrides, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in " ".join((done.stdout + done.stderr).split())


def test_a_binary_that_is_not_llama_server_is_refused(tmp_path):
    model = tiny_gguf(tmp_path / "m.gguf")
    lookalike = tmp_path / "llama-server"  # answers --version as llama.cpp's builds do, and accepts every argv
    lookalike.write_text('#!/bin/sh\necho "version: 1 (build 1, commit abc)" >&2\necho "built with cc for x" >&2\n')
    lookalike.chmod(0o755)
    assert identity_problem(str(lookalike)) is None
    for binary in ("/bin/true", "/bin/echo"):
        done = bench_process(
            tmp_path, "experiment=llamacpp_spec_vs_none", "dry_run=true", f"server.binary={binary}",
            f"server.model_path={model}", timeout=120,
        )  # fmt: skip
        text = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2, text
        assert f"{binary} is not llama-server: its `--version` printed" in text and "argv preflight FAILED" in text


# ---------------------------------------------------------------------- the real binary


@pytest.mark.parametrize(
    ("args", "flag", "said"),
    [
        (["--spec-typo", "ngram-simple"], "--spec-typo", "invalid argument"),
        (["--draft-max", "4"], "--draft-max", "the argument has been removed"),
        (["--spec-type", "ngram-bogus"], "--spec-type", "unknown speculative type"),
    ],
)
def test_the_binary_refuses_a_bad_flag_naming_its_config_key(tmp_path, args, flag, said):
    require_llama_server()
    arm_args = "[" + ",".join(args) + "]"
    for dry in ("true", "false"):
        done = bench_process(
            tmp_path,
            "experiment=llamacpp_spec_vs_none",
            f"experiment.arms.1.args={arm_args}",
            f"dry_run={dry}",
            timeout=120,
        )
        text = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2, text
        assert f"{flag} (from experiment.arms.1.args)" in text and said in text and "argv preflight FAILED" in text
    assert "no server was launched" in text and not (tmp_path / "llamacpp_spec_vs_none").exists()


def test_every_shipped_argv_parses():
    binary, _ = require_llama_server()
    for name in EXPERIMENTS:
        exp = yaml.safe_load((CONFIG_DIR / "experiment" / f"{name}.yaml").read_text())
        server_args = (exp.get("server") or {}).get("args") or []
        for arm in exp["experiment"]["arms"]:
            check = parse_run(binary, tuple(str(a) for a in [*server_args, *arm["args"]]))
            assert check.ok, (name, arm["name"], check.message)


def shipped_log_checks() -> tuple[set[str], set[str]]:
    must, must_not = set(), set()
    for name in EXPERIMENTS:
        checks = yaml.safe_load((CONFIG_DIR / "experiment" / f"{name}.yaml").read_text())["server"]["log_checks"]
        must |= set(checks.get("must", []))
        must_not |= set(checks.get("must_not", []))
    return must, must_not


async def started(args: list[str], tmp_path: Path, name: str) -> tuple[Path, list]:
    """A real llama-server with `args` through the harness's own launcher: its log and its /slots."""
    server = ServerConfig(
        backend="llamacpp",
        model_path="hf:smollm2-135m-instruct",
        seed_arg="--seed",
        ready_timeout_s=60,
        args=["--threads", "1", "--no-webui", *args],
    )
    spec = build_launch(
        server,
        ArmConfig(name=name),
        port=free_port(),
        base_seed=1,
        gpu=None,
        log_path=tmp_path / f"{name}.log",
        slots=1,
    )
    from harness.server.control import get_json  # noqa: PLC0415

    async with Server(spec) as proc:
        await proc.wait_ready()
        slots = await get_json(spec.base_url, "/slots")
    return spec.log_path, slots or []


def test_log_lines_the_checks_expect_come_from_the_real_binary(tmp_path):
    """The `must` lines appear in a real start with speculation on; the `must_not` line is what the binary prints when
    speculation fails to start (draft-simple without a draft model): a real log of each, checked with the shipped
    regexes. A draft model without --spec-type starts no speculation and prints nothing: only /slots tell."""
    require_llama_server()
    must, must_not = shipped_log_checks()
    ok_log, ok_slots = asyncio.run(started(["--spec-type", "ngram-simple"], tmp_path, "ok"))
    bad_log, bad_slots = asyncio.run(started(["--spec-type", "draft-simple"], tmp_path, "bad"))
    model = require_llama_server()[1]
    silent_log, silent_slots = asyncio.run(started(["--spec-draft-model", model], tmp_path, "silent"))
    from harness.server.config import LogChecks  # noqa: PLC0415

    checks = LogChecks(must=sorted(must), must_not=sorted(must_not))
    assert check_log(ok_log, checks).passed and all(s["speculative"] for s in ok_slots)
    failed = check_log(bad_log, checks)
    assert not failed.passed and all(failed.must_not.values()) and not any(s["speculative"] for s in bad_slots)
    assert check_log(silent_log, checks).passed and not any(s["speculative"] for s in silent_slots)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Path:
    """A small llamacpp_spec_vs_none campaign (2 runs x 3 items x 24 tokens, concurrency 1), end to end."""
    require_llama_server()
    results = tmp_path_factory.mktemp("llamacpp")
    done = bench_process(results, *SMALL, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return next((results / "llamacpp_spec_vs_none").iterdir())


def records(root: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for path in sorted(root.glob("runs/*/records.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out.setdefault(rec["arm"], []).append(rec)
    return out


@pytest.mark.slow
def test_campaign_end_to_end(campaign):
    recs = records(campaign)
    measured = {arm: [r for r in rs if not r["warmup"]] for arm, rs in recs.items()}
    assert sorted(measured) == ["ngram", "none"] and all(len(rs) == 3 for rs in measured.values())
    text = {arm: [r["output_text"] for r in sorted(rs, key=lambda r: r["item_id"])] for arm, rs in measured.items()}
    assert text["none"] == text["ngram"]  # greedy: llama.cpp's speculation is lossless
    assert all(
        r["spec_num_correct_drafts"] == 0 and r["meta_info"]["spec_num_proposed_drafts"] == 0 for r in measured["none"]
    )
    assert sum(r["meta_info"]["spec_num_proposed_drafts"] for r in measured["ngram"]) > 0
    for path in campaign.glob("runs/*/manifest.json"):
        man = json.loads(path.read_text())
        assert man["status"] == "finished" and man["server_code"] is None
        binary = man["server_binary"]
        assert re.fullmatch(r"[0-9a-f]{64}", binary["sha256"]) and "version:" in binary["version"]
        assert binary["build_info"] == man["server_info"]["build_info"]
        arm_recs = [r for r in measured[man["arm"]]]
        delta = man["server_counters"]["delta"]
        assert delta["tokens_predicted_total"] == sum(r["completion_tokens"] for r in arm_recs)
        assert delta["n_decode_total"] == sum(r["spec_verify_ct"] + 1 for r in arm_recs)  # concurrency 1
    report = (campaign / "report.md").read_text()
    assert "Per-request counts add up to the server's own counters (/metrics deltas) | ok" in report
    assert "Speculative runs drafted; the others report no drafts                    | ok" in report


def audit_of(root: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    data = load([root])
    picked = pick(data)
    audit = run_audit(data, picked, ["none", "ngram"], "none", [], False)
    return {c.name: (c.status, c.details) for c in audit.checks}


@pytest.mark.slow
def test_audit_fails_tampered_counts(campaign, tmp_path):
    """A record whose accepted drafts no longer match the server's delta, and a run whose command asks for
    speculation that its server did not do, each fail the audit."""
    copy = Path(shutil.copytree(campaign, tmp_path / "c"))
    path = next(copy.glob("runs/*-ngram-*/records.jsonl"))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    target = next(r for r in lines if not r["warmup"])
    target["spec_num_correct_drafts"] += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    none = next(copy.glob("runs/*-none-*/manifest.json"))
    man = json.loads(none.read_text())
    man["command"] += ["--spec-type", "ngram-simple"]
    none.write_text(json.dumps(man))
    checks = audit_of(copy)
    status, details = checks["Per-request counts add up to the server's own counters (/metrics deltas)"]
    assert status == "fail" and any("spec_num_correct_drafts" in d for d in details)
    status, details = checks["Speculative runs drafted; the others report no drafts"]
    assert status == "fail" and any("no slot speculates" in d for d in details)
    assert audit_of(campaign)["Speculative runs drafted; the others report no drafts"][0] == "ok"


def test_make_target_prints_where_the_binary_is():
    """`python -m harness.backends.llamacpp_build` (make llamacpp) finds the cached build without building again."""
    binary, _ = require_llama_server()
    done = subprocess.run(
        [sys.executable, "-m", "harness.backends.llamacpp_build"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "nothing to build" in done.stdout or "nothing built" in done.stdout
    assert binary in done.stdout or "LLAMA_SERVER" in done.stdout
