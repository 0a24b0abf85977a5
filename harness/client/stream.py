"""The load generator: sends a run's requests (aiohttp), one raw record per request.

Native `/generate` (streaming or not) or the OpenAI chat route. A concurrency cap (semaphore) and,
optionally, Poisson arrivals from a seeded generator. Each request has its own timeout; an error is
recorded, never retried. Times are `time.monotonic()` as the client saw them.

The client's own cost stays out of the numbers: every network piece is timestamped before it is parsed,
bytes are parsed with orjson, and SGLang's cumulative `/generate` stream (each event repeats the whole
text and token ids so far) is read without decoding the text of every event: only the raw prefix of the
text is compared (it must extend the previous one) and only `meta_info` is parsed; the last event is
parsed in full. Streams are read to their end after `[DONE]`, so aiohttp keeps the connection for the next
request.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson

from harness.config import ClientConfig, SamplingConfig
from workloads.base import Item

SPEC_FIELDS = ("spec_verify_ct", "spec_num_correct_drafts")
DONE = b"[DONE]"
READ_BUFSIZE = 4 * 1024 * 1024  # a cumulative event of a 32k-token response is a few hundred KB
NOT_CUMULATIVE = ("the stream is not cumulative (an event's text does not extend the previous one); the server "
                  "seems to run with --incremental-streaming-output: read it with incremental=True (the runner "
                  "does when server_info.incremental_streaming_output is true)")
NOT_INCREMENTAL = ("the stream is not incremental (an event repeats earlier output_ids); the server seems to run "
                   "without --incremental-streaming-output: read it with incremental=False")


@dataclass
class RequestSpec:
    """One request of a run: the item, its seed, whether it is a warmup, its token cap."""

    item: Item
    request_seed: int | None
    warmup: bool
    max_new_tokens: int


@dataclass
class Outcome:
    """What the client saw of one request (turned into a record by the runner).

    `chunk_times`: the monotonic time at which the network piece holding each event that carried new output
    (text or tokens) was read, before parsing; `chunk_tokens`: the tokens each of those events added
    (the increase of the cumulative completion_tokens), None when the route does not report them per chunk.
    """

    t_scheduled: float
    t_sent: float | None = None
    t_first_token: float | None = None
    t_end: float | None = None
    n_chunks: int = 0
    text: str = ""
    meta_info: dict[str, Any] | None = None
    error: str | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class StreamError(Exception):
    """Something in a response that makes this one request an error (never the run)."""


def sampling_params(sampling: SamplingConfig, spec: RequestSpec) -> dict[str, Any]:
    """SGLang's `sampling_params` for one request."""
    params: dict[str, Any] = {
        "max_new_tokens": spec.max_new_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
        "top_k": sampling.top_k, "min_p": sampling.min_p, "ignore_eos": sampling.ignore_eos,
    }
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if spec.request_seed is not None:
        params["sampling_seed"] = spec.request_seed
    return params


def generate_payload(sampling: SamplingConfig, client: ClientConfig, spec: RequestSpec) -> dict[str, Any]:
    return {"text": spec.item.prompt, "sampling_params": sampling_params(sampling, spec), "stream": client.stream}


