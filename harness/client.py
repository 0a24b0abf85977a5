"""The load generator: sends a run's requests (aiohttp), one raw record per request.

Native `/generate` (streaming or not) or the OpenAI chat route. A concurrency cap (semaphore) and,
optionally, Poisson arrivals from a seeded generator. Each request has its own timeout; an error is
recorded, never retried. Times are `time.monotonic()` as the client saw them.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from harness.config import ClientConfig, SamplingConfig
from workloads.base import Item

SPEC_FIELDS = ("spec_verify_ct", "spec_num_correct_drafts")


@dataclass
class RequestSpec:
    """One request of a run: the item, its seed, whether it is a warmup, its token cap."""

    item: Item
    request_seed: int | None
    warmup: bool
    max_new_tokens: int


@dataclass
class Outcome:
    """What the client saw of one request (turned into a record by the runner)."""

    t_scheduled: float
    t_sent: float | None = None
    t_first_token: float | None = None
    t_end: float | None = None
    n_chunks: int = 0
    text: str = ""
    meta_info: dict[str, Any] | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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
    if client.stream:
        payload["stream_options"] = {"include_usage": True}
    if sampling.stop:
        payload["stop"] = list(sampling.stop)
    if spec.request_seed is not None:
        payload["seed"] = spec.request_seed
    if client.chat_template_kwargs:
        payload["chat_template_kwargs"] = dict(client.chat_template_kwargs)
    return payload


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """The JSON objects of a Server-Sent Events stream, until `data: [DONE]`.

    Reads raw bytes and splits on blank lines itself: a cumulative-text event of a long response
    can be far larger than aiohttp's line limit.
    """
    buffer = b""
    async for piece in resp.content.iter_any():
        buffer += piece
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.decode("utf-8", errors="replace").splitlines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                yield json.loads(data)


def _error_text(obj: dict) -> str | None:
    err = obj.get("error")
    if err is None:
        return None
    return json.dumps(err) if not isinstance(err, str) else err


async def _read_generate(resp: aiohttp.ClientResponse, stream: bool, out: Outcome) -> None:
    """Native /generate: the body, or the SSE chunks (text is cumulative in SGLang's default)."""
    if not stream:
        body = await resp.json(content_type=None)
        out.text, out.meta_info = body.get("text", ""), body.get("meta_info")
        return
    async for chunk in sse_events(resp):
        if (err := _error_text(chunk)) is not None:
            out.error = err
            return
        out.n_chunks += 1
        text = chunk.get("text", "")
        if out.t_first_token is None and (text or chunk.get("output_ids")):
            out.t_first_token = time.monotonic()
        out.text = text
        out.meta_info = chunk.get("meta_info")


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


async def _read_chat(resp: aiohttp.ClientResponse, stream: bool, out: Outcome) -> None:
    """OpenAI chat completions (SGLang): the body, or the SSE deltas plus the usage and
    `sglext.spec_tokens_details` chunks."""
    if not stream:
        body = await resp.json(content_type=None)
        choice = body["choices"][0]
        message = choice["message"]
        out.text = joined_response(message.get("reasoning_content"), message.get("content"))
        details = (body.get("sglext") or {}).get("spec_tokens_details")
        out.meta_info = _chat_meta(choice, body.get("usage"), details)
        return
    parts: list[str] = []
    reasoning: list[str] = []
    final: dict = {}
    usage = details = None
    async for chunk in sse_events(resp):
        if (err := _error_text(chunk)) is not None:
            out.error = err
            return
        out.n_chunks += 1
        usage = chunk.get("usage") or usage
        details = (chunk.get("sglext") or {}).get("spec_tokens_details") or details
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content, thought = delta.get("content") or "", delta.get("reasoning_content") or ""
            if (content or thought) and out.t_first_token is None:
                out.t_first_token = time.monotonic()
            parts.append(content)
            reasoning.append(thought)
            if choice.get("finish_reason") is not None:
                final = choice
    out.text = joined_response("".join(reasoning), "".join(parts))
    out.meta_info = _chat_meta(final, usage, details)


ROUTES = {"generate": ("/generate", _read_generate), "chat": ("/v1/chat/completions", _read_chat)}


async def send_one(session: aiohttp.ClientSession, base_url: str, route: str, payload: dict,
                   timeout_s: float, out: Outcome) -> Outcome:
    """Send one request; any failure becomes `out.error` (no retry)."""
    out.t_sent = time.monotonic()
    path, read = ROUTES[route]
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(base_url + path, json=payload) as resp:
                if resp.status != 200:
                    out.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                else:
                    await read(resp, payload["stream"], out)
                    if not payload["stream"]:
                        out.t_first_token, out.n_chunks = time.monotonic(), 1
    except TimeoutError:
        out.error = f"timeout after {timeout_s:.0f}s (client.timeout_s)"
    except (aiohttp.ClientError, json.JSONDecodeError, KeyError, IndexError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.t_end = time.monotonic()
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


async def drive(base_url: str, specs: list[RequestSpec], *, sampling: SamplingConfig, client: ClientConfig,
                model: str, concurrency: int, arrival_seed: int,
                on_done: Callable[[RequestSpec, Outcome], None]) -> None:
    """Send every spec (at most `concurrency` in flight; Poisson arrivals when client.request_rate is set),
    calling `on_done` as each finishes (the runner appends its record there)."""
    semaphore = asyncio.Semaphore(concurrency)
    start = time.monotonic()
    offsets = (poisson_offsets(len(specs), client.request_rate, arrival_seed) if client.request_rate
               else [0.0] * len(specs))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def one(spec: RequestSpec, offset: float) -> None:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            out = Outcome(t_scheduled=time.monotonic())
            if client.route == "generate":
                payload = generate_payload(sampling, client, spec)
            else:
                payload = chat_payload(sampling, client, spec, model)
            async with semaphore:
                await send_one(session, base_url, client.route, payload, client.timeout_s, out)
            on_done(spec, out)

        await asyncio.gather(*(one(s, o) for s, o in zip(specs, offsets, strict=True)))
