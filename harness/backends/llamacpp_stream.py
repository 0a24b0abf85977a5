"""llama-server's OpenAI-compatible routes (`/v1/chat/completions`, `/v1/completions`): the request body, the
stream reader and the record's counts, mapped from the response's own `timings`.

Every request is sent with `cache_prompt: false` (llama.cpp's prompt cache can change sampled output, and an A/B
run must not depend on what an earlier request left in a slot), a 32-bit `seed` (checked before launch,
harness.runner.plan.check_request_seeds), and `timings_per_token: true`: then every streamed chunk carries the
cumulative `predicted_n`, which gives each chunk's tokens. llama-server closes the connection after each
response, so the client opens one connection per request (harness.client.drive).

The record's counts (docs/backends.md):
- completion_tokens = `usage.completion_tokens` (which must equal `timings.predicted_n`),
- spec_verify_ct = `predicted_n - 1 - draft_n_accepted`: the target's decode steps (the first token comes from
  the prompt's forward; each decode step emits its accepted drafts and one token of its own),
- spec_num_correct_drafts = `draft_n_accepted`, spec_num_proposed_drafts = `draft_n` (both absent from `timings`
  when nothing was drafted: 0).
The timings and usage are kept verbatim under meta_info `raw`.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from harness.client.config import ClientConfig, SamplingConfig
from harness.client.dialect import Dialect, Route
from harness.client.drive import read_body, single_chunk
from harness.client.requests import Outcome, RequestPlan, StreamError
from harness.client.sse import parse_object
from harness.client.streams import (
    Chunks,
    Parser,
    choice_text,
    completion_count,
    first_choice,
    joined_response,
    read_stream,
)
from harness.server.redact import clip

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def payload(
    route: str, sampling: SamplingConfig, client: ClientConfig, request: RequestPlan, model: str
) -> dict[str, Any]:
    """The body of one request on `route` (chat: the item's messages through the model's chat template;
    completions: its raw prompt)."""
    body: dict[str, Any] = {
        "max_tokens": request.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_p": sampling.min_p,
        "ignore_eos": sampling.ignore_eos,
        "stream": client.stream,
        "cache_prompt": False,
        "timings_per_token": True,
    }
    if route == "chat":
        body["messages"] = request.item.messages
        if client.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(client.chat_template_kwargs)
    else:
        body["prompt"] = request.item.prompt
    if client.stream:
        body["stream_options"] = {"include_usage": True}
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if request.request_seed is not None:
        body["seed"] = request.request_seed
    return body


def _count(source: dict | None, key: str) -> int | None:
    value = (source or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def meta_info(reason: Any, usage: dict | None, timings: dict | None) -> dict[str, Any]:
    """A `meta_info`-shaped dict of one response (the counts the record reads), the fields it came from kept under `raw`.
    StreamError when the response's own counts disagree or are missing."""
    if not isinstance(timings, dict):
        raise StreamError("the response carries no `timings` object (llama-server sends one with its last chunk)")
    predicted = _count(timings, "predicted_n")
    completion = _count(usage, "completion_tokens")
    if predicted is None:
        raise StreamError(f"timings.predicted_n is missing or not an integer: {clip(str(timings), 200)}")
    if completion is not None and completion != predicted:
        raise StreamError(f"usage.completion_tokens {completion} != timings.predicted_n {predicted}")
    accepted = _count(timings, "draft_n_accepted") or 0
    drafted = _count(timings, "draft_n") or 0
    return {
        "finish_reason": {"type": reason} if isinstance(reason, str) else reason,
        "prompt_tokens": _count(usage, "prompt_tokens"),
        "completion_tokens": predicted,
        "spec_verify_ct": predicted - 1 - accepted if predicted >= 1 else None,
        "spec_num_correct_drafts": accepted,
        "spec_num_proposed_drafts": drafted,
        "raw": {"usage": usage, "timings": timings},
    }


class LlamaStream:
    """One streamed response of either route: the text, the finish reason, the last usage and timings, and each
    chunk's cumulative predicted_n (timings_per_token)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.reason: Any = None
        self.usage: dict | None = None
        self.timings: dict | None = None
        self.events: list[tuple[float, bool, int | None]] = []  # (time, carried text, cumulative predicted_n)

    def feed(self, data: bytes, t: float) -> None:
        chunk = parse_object(data)
        if isinstance(chunk.get("error"), dict | str):
            raise StreamError(f"llama-server sent an error in the stream: {clip(str(chunk['error']), 300)}")
        usage, timings = chunk.get("usage"), chunk.get("timings")
        self.usage = usage if isinstance(usage, dict) else self.usage
        self.timings = timings if isinstance(timings, dict) else self.timings
        carried = False
        for choice in chunk.get("choices") or []:
            content, thought = choice_text(choice)
            carried = carried or bool(content or thought)
            self.parts.append(content)
            self.reasoning.append(thought)
            if choice.get("finish_reason") is not None:
                self.reason = choice["finish_reason"]
        self.events.append((t, carried, _count(timings if isinstance(timings, dict) else None, "predicted_n")))

    def finish(self, out: Outcome) -> None:
        out.text = joined_response("".join(self.reasoning), "".join(self.parts))
        out.meta_info = meta_info(self.reason, self.usage, self.timings)
        chunks = Chunks()
        counted = all(n is not None for _, carried, n in self.events if carried)
        for t, carried, predicted in self.events:
            if counted:
                chunks.add(t, carried, chunks.completion if predicted is None else predicted)
            elif carried:
                chunks.add(t, True, None)
        chunks.store(out)


async def read_response(
    resp: aiohttp.ClientResponse, stream: bool, incremental: bool, out: Outcome, parser: Parser | None
) -> None:
    """llama-server's chat or completions route, streamed or not (its streams are always incremental)."""
    if stream:
        await read_stream(resp, LlamaStream(), out, parser)
        return
    body = await read_body(resp)
    choice = first_choice(body)
    content, thought = choice_text(choice)
    out.text = joined_response(thought, content)
    out.meta_info = meta_info(choice.get("finish_reason"), body.get("usage"), body.get("timings"))
    single_chunk(out, completion_count(out.meta_info))


# llama-server's protocol: its OpenAI-compatible routes with its own `timings`; it closes each connection
DIALECT = Dialect("llamacpp", {route: Route(path, read_response) for route, path in PATHS.items()}, payload, True)
