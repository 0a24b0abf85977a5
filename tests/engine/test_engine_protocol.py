"""SGLang's HTTP protocol, against `python -m harness.engine` as a real subprocess on a free port."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from serverutil import (
    Stream,
    engine_server,
    get,
    get_json,
    post_json,
    post_raw,
    post_sse,
    start_engine,
    stop_engine,
    wait_ready,
)

from harness.engine.service import READY_LINE
from harness.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

GAMMA = 5
SPEC_ARGS = [
    "--model-path",
    "embedded:mini",
    "--speculative-algorithm",
    "DFLASH",
    "--speculative-num-draft-tokens",
    str(GAMMA + 1),
    "--draft-mode",
    "sampled",
    "--speculative-use-block-verification",
    "--max-running-requests",
    "8",
    "--enable-metrics",
    "--decode-log-interval",
    "1",
    "--random-seed",
    "7",
]
TOK = Tokenizer(2048)
SPEC_KEYS = {
    "spec_verify_ct",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_accept_rate",
    "spec_correct_drafts_histogram",
}


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def server(cache_home: Path):
    with engine_server(SPEC_ARGS, env={"XDG_CACHE_HOME": str(cache_home)}) as s:
        yield s


def generate(server, body: dict) -> dict:
    status, reply = post_json(server.url + "/generate", body)
    assert status == 200, reply
    return reply


def check_spec_fields(meta: dict) -> None:
    assert SPEC_KEYS <= meta.keys()
    ct, hist = meta["spec_verify_ct"], meta["spec_correct_drafts_histogram"]
    assert len(hist) == GAMMA + 1 and sum(hist) == ct
    assert sum(i * h for i, h in enumerate(hist)) == meta["spec_num_correct_drafts"]
    assert meta["spec_num_proposed_drafts"] == ct * GAMMA
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / ct)
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / (ct * GAMMA))


# ---------------------------------------------------------------------- info and health


def test_health_and_info_endpoints(server) -> None:
    assert get(server.url + "/health")[0] == 200
    assert get(server.url + "/health_generate")[0] == 200
    info = get_json(server.url + "/server_info")
    assert info["model_path"] == "embedded:mini" and info["speculative_algorithm"] == "DFLASH"
    assert info["enable_deterministic_inference"] is False and info["speculative_num_draft_tokens"] == GAMMA + 1
    assert info["speculative_use_block_verification"] is True and info["random_seed"] == 7
    assert get_json(server.url + "/get_server_info")["model_path"] == "embedded:mini"
    model = get_json(server.url + "/model_info")
    assert model["model_path"] == "embedded:mini" and model["vocab_size"] == 2048
    assert model["tokenizer_path"] == info["tokenizer_path"]


def test_tokenizer_folder_is_published_in_the_cache(server, cache_home: Path) -> None:
    folder = Path(get_json(server.url + "/model_info")["tokenizer_path"])
    assert folder.parent == cache_home / "specbench" / "tokenizers" and folder.name.startswith("mini-v2048-")
    assert sorted(p.name for p in folder.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == 2048 and sorted(vocab.values()) == list(range(2048))
    assert f"Hugging Face tokenizer folder (tokenizer_path): {folder}" in server.log_text()
    models = get_json(server.url + "/v1/models")
    assert models["data"][0]["id"] == "embedded:mini"


def test_port_zero_logs_the_port_the_system_gave() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.engine", "--model-path", "embedded:tiny", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = next(line for line in proc.stdout if "Listening on" in line)  # type: ignore[union-attr]
        port = int(line.rsplit(":", 1)[1])
        assert port > 0 and get(f"http://127.0.0.1:{port}/health")[0] in (200, 503)  # the server answers there
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_log_has_the_resolved_config_and_the_ready_line(server) -> None:
    log = server.log_text()
    assert "sampling_enabled=True" in log and "speculative_use_block_verification=True" in log
    assert READY_LINE in log and "has no effect" not in log
    # SGLang's own line for sampled DFLASH drafts, which the experiments' log checks look for
    assert "DFLASH selector decode folded into the draft cuda graph (sampling_enabled=True)." in log


# ---------------------------------------------------------------------- /generate


def test_generate_returns_text_ids_and_meta_info(server) -> None:
    reply = generate(
        server, {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
    )
    meta = reply["meta_info"]
    assert reply["text"] == TOK.decode(reply["output_ids"])
    assert meta["completion_tokens"] == len(reply["output_ids"]) == 40
    assert meta["prompt_tokens"] == len(TOK.encode("Once upon a time"))
    assert meta["finish_reason"] == {"type": "length", "length": 40}
    assert meta["cached_tokens"] == 0 and meta["e2e_latency"] > 0
    assert meta["queue_time"] >= 0 and meta["request_finished_ts"] >= meta["request_received_ts"]
    check_spec_fields(meta)
    assert meta["spec_accept_length"] > 1.0


def test_stream_sends_one_cumulative_chunk_per_step_then_done(server) -> None:
    events = post_sse(
        server.url + "/generate",
        {"input_ids": [5, 6, 7], "stream": True, "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}},
    )
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ids = [c["output_ids"] for c in chunks]
    assert all(b[: len(a)] == a and len(b) > len(a) for a, b in zip(ids, ids[1:], strict=False))
    assert any(len(b) - len(a) > 1 for a, b in zip(ids, ids[1:], strict=False))  # a block per chunk
    assert all(c["text"] == TOK.decode(c["output_ids"]) for c in chunks)
    assert all(c["meta_info"]["completion_tokens"] == len(c["output_ids"]) for c in chunks)
    *partial, final = chunks
    assert all(c["meta_info"]["finish_reason"] is None and "spec_verify_ct" not in c["meta_info"] for c in partial)
    check_spec_fields(final["meta_info"])
    assert len(chunks) == 1 + final["meta_info"]["spec_verify_ct"]  # prefill, then one chunk per verify step


def test_batched_prompts_return_a_list(server) -> None:
    reply = generate(
        server, {"text": ["a", "bb", "ccc"], "rid": ["x", "y", "z"], "sampling_params": {"max_new_tokens": 5}}
    )
    assert isinstance(reply, list) and len(reply) == 3
    assert [r["meta_info"]["prompt_tokens"] for r in reply] == [1, 2, 3]
    assert [r["meta_info"]["id"] for r in reply] == ["x", "y", "z"]


def test_stop_string_and_stop_token_ids(server) -> None:
    greedy = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
    full = generate(server, {"input_ids": [9, 8, 7], "sampling_params": greedy})
    text, ids = full["text"], full["output_ids"]
    stop = text[20:24]
    assert stop and stop not in text[:20]
    cut = generate(server, {"input_ids": [9, 8, 7], "sampling_params": {**greedy, "stop": [stop]}})
    assert cut["text"] == text[: text.index(stop)]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert full["output_ids"][: len(cut["output_ids"])] == cut["output_ids"]
    token = ids[10]
    by_id = generate(server, {"input_ids": [9, 8, 7], "sampling_params": {**greedy, "stop_token_ids": [token]}})
    assert by_id["output_ids"] == ids[: ids.index(token) + 1]
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": token}


def test_sglang_bench_client_body_is_accepted(server) -> None:
    """The fields SGLang's own benchmark client always sends, and an unknown top-level key (ignored, as SGLang
    does); an unknown sampling_params key is still refused."""
    body = {
        "text": "hello",
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True},
        "stream": False,
        "lora_path": None,
        "return_logprob": False,
        "return_routed_experts": False,
        "logprob_start_len": -1,
        "no_such_key": 1,
    }
    assert generate(server, body)["meta_info"]["completion_tokens"] == 6
    status, reply = post_json(server.url + "/generate", {**body, "sampling_params": {"max_tokens": 6}})
    assert status == 400 and "unknown sampling_params key(s) ['max_tokens']" in reply["error"]["message"]


def test_sampling_seed_is_ignored_without_deterministic_inference(server) -> None:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 48, "sampling_seed": 5, "ignore_eos": True}}
    assert generate(server, body)["output_ids"] != generate(server, body)["output_ids"]


BAD_BODIES = [
    b"{not json",
    json.dumps({"text": "a", "sampling_params": {"max_new_tokens": -1}}).encode(),
    json.dumps({"text": "a", "sampling_params": {"top_p": 1.5}}).encode(),
    json.dumps({"text": "a", "sampling_params": {"top_p": 0}}).encode(),
    json.dumps({"text": "a", "sampling_params": {"max_tokens": 3}}).encode(),
    json.dumps({"text": "a", "input_ids": [1]}).encode(),
    json.dumps({"sampling_params": {}}).encode(),
    json.dumps({"input_ids": [1, 99999]}).encode(),
    json.dumps({"text": "a", "sampling_params": {"max_new_tokens": 10**9}}).encode(),
    json.dumps({"text": "a", "return_logprob": True}).encode(),
    json.dumps({"text": "a", "lora_path": "adapter"}).encode(),
    json.dumps({"text": "a", "sampling_params": {"frequency_penalty": 1.0}}).encode(),
]


def test_bad_input_gets_400_with_a_message_and_the_server_keeps_serving(server) -> None:
    for body in BAD_BODIES:
        status, text = post_raw(server.url + "/generate", body)
        assert status == 400, (body, status, text)
        assert json.loads(text)["error"]["message"], body
    assert generate(server, {"text": "still here", "sampling_params": {"max_new_tokens": 3}})["meta_info"]


def test_flush_cache_refuses_while_busy_and_resets_the_counters(server) -> None:
    generate(server, {"text": "warm", "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}})
    assert get_json(server.url + "/server_info")["internal_states"][0]["avg_spec_accept_length"] > 1.0
    stream = Stream(
        server.url + "/generate",
        {"text": "long", "stream": True, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}},
    )
    assert stream.next_event() is not None  # running now
    assert post_raw(server.url + "/flush_cache", b"")[0] == 400
    while stream.next_event() not in (None, "[DONE]"):
        pass
    stream.close()
    status, text = post_raw(server.url + "/flush_cache", b"")
    assert status == 200, text
    assert "avg_spec_accept_length" not in get_json(server.url + "/server_info")["internal_states"][0]  # as SGLang


def test_a_request_id_in_flight_is_refused_as_sglang_does(server) -> None:
    stream = Stream(
        server.url + "/generate",
        {
            "text": "long",
            "stream": True,
            "rid": "same",
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True},
        },
    )
    try:
        assert stream.next_event() is not None  # running now
        status, reply = post_json(server.url + "/generate", {"text": "x", "rid": "same"})
        assert status == 400 and "Duplicate request ID detected" in reply["error"]["message"]
        status, reply = post_json(server.url + "/v1/chat/completions", {**chat_body(), "rid": "same"})
        assert status == 400 and "Duplicate request ID detected" in reply["error"]["message"]
    finally:
        stream.close()
    status, reply = post_json(server.url + "/generate", {"text": ["a", "b"], "rid": ["x", "x"]})
    assert status == 400 and "Duplicate request ID detected: rid 'x'" in reply["error"]["message"]


# ---------------------------------------------------------------------- OpenAI chat


def chat_body(**extra) -> dict:
    return {
        "model": "embedded:mini",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
        "max_tokens": 40,
        "temperature": 0,
        **extra,
    }


def test_chat_completion(server) -> None:
    status, reply = post_json(
        server.url + "/v1/chat/completions", chat_body(seed=3, return_spec_tokens_details=True, return_meta_info=True)
    )
    assert status == 200, reply
    choice = reply["choices"][0]
    assert reply["object"] == "chat.completion" and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length") and isinstance(choice["message"]["content"], str)
    assert reply["usage"]["completion_tokens"] == choice["meta_info"]["completion_tokens"]
    details = reply["sglext"]["spec_tokens_details"]
    assert SPEC_KEYS <= details.keys() and details["spec_verify_ct"] >= 1
    status, plain = post_json(server.url + "/v1/chat/completions", chat_body())
    assert "sglext" not in plain and "meta_info" not in plain["choices"][0]


def test_chat_stream_deltas_add_up_to_the_full_answer(server) -> None:
    _, full = post_json(server.url + "/v1/chat/completions", chat_body())
    events = post_sse(
        server.url + "/v1/chat/completions",
        chat_body(stream=True, return_spec_tokens_details=True, stream_options={"include_usage": True}),
    )
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == full["choices"][0]["message"]["content"]
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    extras = [c for c in chunks if not c["choices"]]
    assert SPEC_KEYS <= extras[0]["sglext"]["spec_tokens_details"].keys()
    assert extras[1]["usage"]["completion_tokens"] == full["usage"]["completion_tokens"]


def test_chat_bad_input_gets_400(server) -> None:
    for body in (
        {"messages": []},
        {"messages": [{"role": "robot", "content": "x"}]},
        {**chat_body(), "max_tokens": -2},
        {**chat_body(), "logprobs": True},
        {**chat_body(), "foo": 1},
    ):
        status, reply = post_json(server.url + "/v1/chat/completions", body)
        assert status == 400 and reply["error"]["message"], body
    _, reply = post_json(server.url + "/v1/chat/completions", {**chat_body(), "max_tokens": -2})
    assert reply["error"]["message"].startswith("max_tokens=-2")  # the request's key, not sampling_params'
    _, reply = post_json(server.url + "/v1/chat/completions", {**chat_body(), "seed": "x"})
    assert reply["error"]["message"].startswith("seed=")


def test_a_long_prompt_is_read_off_the_event_loop_and_measured_as_any(server) -> None:
    """Past OFF_LOOP_CHARS the text is tokenized in a thread: the same refusal, and the same ids, as on the loop."""
    status, reply = post_json(
        server.url + "/generate", {"text": "a" * 70_000, "sampling_params": {"max_new_tokens": 1}}
    )
    assert status == 400 and "prompt (70000 tokens) + max_new_tokens (1) exceeds" in reply["error"]["message"]
    short = post_json(server.url + "/generate", {"text": "a" * 1000, "sampling_params": {"max_new_tokens": 1}})[1]
    long = post_json(server.url + "/generate", {"text": "a" * 66_000, "sampling_params": {"max_new_tokens": 1}})
    assert short["meta_info"]["prompt_tokens"] == 1000 and long[0] == 400  # 66,000 + 1 > 65,536


def test_chat_without_max_tokens_needs_room_for_one_token_only(server) -> None:
    prompt = {"role": "user", "content": "0" * 65_450}
    status, reply = post_json(server.url + "/v1/chat/completions", {"messages": [prompt], "max_tokens": 200})
    assert status == 400  # the limit asked for does not fit
    status, reply = post_json(server.url + "/v1/chat/completions", {"messages": [prompt], "ignore_eos": True})
    assert status == 200 and reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"] == 65_536, reply


def test_chat_takes_max_tokens_when_max_completion_tokens_is_null(server) -> None:
    """As SGLang (max_completion_tokens or max_tokens): an explicit null is not a limit of the context's length."""
    body = {**chat_body(), "max_tokens": 3, "max_completion_tokens": None, "ignore_eos": True}
    status, reply = post_json(server.url + "/v1/chat/completions", body)
    assert status == 200 and reply["usage"]["completion_tokens"] == 3, reply


