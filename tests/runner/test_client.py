"""The client's pure parts: SSE framing, stream readers, payloads, Poisson arrivals, records from outcomes."""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest

from harness.client.config import ClientConfig, SamplingConfig
from harness.client.drive import poisson_offsets
from harness.client.requests import Outcome, RequestPlan, StreamError, chat_payload, generate_payload
from harness.client.sse import SseFramer, sse_events
from harness.client.streams import (
    NOT_CUMULATIVE,
    NOT_INCREMENTAL,
    ChatStream,
    CumulativeGenerate,
    IncrementalGenerate,
    Parser,
    read_stream,
)
from harness.runner.records import finish_reason
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
    stream = (
        b"data: "
        + json.dumps({"text": "a"}).encode()
        + b"\n\n"
        + b"data: "
        + json.dumps(big).encode()
        + b"\n\n"
        + b": a comment\n\n"
        + b"data: [DONE]\n\n"
        + b'data: {"after": 1}\n\n'
    )
    pieces = [stream[i : i + 777] for i in range(0, len(stream), 777)]
    events = collect(pieces)
    assert events == [{"text": "a"}, big]  # nothing after [DONE]


ITEM = Item(item_id="7", seed_offset=7, prompt="What is 1+1?", messages=[{"role": "user", "content": "What is 1+1?"}])


def test_payloads_carry_the_seed_and_sampling():
    sampling = SamplingConfig(temperature=1.0, top_p=0.95, top_k=20, max_new_tokens=99, stop=["</s>"])
    spec = RequestPlan(ITEM, request_seed=980413, warmup=False, max_new_tokens=99)
    native = generate_payload(sampling, ClientConfig(), spec)
    assert native["text"] == ITEM.prompt and native["stream"] is True
    assert native["sampling_params"] == {
        "max_new_tokens": 99,
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.0,
        "ignore_eos": False,
        "stop": ["</s>"],
        "sampling_seed": 980413,
    }
    chat = chat_payload(sampling, ClientConfig(route="chat", chat_template_kwargs={"enable_thinking": True}), spec, "m")
    assert chat["seed"] == 980413 and chat["max_tokens"] == 99 and chat["messages"] == ITEM.messages
    assert chat["return_spec_tokens_details"] is True and chat["chat_template_kwargs"] == {"enable_thinking": True}
    unseeded = generate_payload(sampling, ClientConfig(), RequestPlan(ITEM, None, False, 99))
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


# ---------------------------------------------------------------------- SSE framing


def frame(stream: bytes, cuts: list[int]) -> list[bytes]:
    framer, events, at = SseFramer(), [], 0
    for cut in [*cuts, len(stream)]:
        events += framer.feed(stream[at:cut])
        at = cut
    return events + framer.close()


EVENTS = [b'{"a":1}', b'{"b":"x y"}', b"[DONE]"]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_framing_with_every_line_end_split_at_every_byte(newline: bytes):
    stream = (
        b"".join(b"data: " + e + newline + newline for e in EVENTS[:2])
        + b": comment"
        + newline * 2
        + b"event: x"
        + newline
        + b"data:"
        + EVENTS[2]
        + newline
        + newline
    )
    for cut in range(len(stream) + 1):
        assert frame(stream, [cut]) == EVENTS, (newline, cut)
    assert frame(stream, list(range(1, len(stream)))) == EVENTS  # one byte per piece


def test_last_event_without_a_blank_line_and_multiline_data():
    assert frame(b'data: {"a":1}\n\ndata: {"b":2}', []) == [b'{"a":1}', b'{"b":2}']
    assert frame(b'data: {"b":2}\r\n', [3]) == [b'{"b":2}']
    assert frame(b"data: [1,\ndata: 2]\n\n", [9]) == [b"[1,\n2]"]
    assert frame(b"\n\n: only a comment\n\n", []) == []


def test_sse_events_parse_objects_and_refuse_others():
    assert collect([b'data: {"a": 1}\n\ndata: [DONE]\n\ndata: {"after": 1}\n\n']) == [{"a": 1}]
    for bad, message in (
        (b"[1, 2]", "not an object"),
        (b'{"text": ', "invalid JSON"),
        (b'{"error": {"message": "boom"}}', "boom"),
    ):
        with pytest.raises(StreamError, match=message):
            collect([b"data: " + bad + b"\n\n"])


# ---------------------------------------------------------------------- stream readers


def cumulative_events(texts: list[str], counts: list[int], spaced: bool = False) -> list[bytes]:
    """SGLang's layout (orjson: text, output_ids, meta_info), or json.dumps-style with spaces."""
    events = []
    for text, n in zip(texts, counts, strict=True):
        obj = {"text": text, "output_ids": list(range(n)), "meta_info": {"completion_tokens": n, "id": "r"}}
        events.append(json.dumps(obj).encode() if spaced else orjson.dumps(obj))
    return events


def read_all(reader, events: list[bytes]) -> Outcome:
    out = Outcome(0.0)
    for i, e in enumerate(events):
        reader.feed(e, float(i))
    reader.finish(out)
    return out


