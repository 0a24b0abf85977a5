"""The OpenAI-compatible backend (server=openai): any server speaking /v1/completions or /v1/chat/completions, launched
by a command the user gives or already running at a URL, its speculative counters read from its Prometheus /metrics
through a mapping in the config.

Unit parts: the request body, the stream reader, the config's refusals, a dry run against a URL. With the real
llama-server (tests/support/llamacpp_support.py: FAIL under `make test`, skip elsewhere): the same small campaign of
llamacpp_spec_vs_none run by the dedicated llama.cpp backend and by this one (llama-server launched by
server.command, its /metrics through server.counters): the generic counters give each arm the acceptance length the
dedicated backend's records give, and the same text.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest
from conftest import bench_process
from llamacpp_support import require_llama_server
from serverutil import engine_server

from analysis.audit import counter_acceptance
from analysis.load import load
from analysis.selection import pick
from configs import composed
from harness.backends import get
from harness.backends.counters import CounterMap, parse_metrics
from harness.backends.openai import OpenAIStream, payload
from harness.client.config import ClientConfig, SamplingConfig
from harness.client.requests import Outcome, RequestPlan, StreamError
from harness.runner.difference import check_arms_differ
from harness.runner.plan import planned_launches
from harness.server.config import ServerConfig
from harness.validation import ConfigError
from workloads.base import Item

SMALL = (
    "experiment=llamacpp_spec_vs_none",
    "experiment.base_seeds=[980406]",
    "workload.n_items=3",
    "sampling.max_new_tokens=24",
    "client.concurrency=1",
    "load_sample_s=0.1",
)
# llama-server's counters under the generic mapping (names as its /metrics spells them, prefix and all)
LLAMA_COUNTERS = {
    "output_tokens": "llamacpp:tokens_predicted_total",
    "drafts": "llamacpp:spec_decode_num_drafts_total",
    "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total",
}


def spec() -> RequestPlan:
    item = Item("7", 7, "What is 2 + 2?", [{"role": "user", "content": "2+2?"}], "4", None)
    return RequestPlan(item, 987, False, 16)


def test_payload_is_plain_openai():
    chat = payload("chat", SamplingConfig(temperature=0.0), ClientConfig(route="chat"), spec(), "m")
    assert chat["model"] == "m" and chat["messages"] == [{"role": "user", "content": "2+2?"}] and chat["seed"] == 987
    assert chat["stream_options"] == {"include_usage": True} and "prompt" not in chat
    plain = payload("completions", SamplingConfig(), ClientConfig(route="completions", stream=False), spec(), "m")
    assert plain["prompt"] == "What is 2 + 2?" and plain["max_tokens"] == 16 and "stream_options" not in plain


def test_stream_reader_takes_text_and_usage():
    reader, out = OpenAIStream(), Outcome(t_scheduled=0.0)
    events = [
        {"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]},
        {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
    ]
    for t, event in enumerate(events):
        reader.feed(json.dumps(event).encode(), float(t))
    reader.finish(out)
    assert out.text == "Hello" and out.chunk_times == [0.0, 1.0]
    assert out.meta_info["completion_tokens"] == 2 and out.meta_info["finish_reason"] == {"type": "stop"}
    with pytest.raises(StreamError, match="usage"):
        OpenAIStream().finish(Outcome(t_scheduled=0.0))


def test_the_generic_counters_sum_labels_and_refuse_unknown_names():
    text = (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 3\n'
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 4\n'
    )
    assert CounterMap({"drafts": "vllm:spec_decode_num_drafts_total"}).read(text) == {
        "vllm:spec_decode_num_drafts_total": 7.0
    }
    with pytest.raises(ConfigError, match="acceptance"):
        CounterMap({"acceptance": "x"})


@pytest.mark.parametrize(
    ("server", "said"),
    [
        (ServerConfig(backend="openai", model_path="m"), "exactly one of server.url"),
        (ServerConfig(backend="openai", model_path="m", url="http://h:1", command=["x"]), "exactly one of"),
        (ServerConfig(backend="embedded", model_path="m", url="http://h:1"), "launches its own server"),
    ],
)
def test_refusals(server, said):
    with pytest.raises(ConfigError, match=said):
        get(server.backend).check_config(server, ClientConfig(route="chat"), False)
    with pytest.raises(ConfigError, match="valid: embedded, sglang, llamacpp, openai"):
        get("vllm")


def test_a_dry_run_against_a_url(tmp_path):
    """Nothing needs to answer there for a dry run: it says the servers are not launched and their code unknown."""
    done = bench_process(
        tmp_path, "experiment=openai_two_servers", "server=openai_vllm", "server.model_path=m",
        "experiment.arms.0.url=http://127.0.0.1:9", "experiment.arms.1.url=http://127.0.0.1:10", "dry_run=true",
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = " ".join(done.stdout.split())
    assert "server: already running at http://127.0.0.1:10 (not launched)" in out
    assert "not launched by the run (its code cannot be pinned)" in out
    assert "not measured on backend openai" in out and "nothing was launched" in out


NO_FLUSH = "experiment.warmup.flush_cache=false"  # (the default experiment flushes; the OpenAI API cannot)


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        # the default experiment's DFLASH flags and its arm's block flag cannot reach a server already running
        (("server.url=http://127.0.0.1:9", NO_FLUSH), r"server.args=\['--speculative-algorithm'.* would not reach it"),
        (
            ("server.url=http://127.0.0.1:9", NO_FLUSH, "server.args=[]"),
            r"experiment.arms.1.args=\['--speculative-use-block-verification'\] would not reach it",
        ),
        (
            ("experiment=openai_two_servers", "experiment.arms.1.url=http://127.0.0.1:8000"),
            "resolve to the same launch \\(one server, already running at http://127.0.0.1:8000\\)",
        ),
        (
            ("experiment=openai_two_servers", "+experiment.arms.1.env={X: '1'}"),
            r"experiment.arms.1.env=\{'X': '1'\} would not reach it",
        ),
        (
            ("experiment=openai_two_servers", "server.command=[serve]"),
            r"experiment.arms\[deployed\].url=http://127.0.0.1:8000 \(its server.url\): .*exactly one of",
        ),
        (("experiment=openai_two_servers", "experiment.arms.0.url=127.0.0.1:8000"), "is not a server's base URL"),
        (("experiment.arms.0.url=http://127.0.0.1:8000", "server=embedded"), "launches its own server per run"),
        (("experiment=openai_two_servers", "+client.extra_body.seed=1"), "client.extra_body sets seed: the harness"),
        (
            ("experiment=openai_two_servers", "+client.extra_body={max_tokens: 5, top_p: 1}"),
            "client.extra_body sets max_tokens, top_p: the harness writes them in every chat request",
        ),
    ],
)
def test_servers_already_running_take_nothing_a_launch_gives(overrides, said):
    """A server the campaign does not launch takes no args, env, interpreter or code: arms that differed only there
    would measure one server twice; arms at one URL are one server (an A/A, refused unless declared)."""
    with pytest.raises(ConfigError, match=said):
        cfg = composed("server=openai_vllm", "server.model_path=m", "client.route=chat", *overrides)
        check_arms_differ(cfg, planned_launches(cfg), {})


def campaign(results: Path, *overrides: str) -> Path:
    done = bench_process(results, *SMALL, *overrides, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return next((results / "llamacpp_spec_vs_none").iterdir())


def arm_of(label: str) -> str:
    return label.rsplit("(", 1)[1].rstrip(")")


@pytest.mark.slow
def test_the_generic_counters_give_the_dedicated_backends_acceptance(tmp_path):
    binary, model = require_llama_server()
    dedicated = campaign(tmp_path / "llamacpp")
    command = [binary, "--model", model, "--host", "{host}", "--port", "{port}", "--metrics", "--parallel", "1"]
    generic = campaign(
        tmp_path / "openai",
        "server=openai",
        "server.command=[" + ",".join(f"'{token}'" for token in command) + "]",
        "server.seed_arg=--seed",
        "server.model_path=smollm2",
        "server.args=[--threads,'1',--no-webui]",
        "+client.extra_body.cache_prompt=false",  # (as the llama.cpp backend sends: outputs identical across arms)
        *(f"+server.counters.{ours}={name}" for ours, name in LLAMA_COUNTERS.items()),
    )
    data = load([dedicated])
    rec = data.records[pick(data).selection.measured]
    from_records = {
        arm: g["completion_tokens"].sum() / g["spec_verify_ct"].sum() for arm, g in rec.groupby("arm", observed=True)
    }
    gdata = load([generic])
    from_counters = {arm_of(k): v for k, v in counter_acceptance(gdata, pick(gdata).selection).items()}
    assert from_records["ngram"] > from_records["none"]  # (n-gram drafts were accepted)
    print(f"acceptance length, llama.cpp backend's records: {from_records}; openai backend's counters: {from_counters}")
    assert from_counters == pytest.approx(from_records, abs=1e-9)
    man = json.loads(next(generic.glob("runs/*-ngram-*/manifest.json")).read_text())
    assert man["server_counters"]["names"] == LLAMA_COUNTERS and man["server_url"] is None
    report = (generic / "report.md").read_text()
    assert "acceptance length from the counters" in report
    shutil.rmtree(tmp_path / "llamacpp", ignore_errors=True)


# the embedded server's /metrics under the generic mapping (prefix and all)
EMBEDDED_COUNTERS = {
    "output_tokens": "embedded:output_tokens_total",
    "drafts": "embedded:drafts_total",
    "draft_tokens": "embedded:draft_tokens_total",
    "accepted_tokens": "embedded:accepted_tokens_total",
    "verify_steps": "embedded:verify_steps_total",
}


def requests_served(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:  # noqa: S310  (a loopback http URL)
        return parse_metrics(resp.read().decode())["embedded:requests_total"]


@pytest.mark.slow
def test_two_servers_already_running_are_each_measured_at_their_url(tmp_path):
    """Experiment openai_two_servers against two embedded servers started beforehand (token-wise vs block
    verification): each arm's requests reach its own server only, each run's counters are its server's (the audit
    sums the run's records against them), and the report gives each arm the acceptance length from its counters."""
    flags = ["--model-path", "embedded:mini", "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens",
             "8", "--draft-mode", "sampled", "--max-running-requests", "4"]  # fmt: skip
    items, warmup, seeds = 3, 2, 2
    with engine_server(flags) as token, engine_server([*flags, "--speculative-use-block-verification"]) as block:
        before = {"deployed": requests_served(token.url), "candidate": requests_served(block.url)}
        done = bench_process(
            tmp_path, "experiment=openai_two_servers", "server.model_path=embedded:mini",
            f"experiment.arms.0.url={token.url}", f"experiment.arms.1.url={block.url}",
            *(f"+server.counters.{ours}={name}" for ours, name in EMBEDDED_COUNTERS.items()),
            "experiment.base_seeds=[1,2]", f"workload.n_items={items}", f"experiment.warmup.requests={warmup}",
            "sampling.max_new_tokens=16", "client.concurrency=2", "load_sample_s=0.1", timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        served = {"deployed": requests_served(token.url), "candidate": requests_served(block.url)}
    assert {arm: served[arm] - before[arm] for arm in served} == dict.fromkeys(served, seeds * (items + warmup))
    campaign = next((tmp_path / "openai_two_servers").iterdir())
    urls = {"deployed": token.url, "candidate": block.url}
    for path in campaign.glob("runs/*/manifest.json"):
        man = json.loads(path.read_text())
        assert man["server_url"] == urls[man["arm"]] and man["server_code"] is None
        assert man["server_counters"]["names"] == EMBEDDED_COUNTERS
    data = load([campaign])
    acceptance = {arm_of(k): v for k, v in counter_acceptance(data, pick(data).selection).items()}
    assert set(acceptance) == {"deployed", "candidate"} and all(v > 1.0 for v in acceptance.values())
    out = " ".join(done.stdout.split())
    assert "audit: passed with" in out and "code unknown (servers not launched by the campaign)" in out
    report = (campaign / "report.md").read_text()
    assert "candidate: only the declared difference" in report  # (the arms' URLs, as declared)