# ---------------------------------------------------------------------- OpenAI completions


def completion_body(**extra) -> dict:
    return {"model": "embedded:mini", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, **extra}


def test_completion(server) -> None:
    status, reply = post_json(server.url + "/v1/completions", completion_body(return_spec_tokens_details=True))
    assert status == 200, reply
    choice = reply["choices"][0]
    assert reply["object"] == "text_completion" and reply["id"].startswith("cmpl-")
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    assert reply["usage"]["prompt_tokens"] == len(TOK.encode("Once upon a time"))
    assert 0 < reply["usage"]["completion_tokens"] <= 40
    assert len(TOK.encode(choice["text"])) >= 1
    details = reply["sglext"]["spec_tokens_details"]
    assert SPEC_KEYS <= details.keys() and details["spec_verify_ct"] >= 1
    assert details["spec_accept_length"] == pytest.approx(
        reply["usage"]["completion_tokens"] / details["spec_verify_ct"]
    )
    _, plain = post_json(server.url + "/v1/completions", completion_body())
    assert "sglext" not in plain and plain["choices"][0]["text"] == choice["text"]  # greedy


def test_completion_default_max_tokens_and_token_id_prompts(server) -> None:
    _, reply = post_json(server.url + "/v1/completions", {"prompt": [5, 6, 7], "ignore_eos": True})
    assert reply["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 16,
        "total_tokens": 19,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }  # SGLang's default of 16
    _, batch = post_json(server.url + "/v1/completions", {"prompt": ["a", "bb"], "max_tokens": 4, "ignore_eos": True})
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    assert batch["usage"]["prompt_tokens"] == 3 and batch["usage"]["completion_tokens"] == 8


