"""Server-Sent Events framing: a byte stream split into the `data` of its events, and an event's JSON object.
Events can be far larger than aiohttp's line limit (a cumulative event of a 32k-token response)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import orjson

from harness.client.requests import StreamError
from harness.server.redact import clip

DONE = b"[DONE]"


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
            events.append(data[start + 6 : i])
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
        raise StreamError(f"invalid JSON in a stream event ({e}): {clip(data, 200)!r}") from None
    if not isinstance(obj, dict):
        raise StreamError(f"a stream event is JSON but not an object: {clip(data, 200)!r}")
    if (err := obj.get("error")) is not None:
        raise StreamError(err if isinstance(err, str) else orjson.dumps(err).decode())
    return obj
