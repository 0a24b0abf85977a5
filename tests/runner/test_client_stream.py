"""The client against real sockets: a canned-response server and the benchmark's stub in this process, and the
embedded server (cumulative and --incremental-streaming-output) as a subprocess."""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from typing import ClassVar

import orjson
import pytest
from mdtable import squash
from serverutil import engine_server

from harness.client import overhead as client_bench
from harness.client.config import ClientConfig, SamplingConfig
from harness.client.drive import drive, poisson_offsets
from harness.client.requests import Outcome, RequestPlan
from workloads.base import Item

pytestmark = pytest.mark.slow  # every test here starts a server (in this process or as a subprocess)

SAMPLING = SamplingConfig(temperature=0.0, max_new_tokens=24, ignore_eos=True)


def specs(prompts: list[str], max_new_tokens: int = 24) -> list[RequestPlan]:
    return [
        RequestPlan(
            Item(item_id=p, seed_offset=i, prompt=p, messages=[{"role": "user", "content": p}]),
            None,
            False,
            max_new_tokens,
        )
        for i, p in enumerate(prompts)
    ]


def run_drive(
    url: str,
    prompts: list[str],
    client: ClientConfig,
    incremental: bool = False,
    sampling: SamplingConfig = SAMPLING,
    seed: int = 0,
) -> dict[str, Outcome]:
    done: dict[str, Outcome] = {}
    asyncio.run(
        drive(
            url,
            specs(prompts, sampling.max_new_tokens),
            sampling=sampling,
            client=client,
            model="embedded:mini",
            concurrency=client.concurrency,
            arrival_seed=seed,
            on_done=lambda s, o: done.__setitem__(s.item.prompt, o),
            incremental=incremental,
        )
    )
    return done


def with_server(factory: Callable[[], asyncio.Protocol], body: Callable[[str], object]) -> object:
    """Run `body(url)` (blocking, in a thread) while an asyncio server of `factory` listens."""

    async def main() -> object:
        server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server:
            return await asyncio.to_thread(body, url)

    return asyncio.run(main())


# ---------------------------------------------------------------------- canned responses


def canned_event(text: str, n: int) -> bytes:
    return (
        b"data: "
        + orjson.dumps({"text": text, "output_ids": list(range(n)), "meta_info": {"completion_tokens": n}})
        + b"\n\n"
    )


CANNED = {  # prompt -> the body after the headers (the connection closes after it)
    "good": canned_event("a", 1) + canned_event("ab", 2) + b"data: [DONE]\n\n",
    "crlf-no-blank-line-at-eof": (canned_event("a", 1) + canned_event("abc", 3)).replace(b"\n", b"\r\n")[:-4],
    "list": canned_event("a", 1) + b"data: [1, 2]\n\n",
    "invalid": canned_event("a", 1) + b'data: {"text": "ab\n\n',
    "error": b'data: {"error": {"message": "out of memory"}}\n\n',
}


class Canned(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head, sep, body = self.buf.partition(b"\r\n\r\n")
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        if sep and len(body) >= length:
            prompt = orjson.loads(body[:length])["text"]
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + CANNED[prompt]
            )
            self.transport.close()


def test_bad_events_are_that_requests_error_and_the_run_goes_on():
    outs = with_server(Canned, lambda url: run_drive(url, list(CANNED), ClientConfig(concurrency=2)))
    assert outs["good"].error is None and outs["good"].text == "ab" and outs["good"].chunk_tokens == [1, 1]
    tail = outs["crlf-no-blank-line-at-eof"]
    assert tail.error is None and tail.text == "abc" and tail.chunk_tokens == [1, 2] and tail.n_chunks == 2
    assert "not an object" in outs["list"].error and "invalid JSON" in outs["invalid"].error
    assert outs["error"].error == '{"message":"out of memory"}'


# ---------------------------------------------------------------------- the benchmark's stub


class StubOnly:
    """The benchmark's stub (counts connections) in this process."""

    def __init__(self, step_ms: float = 0.5) -> None:
        self.stub = client_bench.Stub(step_s=step_ms / 1000)

    def __call__(self) -> asyncio.Protocol:
        return client_bench.StubProtocol(self.stub)


def test_connections_are_reused_and_chunk_tokens_add_up(monkeypatch):
    """The stub sends [DONE] and the end of the body one step after the last event: a client that stops
    reading at [DONE] loses its connection (one per request)."""
    real_payload = client_bench.payload
    monkeypatch.setattr(
        "harness.client.drive.generate_payload",
        lambda sampling, client, spec: {
            **real_payload(client_bench.Case("c", 4, 40, 12, 1, 0.5), spec.item.prompt),
            "stub_done_apart": True,
        },
    )
    stub = StubOnly()
    prompts = [f"p{i}" for i in range(40)]
    outs = with_server(
        stub,
        lambda url: run_drive(url, prompts, ClientConfig(concurrency=4), sampling=SamplingConfig(max_new_tokens=12)),
    )
    assert stub.stub.connections <= 4, f"{stub.stub.connections} connections for 40 requests at concurrency 4"
    expected = client_bench.Response.build(12).text
    for out in outs.values():
        assert out.error is None and out.text == expected and out.meta_info["completion_tokens"] == 12
        assert out.chunk_tokens == [1] * 12 and len(out.chunk_times) == 12 == out.n_chunks
        assert out.t_first_token == out.chunk_times[0] and out.chunk_times == sorted(out.chunk_times)
        assert out.t_sent <= out.chunk_times[0] and out.chunk_times[-1] <= out.t_end


