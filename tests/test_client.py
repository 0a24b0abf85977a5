"""The client's pure parts: SSE framing, payloads, Poisson arrivals, records from outcomes."""

from __future__ import annotations

import asyncio
import json

from harness.client import Outcome, RequestSpec, chat_payload, generate_payload, poisson_offsets, sse_events
from harness.config import ClientConfig, SamplingConfig
from harness.records import finish_reason
from workloads.base import Item


class FakeContent:
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def iter_any(self):
        for piece in self.pieces:
            yield piece


class FakeResponse:
    def __init__(self, pieces: list[bytes]) -> None:
        self.content = FakeContent(pieces)


def collect(pieces: list[bytes]) -> list[dict]:
    async def run():
        return [e async for e in sse_events(FakeResponse(pieces))]
    return asyncio.run(run())


def test_sse_events_split_anywhere_and_larger_than_a_line_limit():
    big = {"text": "x" * 300_000, "meta_info": {"completion_tokens": 3}}
    stream = (b"data: " + json.dumps({"text": "a"}).encode() + b"\n\n" + b"data: " + json.dumps(big).encode()
              + b"\n\n" + b": a comment\n\n" + b"data: [DONE]\n\n" + b"data: {\"after\": 1}\n\n")
    pieces = [stream[i:i + 777] for i in range(0, len(stream), 777)]
    events = collect(pieces)
    assert events == [{"text": "a"}, big]  # nothing after [DONE]


ITEM = Item(item_id="7", seed_offset=7, prompt="What is 1+1?", messages=[{"role": "user", "content": "What is 1+1?"}])


def test_payloads_carry_the_seed_and_sampling():
    sampling = SamplingConfig(temperature=1.0, top_p=0.95, top_k=20, max_new_tokens=99, stop=["</s>"])
    spec = RequestSpec(ITEM, request_seed=980413, warmup=False, max_new_tokens=99)
    native = generate_payload(sampling, ClientConfig(), spec)
    assert native["text"] == ITEM.prompt and native["stream"] is True
    assert native["sampling_params"] == {"max_new_tokens": 99, "temperature": 1.0, "top_p": 0.95, "top_k": 20,
                                         "min_p": 0.0, "ignore_eos": False, "stop": ["</s>"],
                                         "sampling_seed": 980413}
    chat = chat_payload(sampling, ClientConfig(route="chat", chat_template_kwargs={"enable_thinking": True}),
                        spec, "m")
    assert chat["seed"] == 980413 and chat["max_tokens"] == 99 and chat["messages"] == ITEM.messages
    assert chat["return_spec_tokens_details"] is True and chat["chat_template_kwargs"] == {"enable_thinking": True}
    unseeded = generate_payload(sampling, ClientConfig(), RequestSpec(ITEM, None, False, 99))
    assert "sampling_seed" not in unseeded["sampling_params"]


def test_poisson_arrivals_are_seeded_with_the_right_rate():
    a, b = poisson_offsets(4000, 20.0, seed=1), poisson_offsets(4000, 20.0, seed=1)
    assert a == b and a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:], strict=False))
    assert abs(4000 / a[-1] - 20.0) < 1.5  # mean rate within ~5 standard errors
    assert poisson_offsets(10, 20.0, seed=2) != a[:10]


def test_finish_reason_mapping():
    assert finish_reason(Outcome(0.0, error="HTTP 500")) == "error"
    assert finish_reason(Outcome(0.0, meta_info={"finish_reason": {"type": "length", "length": 5}})) == "length"
    assert finish_reason(Outcome(0.0, meta_info={"finish_reason": {"type": "stop", "matched": 2}})) == "stop"
    assert finish_reason(Outcome(0.0, meta_info={"finish_reason": {"type": "abort"}})) == "abort"
    assert finish_reason(Outcome(0.0, meta_info={"finish_reason": None})) == "abort"