def test_completion_stream_deltas_add_up_to_the_full_text(server) -> None:
    _, full = post_json(server.url + "/v1/completions", completion_body(ignore_eos=True))
    events = post_sse(
        server.url + "/v1/completions",
        completion_body(
            stream=True, ignore_eos=True, return_spec_tokens_details=True, stream_options={"include_usage": True}
        ),
    )
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == full["choices"][0]["text"]
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    extras = [c for c in chunks if not c["choices"]]
    assert SPEC_KEYS <= extras[0]["sglext"]["spec_tokens_details"].keys()
    assert extras[1]["usage"]["completion_tokens"] == 40


def test_completion_bad_input_gets_400(server) -> None:
    for body in (
        {"prompt": ""},
        {"prompt": "a", "max_tokens": 0},
        {"prompt": "a", "echo": True},
        {"prompt": [1, 99999]},
        {"prompt": "a", "foo": 1},
        {"prompt": "a", "max_tokens": 10**9},
    ):
        status, reply = post_json(server.url + "/v1/completions", body)
        assert status == 400 and reply["error"]["message"], body


# ---------------------------------------------------------------------- servers of their own


def test_plain_server_incremental_streams_and_disconnects() -> None:
    """NONE, --incremental-streaming-output, one slot: deltas add up; a dropped client frees the slot."""
    with engine_server(
        ["--model-path", "embedded:mini", "--max-running-requests", "1", "--incremental-streaming-output"]
    ) as server:
        events = post_sse(
            server.url + "/generate",
            {"input_ids": [4, 5], "stream": True, "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}},
        )
        chunks = [json.loads(e) for e in events[:-1]]
        assert len(chunks) == 20 and all(len(c["output_ids"]) == 1 for c in chunks)  # one token per step
        ids = [t for c in chunks for t in c["output_ids"]]
        assert "".join(c["text"] for c in chunks) == TOK.decode(ids)
        assert "spec_verify_ct" not in chunks[-1]["meta_info"]
        assert "avg_spec_accept_length" not in get_json(server.url + "/server_info")["internal_states"][0]
        stream = Stream(
            server.url + "/generate",
            {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 60000, "ignore_eos": True}},
        )
        assert stream.next_event() is not None
        stream.close()
        deadline = time.monotonic() + 30  # 60,000 one-token steps would take minutes
        while get_json(server.url + "/server_info")["internal_states"][0]["num_running_reqs"]:
            assert time.monotonic() < deadline, "the disconnected request still holds its slot"
            time.sleep(0.1)
        assert generate(server, {"text": "next", "sampling_params": {"max_new_tokens": 4}})["meta_info"]