def test_open_loop_schedules_from_the_arrival_times_and_closed_loop_from_the_start():
    prompts = [f"o{i}" for i in range(12)]
    rate, seed = 40.0, 5
    client = ClientConfig(concurrency=1, request_rate=rate)
    outs = with_server(
        StubOnly(step_ms=5),
        lambda url: run_drive(url, prompts, client, sampling=SamplingConfig(max_new_tokens=8), seed=seed),
    )
    offsets = poisson_offsets(len(prompts), rate, seed)
    start = outs["o0"].t_scheduled  # the first offset is 0
    for prompt, offset in zip(prompts, offsets, strict=True):
        out = outs[prompt]
        assert out.t_scheduled == start + offset  # exactly the scheduled arrival, not the wake-up
        assert out.t_sent >= out.t_scheduled
    assert any(outs[p].t_sent - outs[p].t_scheduled > 0.005 for p in prompts)  # one slot: some waited
    closed = with_server(
        StubOnly(),
        lambda url: run_drive(url, prompts, ClientConfig(concurrency=2), sampling=SamplingConfig(max_new_tokens=8)),
    )
    assert len({o.t_scheduled for o in closed.values()}) == 1
    assert all(o.t_scheduled <= o.t_sent for o in closed.values())


def test_the_client_bench_runs_at_a_tiny_size(tmp_path):
    affinity = os.sched_getaffinity(0)
    code = client_bench.main(
        [
            "--streams",
            "3",
            "--waves",
            "2",
            "--short-tokens",
            "10",
            "--step-ms",
            "1",
            "--long-tokens",
            "40",
            "--long-streams",
            "2",
            "--long-requests",
            "2",
            "--long-chunk-tokens",
            "8",
            "--long-step-ms",
            "1",
            "--clients",
            "ours",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert os.sched_getaffinity(0) == affinity  # pinned for the drive only: the caller gets its CPUs back
    (run,) = tmp_path.iterdir()
    report = orjson.loads((run / "client_bench.json").read_bytes())
    rows = report["results"]
    assert [(r["client"], r["streams"], r["tokens"]) for r in rows] == [("ours", 3, 10), ("ours", 2, 40)]
    assert rows[0]["chunks"] == 6 * 10 and rows[1]["chunks"] == 2 * 5 and rows[0]["connections"] == 3
    assert all(r["chunks_per_cpu_s"] > 0 and math.isfinite(r["err_p99_ms"]) for r in rows)
    assert "| ours | 3 | 10 (1) | 1 | 6 | 60 |" in squash((run / "client_bench.md").read_text())


# ---------------------------------------------------------------------- the embedded server


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_streamed_text_equals_the_plain_text_in_both_modes(incremental: bool):
    args = ["--model-path", "embedded:mini", "--max-running-requests", "4"]
    prompts = [f"question {i}" for i in range(4)]
    with engine_server(args + (["--incremental-streaming-output"] if incremental else [])) as server:
        streamed = run_drive(server.url, prompts, ClientConfig(concurrency=4), incremental=incremental)
        plain = run_drive(server.url, prompts, ClientConfig(concurrency=4, stream=False))
        wrong = run_drive(server.url, prompts[:1], ClientConfig(concurrency=1), incremental=not incremental)
        chat = run_drive(server.url, prompts[:2], ClientConfig(route="chat", concurrency=2))
    for p in prompts:
        s, n = streamed[p], plain[p]
        assert s.error is None and n.error is None and s.text == n.text and len(s.text) > 20
        assert sum(s.chunk_tokens) == s.meta_info["completion_tokens"] == 24 == n.chunk_tokens[0]
        assert len(s.chunk_times) == len(s.chunk_tokens) == s.n_chunks and n.chunk_times == [n.t_first_token]
    assert (
        "not incremental" in wrong[prompts[0]].error if not incremental else "not cumulative" in wrong[prompts[0]].error
    )
    for out in chat.values():  # continuous_usage_stats: per-chunk counts on the chat route too
        assert out.error is None and sum(out.chunk_tokens) == out.meta_info["completion_tokens"] == 24


class Recording(Canned):
    """Canned, keeping each request's body."""

    bodies: ClassVar[list[dict]] = []

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():  # the whole request was read, and answered
            Recording.bodies.append(orjson.loads(self.buf.partition(b"\r\n\r\n")[2]))


def test_extra_body_fields_go_into_every_request_beside_the_harness_own():
    Recording.bodies = []
    client = ClientConfig(concurrency=2, extra_body={"cache_prompt": False, "priority": 3})
    outs = with_server(Recording, lambda url: run_drive(url, ["good", "good"], client))
    assert all(out.error is None for out in outs.values()) and len(Recording.bodies) == 2
    for body in Recording.bodies:
        assert body["cache_prompt"] is False and body["priority"] == 3 and body["text"] == "good"
        assert body["sampling_params"]["max_new_tokens"] == SAMPLING.max_new_tokens