def chat_payload(sampling: SamplingConfig, client: ClientConfig, spec: RequestSpec, model: str) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model, "messages": spec.item.messages, "max_tokens": spec.max_new_tokens,
        "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
        "min_p": sampling.min_p, "ignore_eos": sampling.ignore_eos, "stream": client.stream,
        "return_spec_tokens_details": True,
    }
    if client.stream:  # continuous_usage_stats: every content chunk carries the cumulative usage (SGLang)
        payload["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if sampling.stop:
        payload["stop"] = list(sampling.stop)
    if spec.request_seed is not None:
        payload["seed"] = spec.request_seed
    if client.chat_template_kwargs:
        payload["chat_template_kwargs"] = dict(client.chat_template_kwargs)
    return payload


# ---------------------------------------------------------------------- SSE framing


class SseFramer:
    """Splits a Server-Sent Events byte stream into the `data` of its events.

    Events end at a blank line (LF, CRLF or CR line ends, split anywhere across pieces); `close()` returns
    a last event that had no blank line. Comments and other fields are skipped; several `data:` lines of
    one event are joined with LF. Events can be far larger than aiohttp's line limit.
    """

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the unfinished event's pieces
        self._cr = False  # the previous piece ended with CR (its LF may start the next piece)

    def feed(self, piece: bytes) -> list[bytes]:
        if self._cr or b"\r" in piece:
            piece = self._normalise(piece)
        parts = self._parts
        if b"\n" not in piece:  # no event can end here: keep the piece, join nothing yet
            if piece:
                parts.append(piece)
            return []
        if parts:
            parts.append(piece)
            piece = b"".join(parts)
            parts.clear()
        events, used = split_events(piece)
        if used < len(piece):
            parts.append(piece[used:])
        return events

    def close(self) -> list[bytes]:
        """The last event when the stream ended without a blank line after it."""
        rest = b"".join(self._parts).strip(b"\n")
        self._parts.clear()
        data = event_data(rest) if rest else None
        return [] if data is None else [data]

    def _normalise(self, piece: bytes) -> bytes:
        if self._cr and piece.startswith(b"\n"):
            piece = piece[1:]  # the LF of a CRLF split across pieces
        self._cr = piece.endswith(b"\r")
        return piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def split_events(data: bytes) -> tuple[list[bytes], int]:
    """The data of the complete events in `data` (LF line ends) and how many bytes they used. Only line
    ends are searched for (memchr): JSON payloads hold no raw LF, so a large event costs one scan."""
    events: list[bytes] = []
    start = at = 0
    size = len(data)
    while (i := data.find(b"\n", at)) >= 0:
        if i + 1 == size:
            break  # this LF may start a blank line that the next piece completes
        if data[i + 1] != 10:
            at = i + 1  # a line end inside the event
            continue
        if at == start and data.startswith(b"data: ", start):  # one `data: ` line: slice it out directly
            events.append(data[start + 6:i])
        elif (payload := event_data(data[start:i])) is not None:
            events.append(payload)
        start = at = i + 2
    return events, start


def event_data(event: bytes) -> bytes | None:
    """The `data` of one event (its `data:` lines joined), None when it has none (a comment)."""
    if event.startswith(b"data:") and b"\n" not in event:
        return event[6:] if event.startswith(b"data: ") else event[5:]
    lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[1:] if line.startswith(b" ") else line for line in lines)


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """The JSON objects of a Server-Sent Events stream until `data: [DONE]` (read on to the end)."""
    framer, done = SseFramer(), False
    async for piece in resp.content.iter_any():
        for data in framer.feed(piece):
            done = done or data == DONE
            if not done:
                yield parse_object(data)
    for data in framer.close():
        if not done and data != DONE:
            yield parse_object(data)


def parse_object(data: bytes) -> dict:
    """One event's JSON object; StreamError for invalid JSON, a non-object or an `{"error": ...}` event."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise StreamError(f"invalid JSON in a stream event ({e}): {data[:200]!r}") from None
    if not isinstance(obj, dict):
        raise StreamError(f"a stream event is JSON but not an object: {data[:200]!r}")
    if (err := obj.get("error")) is not None:
        raise StreamError(err if isinstance(err, str) else orjson.dumps(err).decode())
    return obj


# ---------------------------------------------------------------------- stream readers


class EventReader(Protocol):
    def feed(self, data: bytes, t: float) -> None: ...

    def finish(self, out: Outcome) -> None: ...


def completion_count(meta: Any) -> int | None:
    value = meta.get("completion_tokens") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Chunks:
    """The arrival times and token counts of the events that carried output."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.tokens_known = True
        self.completion = 0  # the cumulative completion_tokens so far

    def add(self, t: float, new_output: bool, completion: int | None) -> None:
        """One event: `new_output` when it carried text or token ids; `completion` its cumulative count."""
        added = 0
        if completion is None:
            self.tokens_known = False
        else:
            added = completion - self.completion
            if added < 0:
                raise StreamError(f"meta_info.completion_tokens went down from {self.completion} to {completion}")
            self.completion = completion
        if new_output or added > 0:
            self.times.append(t)
            self.tokens.append(added)

    def store(self, out: Outcome) -> None:
        out.chunk_times = self.times
        out.chunk_tokens = self.tokens if self.tokens_known and self.times else None
        out.t_first_token = self.times[0] if self.times else None


