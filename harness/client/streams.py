"""Stream readers: the events of one response turned into its text, final meta_info and per-chunk arrival
times and tokens (SGLang's cumulative and incremental `/generate` streams, the OpenAI chat stream), and the
Parser that parses many streams' pieces in short slices so that no piece's timestamp waits behind parsing.

Every piece is timestamped when it is read, before it is parsed. SGLang's cumulative `/generate` stream
(each event repeats the whole text and token ids so far) is read without decoding the text of every event:
only the raw prefix of the text is compared (it must extend the previous one) and only `meta_info` is
parsed; the last event is parsed in full.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
import orjson

from harness.client.requests import Outcome, StreamError, token_ids
from harness.client.sse import DONE, SseFramer, parse_object
from harness.server.redact import clip

NOT_CUMULATIVE = (
    "the stream is not cumulative (an event's text does not extend the previous one); the server "
    "seems to run with --incremental-streaming-output: read it with incremental=True (the runner "
    "does when server_info.incremental_streaming_output is true)"
)
NOT_INCREMENTAL = (
    "the stream is not incremental (an event repeats earlier output_ids); the server seems to run "
    "without --incremental-streaming-output: read it with incremental=False"
)


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
    tail = data[at + len(META_KEY) :].rstrip()
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
        out.output_ids = token_ids(final.get("output_ids"))
        self.chunks.store(out)


class IncrementalGenerate:
    """`/generate` with `--incremental-streaming-output`: every event carries only the new text and ids."""

    def __init__(self) -> None:
        self.chunks = Chunks()
        self.parts: list[str] = []
        self.ids: list[int] | None = []  # None once an event carried something else than a list of ids
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
        piece_ids = token_ids(ids)
        if ids is not None and piece_ids is None:  # ids that are not a list of ids: none recorded
            self.ids = None
        elif self.ids is not None and piece_ids:
            self.ids.extend(piece_ids)
        self.meta = meta if isinstance(meta, dict) else self.meta

    def finish(self, out: Outcome) -> None:
        out.text, out.meta_info, out.output_ids = "".join(self.parts), self.meta, self.ids
        self.chunks.store(out)


def first_choice(body: Any) -> dict:
    """`choices[0]` of an OpenAI-shaped response body; StreamError quoting the body (masked, then cut) without it."""
    try:
        return body["choices"][0]
    except (KeyError, IndexError, TypeError) as e:
        raise StreamError(f"the response has no choices[0] ({e!r}): {clip(str(body), 200)}") from None


def choice_text(choice: dict) -> tuple[str, str]:
    """(content, reasoning) of an OpenAI-shaped choice: a chat delta or message, or a completion's text."""
    for key in ("delta", "message"):
        part = choice.get(key)
        if isinstance(part, dict):
            return part.get("content") or "", part.get("reasoning_content") or ""
    text = choice.get("text")
    return (text if isinstance(text, str) else ""), ""


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


async def read_stream(
    resp: aiohttp.ClientResponse, reader: EventReader, out: Outcome, parser: Parser | None = None
) -> None:
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