TEXTS = ["", "Hé", 'Hé "q"', 'Hé "q"', 'Hé "q" \\ λ\n', 'Hé "q" \\ λ\nend']
COUNTS = [0, 2, 3, 4, 6, 9]


@pytest.mark.parametrize("spaced", [False, True], ids=["orjson", "json.dumps"])
def test_cumulative_chunks_times_and_tokens(spaced: bool):
    out = read_all(CumulativeGenerate(), cumulative_events(TEXTS, COUNTS, spaced))
    assert out.text == TEXTS[-1] and out.meta_info == {"completion_tokens": 9, "id": "r"}
    assert out.chunk_times == [1.0, 2.0, 3.0, 4.0, 5.0]  # the first event carried nothing
    assert out.chunk_tokens == [2, 1, 1, 2, 3] and sum(out.chunk_tokens) == 9 and out.t_first_token == 1.0


def test_cumulative_other_layouts_and_a_trailing_replacement_char():
    reordered = [
        orjson.dumps({"meta_info": {"completion_tokens": n}, "text": t})
        for t, n in zip(["a", "a\ufffd", "aé", "aé!"], [1, 2, 2, 3], strict=True)
    ]
    out = read_all(CumulativeGenerate(), reordered)
    assert out.text == "aé!" and out.chunk_tokens == [1, 1, 1] and out.chunk_times == [0.0, 1.0, 3.0]
    mixed = cumulative_events(["ab", "ab\ufffd"], [1, 2]) + cumulative_events(["abé"], [3], spaced=True)
    assert read_all(CumulativeGenerate(), mixed).chunk_tokens == [1, 1, 1]


def test_a_stream_of_the_other_mode_is_an_error():
    incremental = cumulative_events(["He", "llo", " wo"], [1, 2, 3])  # text pieces, cumulative counts
    with pytest.raises(StreamError, match="not cumulative.*--incremental-streaming-output"):
        read_all(CumulativeGenerate(), incremental)
    assert NOT_CUMULATIVE.startswith("the stream is not cumulative")
    cumulative = cumulative_events(["He", "Hello", "Hello wo"], [1, 2, 3])
    with pytest.raises(StreamError, match="not incremental"):
        read_all(IncrementalGenerate(), cumulative)
    assert "without --incremental-streaming-output" in NOT_INCREMENTAL
    pieces = [
        orjson.dumps({"text": t, "output_ids": ids, "meta_info": {"completion_tokens": n}})
        for t, ids, n in (("He", [1], 1), ("", [2], 2), ("llo", [3, 4], 4))
    ]
    out = read_all(IncrementalGenerate(), pieces)
    assert out.text == "Hello" and out.chunk_tokens == [1, 1, 2] and out.chunk_times == [0.0, 1.0, 2.0]


def test_a_count_that_goes_down_is_an_error():
    with pytest.raises(StreamError, match="went down from 3 to 2"):
        read_all(CumulativeGenerate(), cumulative_events(["a", "ab"], [3, 2]))


def chat_chunk(
    content: str | None = None, usage: int | None = None, finish: str | None = None, choices: bool = True
) -> bytes:
    obj: dict = {"id": "c", "choices": []}
    if choices:
        delta = {} if content is None else {"content": content}
        obj["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = {"prompt_tokens": 5, "completion_tokens": usage, "total_tokens": 5 + usage}
    return orjson.dumps(obj)


def test_chat_per_chunk_tokens_with_continuous_usage_and_without():
    continuous = [
        chat_chunk(""),
        chat_chunk("Hi", 2),
        chat_chunk(" there", 5),
        chat_chunk(None, None, "stop"),
        chat_chunk(usage=6, choices=False),
    ]
    out = read_all(ChatStream(), continuous)
    assert out.text == "Hi there" and out.meta_info["completion_tokens"] == 6
    assert out.chunk_times == [1.0, 2.0, 4.0] and out.chunk_tokens == [2, 3, 1]  # the usage chunk adds the EOS
    plain = [chat_chunk(""), chat_chunk("Hi"), chat_chunk(" there", finish="stop"), chat_chunk(usage=5, choices=False)]
    out = read_all(ChatStream(), plain)
    assert out.chunk_times == [1.0, 2.0] and out.chunk_tokens is None and out.t_first_token == 1.0


@pytest.mark.parametrize("with_parser", [False, True], ids=["inline", "parser"])
def test_an_unexpected_shape_is_the_requests_error_and_parsing_goes_on(with_parser: bool):
    async def run() -> list[Outcome | str]:
        parser = Parser() if with_parser else None
        task = asyncio.get_running_loop().create_task(parser.run()) if parser else None
        results: list[Outcome | str] = []
        for body in (b'data: {"choices": [1]}\n\n', b'data: {"choices": [{"delta": {"content": "ok"}}]}\n\n'):
            out = Outcome(0.0)
            try:
                await read_stream(FakeResponse([body[:9], body[9:]]), ChatStream(), out, parser)
                results.append(out)
            except StreamError as e:
                results.append(str(e))
        if task:
            task.cancel()
        return results

    broken, fine = asyncio.run(run())
    assert broken.startswith("unexpected response (AttributeError")
    assert fine.text == "ok" and len(fine.chunk_times) == 1 and fine.n_chunks == 1