TEXT_OPENERS = (b'{"text":"', b'{"text": "')
META_KEY = b'"meta_info":'
IDS_KEY = b'"output_ids":'


def opener(data: bytes) -> bytes:
    return TEXT_OPENERS[0] if data.startswith(TEXT_OPENERS[0]) else TEXT_OPENERS[1]


def text_prefix(data: bytes, start: int) -> bytes | None:
    """`{"text":"<encoded text>` of an event laid out as SGLang writes it (the text first, then output_ids
    or meta_info), else None. A key such as `"meta_info":` cannot occur inside a JSON string (every quote
    there is escaped), so the first one after the text marks its end."""
    if not data.startswith(TEXT_OPENERS):
        return None
    end = data.find(IDS_KEY, start)
    meta = data.find(META_KEY, start, end if end >= 0 else len(data))
    end = meta if meta >= 0 else end
    if end < 0:
        return None
    head = data[:end].rstrip()
    if not head.endswith(b","):
        return None
    head = head[:-1].rstrip()
    if not head.endswith(b'"') or len(head) < len(opener(data)):
        return None
    return head[:-1]


def trailing_meta(data: bytes) -> dict | None:
    """The `meta_info` object when it is the event's last key, else None."""
    at = data.rfind(META_KEY)
    if at < 0:
        return None
    tail = data[at + len(META_KEY):].rstrip()
    if not tail.endswith(b"}"):
        return None
    try:
        meta = orjson.loads(tail[:-1])
    except orjson.JSONDecodeError:
        return None
    return meta if isinstance(meta, dict) else None


class CumulativeGenerate:
    """SGLang's default `/generate` stream: every event carries the whole text so far.

    Cheap path per event: the raw text prefix must extend the previous one (a memory compare) and only
    `meta_info` is parsed. Events in another layout are parsed in full. The last event is parsed at the end.
    """

    def __init__(self) -> None:
        self.chunks = Chunks()
        self.last: bytes | None = None  # the latest event
        self.prefix: bytes | None = b""  # its raw text prefix (None: unknown layout, parse in full)
        self.text: str | None = ""  # its decoded text, when known

    def feed(self, data: bytes, t: float) -> None:
        if not self._cheap(data, t):
            self._full(data, t)
        self.last = data

    def _cheap(self, data: bytes, t: float) -> bool:
        old = self.prefix
        if old is None or not data.startswith(old):
            return False
        prefix = text_prefix(data, len(old))
        meta = trailing_meta(data) if prefix is not None else None
        if prefix is None or meta is None:
            return False
        grown = len(prefix) > (len(old) if old else len(opener(data)))
        self.chunks.add(t, grown, completion_count(meta))
        self.prefix, self.text = prefix, None
        return True

    def _full(self, data: bytes, t: float) -> None:
        obj = parse_object(data)
        text = obj.get("text", "")
        if not isinstance(text, str):
            raise StreamError(f"an event's text is not a string: {str(text)[:200]!r}")
        previous = self._previous_text()
        if not text.startswith(previous.rstrip("\ufffd")):
            raise StreamError(NOT_CUMULATIVE)
        self.chunks.add(t, len(text) > len(previous), completion_count(obj.get("meta_info")))
        self.prefix, self.text = text_prefix(data, 0), text

    def _previous_text(self) -> str:
        if self.text is None:
            assert self.last is not None  # text is None only after a cheap event, which feed stored as last
            self.text = parse_object(self.last).get("text", "")
        return self.text

    def finish(self, out: Outcome) -> None:
        if self.last is None:
            return
        final = parse_object(self.last)
        out.text, out.meta_info = final.get("text", ""), final.get("meta_info")
        self.chunks.store(out)