def test_health_generate_is_503_while_starting(tmp_path: Path) -> None:
    # a 131,072-id vocabulary: about 3 s between the bind and ready (its tokenizer folder and output projection
    # are built), at a third of embedded:small's CPU
    server = start_engine(["--model-path", "embedded:mini", "--vocab-size", "131072"], tmp_path / "server.log")
    try:
        seen: list[int] = []
        while not seen or seen[-1] != 200:
            assert server.alive(), server.log_text()
            status = get(server.url + "/health_generate", timeout_s=5)[0]
            if status:
                seen.append(status)
            time.sleep(0.02)
        assert seen[0] == 503 and READY_LINE in server.log_text()
        wait_ready(server)
    finally:
        stop_engine(server)
    assert "Shutting down" in server.log_text()


def test_digit_vocabulary_publishes_no_tokenizer_folder(tmp_path: Path) -> None:
    with engine_server(["--model-path", "embedded:tiny"], env={"XDG_CACHE_HOME": str(tmp_path)}) as server:
        assert get_json(server.url + "/model_info")["tokenizer_path"] == "embedded:tiny"
        assert "No Hugging Face tokenizer folder: a vocabulary of 4 (< 257)" in server.log_text()
    assert not (tmp_path / "specbench").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model-path", "embedded:mini", "--no-such-flag", "1"], "unrecognized arguments: --no-such-flag"),
        (["--model-path", "gpt2"], "embedded:small"),
    ],
)
def test_bad_flags_exit_at_start_with_a_message(argv: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.engine", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr


def test_concurrent_streams_are_batched(server) -> None:
    results: list[list[str]] = []

    def one(i: int) -> None:
        results.append(
            post_sse(
                server.url + "/generate",
                {"input_ids": [i + 1], "stream": True, "sampling_params": {"max_new_tokens": 30}},
            )
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and all(r[-1] == "[DONE]" for r in results)