class IncrementalGenerate:
    """`/generate` with `--incremental-streaming-output`: every event carries only the new text and ids."""

    def __init__(self) -> None:
        self.chunks = Chunks()
        self.parts: list[str] = []
        self.meta: dict | None = None

    def feed(self, data: bytes, t: float) -> None:
        obj = parse_object(data)
        piece, ids, meta = obj.get("text", ""), obj.get("output_ids"), obj.get("meta_info")
        if not isinstance(piece, str):
            raise StreamError(f"an event's text is not a string: {str(piece)[:200]!r}")
        completion = completion_count(meta)
        if isinstance(ids, list) and completion is not None and len(ids) > completion - self.chunks.completion:
            raise StreamError(NOT_INCREMENTAL)
        self.chunks.add(t, bool(piece) or bool(ids), completion)
        self.parts.append(piece)
        self.meta = meta if isinstance(meta, dict) else self.meta

    def finish(self, out: Outcome) -> None:
        out.text, out.meta_info = "".join(self.parts), self.meta
        self.chunks.store(out)


def joined_response(reasoning: str | None, content: str | None) -> str:
    """The entire response: the reasoning (when a reasoning parser split it off) then the content.
    Scoring reads the whole of it, as the seed's "boxed score over entire response" does."""
    return "\n".join(part for part in (reasoning, content) if part)


def _chat_meta(final: dict, usage: dict | None, details: dict | None) -> dict:
    """A `meta_info`-shaped dict from the chat route's pieces, plus the raw pieces under `raw`."""
    reason = final.get("finish_reason")
    meta = {"finish_reason": {"type": reason} if isinstance(reason, str) else reason}
    if usage:
        meta.update(prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"))
    if details:
        meta.update(details)
    meta["raw"] = {"usage": usage, "spec_tokens_details": details}
    return meta


class ChatStream:
    """OpenAI chat completions (SGLang): deltas, then `sglext.spec_tokens_details` and usage chunks.
    With `continuous_usage_stats` every content chunk carries the cumulative usage: per-chunk tokens."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.final: dict = {}
        self.usage: dict | None = None
        self.details: dict | None = None
        self.events: list[tuple[float, bool, int | None]] = []  # (time, carried text, cumulative tokens)

    def feed(self, data: bytes, t: float) -> None:
        chunk = parse_object(data)
        usage = chunk.get("usage")
        self.usage = usage if isinstance(usage, dict) else self.usage
        sglext = chunk.get("sglext")
        self.details = (sglext.get("spec_tokens_details") if isinstance(sglext, dict) else None) or self.details
        carried = False
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content, thought = delta.get("content") or "", delta.get("reasoning_content") or ""
            carried = carried or bool(content or thought)
            self.parts.append(content)
            self.reasoning.append(thought)
            if choice.get("finish_reason") is not None:
                self.final = choice
        self.events.append((t, carried, completion_count(usage)))

    def finish(self, out: Outcome) -> None:
        out.text = joined_response("".join(self.reasoning), "".join(self.parts))
        out.meta_info = _chat_meta(self.final, self.usage, self.details)
        chunks = Chunks()
        continuous = any(c for _, c, _ in self.events) and all(n is not None for _, c, n in self.events if c)
        for t, carried, completion in self.events:
            if continuous:
                chunks.add(t, carried, chunks.completion if completion is None else completion)
            elif carried:
                chunks.add(t, True, None)
        chunks.store(out)


class StreamParse:
    """One response's parsing state: its framer and reader, and the first error."""

    def __init__(self, reader: EventReader, out: Outcome) -> None:
        self.framer, self.reader, self.out = SseFramer(), reader, out
        self.done = False  # [DONE] was seen: the events after it are ignored
        self.error: StreamError | None = None
        self.t = time.monotonic()  # when the latest piece was read

    def piece(self, t: float, piece: bytes) -> None:
        if self.error is None and not self.done:
            self.t = t
            try:
                self.done = feed_events(self.framer.feed(piece), self.reader, self.out, t)
            except Exception as e:  # noqa: BLE001  (a bad response is this request's error, never the run's)
                self.error = as_stream_error(e)

    def end(self) -> None:
        if self.error is None:
            try:
                if not self.done:
                    feed_events(self.framer.close(), self.reader, self.out, self.t)
                self.reader.finish(self.out)
            except Exception as e:  # noqa: BLE001
                self.error = as_stream_error(e)


def as_stream_error(e: Exception) -> StreamError:
    """A response that broke the reader (an unexpected shape): the request's error, naming what broke."""
    return e if isinstance(e, StreamError) else StreamError(f"unexpected response ({type(e).__name__}: {e})")


class Parser:
    """Parses the pieces that many streams read, in slices of at most `slice_s` seconds between which the
    event loop reads (and timestamps) the pieces that came in meanwhile: a piece's time never waits behind
    the parsing of the other streams' pieces. One per event loop (`drive` runs one)."""

    def __init__(self, slice_s: float = 0.0005) -> None:
        self.slice_s = slice_s
        self.queue: deque[tuple[Callable[..., None], tuple]] = deque()
        self.wake = asyncio.Event()

    def put(self, fn: Callable[..., None], *args: Any) -> None:
        self.queue.append((fn, args))
        self.wake.set()

    async def end(self, state: StreamParse) -> None:
        """Parse the rest of `state`'s stream (after its pieces already queued) and finish it."""
        finished = asyncio.get_running_loop().create_future()

        def finish() -> None:
            state.end()
            if not finished.done():  # not when the request was cancelled (its timeout) meanwhile
                finished.set_result(None)

        self.put(finish)
        await finished

    async def run(self) -> None:
        queue = self.queue
        while True:
            await self.wake.wait()
            self.wake.clear()
            until = time.monotonic() + self.slice_s
            while queue:
                fn, args = queue.popleft()
                fn(*args)
                if time.monotonic() > until:
                    await asyncio.sleep(0)
                    until = time.monotonic() + self.slice_s


async def read_stream(resp: aiohttp.ClientResponse, reader: EventReader, out: Outcome,
                      parser: Parser | None = None) -> None:
    """Feed every event to `reader` with the time its piece was read (taken before parsing), until
    `[DONE]`; read on to the end of the body so the connection goes back to the pool. With a `parser`,
    the pieces are parsed there (in slices) instead of here."""
    state = StreamParse(reader, out)
    if parser is None:
        async for piece in resp.content.iter_any():
            state.piece(time.monotonic(), piece)
        out.t_end = time.monotonic()
        state.end()
    else:
        async for piece in resp.content.iter_any():
            parser.put(state.piece, time.monotonic(), piece)
        out.t_end = time.monotonic()  # the whole body is in; parsing its last pieces is not part of it
        await parser.end(state)
    if state.error is not None:
        raise state.error


def feed_events(events: list[bytes], reader: EventReader, out: Outcome, t: float) -> bool:
    """True once `[DONE]` was seen (the events after it are ignored)."""
    for data in events:
        if data == DONE:
            return True
        out.n_chunks += 1
        reader.feed(data, t)
    return False


async def read_body(resp: aiohttp.ClientResponse) -> dict:
    return parse_object(await resp.read())


async def _read_generate(resp: aiohttp.ClientResponse, stream: bool, incremental: bool, out: Outcome,
                         parser: Parser | None) -> None:
    """Native /generate: the body, or the SSE events (cumulative text in SGLang's default)."""
    if stream:
        await read_stream(resp, IncrementalGenerate() if incremental else CumulativeGenerate(), out, parser)
        return
    body = await read_body(resp)
    out.text, out.meta_info = body.get("text", ""), body.get("meta_info")
    single_chunk(out, completion_count(out.meta_info))


async def _read_chat(resp: aiohttp.ClientResponse, stream: bool, incremental: bool, out: Outcome,
                     parser: Parser | None) -> None:
    """OpenAI chat completions: the body, or the SSE deltas (always incremental on this route)."""
    if stream:
        await read_stream(resp, ChatStream(), out, parser)
        return
    body = await read_body(resp)
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as e:
        raise StreamError(f"the chat response has no choices[0].message ({e!r}): {str(body)[:200]}") from None
    out.text = joined_response(message.get("reasoning_content"), message.get("content"))
    details = (body.get("sglext") or {}).get("spec_tokens_details")
    out.meta_info = _chat_meta(choice, body.get("usage"), details)
    single_chunk(out, completion_count(body.get("usage")))


def single_chunk(out: Outcome, completion: int | None) -> None:
    """A response without streaming: one chunk, its arrival."""
    t = time.monotonic()
    out.t_first_token, out.n_chunks, out.chunk_times = t, 1, [t]
    out.chunk_tokens = None if completion is None else [completion]


ROUTES = {"generate": ("/generate", _read_generate), "chat": ("/v1/chat/completions", _read_chat)}


async def send_one(session: aiohttp.ClientSession, base_url: str, route: str, payload: dict,
                   timeout_s: float, out: Outcome, incremental: bool = False,
                   parser: Parser | None = None) -> Outcome:
    """Send one request; any failure becomes `out.error` (no retry). `incremental`: the server streams
    /generate with --incremental-streaming-output. `parser`: parse the stream there (see Parser)."""
    path, read = ROUTES[route]
    body = orjson.dumps(payload)
    out.t_sent = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(base_url + path, data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    out.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                else:
                    await read(resp, payload["stream"], incremental, out, parser)
    except TimeoutError:
        out.error = f"timeout after {timeout_s:.0f}s (client.timeout_s)"
    except aiohttp.ClientError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    except StreamError as exc:
        out.error = str(exc)
    out.t_end = out.t_end or time.monotonic()  # streaming: when the body ended (read_stream)
    if out.error is None and out.meta_info is None:
        out.error = "the response ended without a final meta_info"
    return out


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of n requests at `rate` per second, seeded."""
    rng = random.Random(seed)
    t, offsets = 0.0, []
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def new_session(limit: int = 0) -> aiohttp.ClientSession:
    """A session whose connections are kept and reused (`limit` 0: as many as requests in flight)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=None), read_bufsize=READ_BUFSIZE)


async def drive(base_url: str, specs: list[RequestSpec], *, sampling: SamplingConfig, client: ClientConfig,
                model: str, concurrency: int, arrival_seed: int,
                on_done: Callable[[RequestSpec, Outcome], None], incremental: bool = False) -> None:
    """Send every spec (at most `concurrency` in flight; Poisson arrivals when client.request_rate is set),
    calling `on_done` as each finishes (the runner appends its record there).

    `t_scheduled`: open loop, exactly the scheduled arrival (start + offset); closed loop, the start of the
    drive (when the request was queued). `incremental`: the server's /generate stream is incremental."""
    semaphore = asyncio.Semaphore(concurrency)
    rate = client.request_rate
    open_loop = bool(rate)
    offsets = poisson_offsets(len(specs), rate, arrival_seed) if rate else [0.0] * len(specs)
    parser = Parser()
    parsing = asyncio.get_running_loop().create_task(parser.run())
    async with new_session() as session:
        start = time.monotonic()

        async def one(spec: RequestSpec, offset: float) -> None:
            scheduled = start + offset
            await asyncio.sleep(max(0.0, scheduled - time.monotonic()))
            out = Outcome(t_scheduled=scheduled if open_loop else start)
            if client.route == "generate":
                payload = generate_payload(sampling, client, spec)
            else:
                payload = chat_payload(sampling, client, spec, model)
            async with semaphore:
                await send_one(session, base_url, client.route, payload, client.timeout_s, out, incremental, parser)
            on_done(spec, out)

        try:
            await asyncio.gather(*(one(s, o) for s, o in zip(specs, offsets, strict=True)))
        finally:
            parsing.cancel()
