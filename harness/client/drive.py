"""The load generator: sends a run's requests (aiohttp) and hands back what it saw of each.

Native `/generate` (streaming or not) or the OpenAI chat route. A concurrency cap (semaphore) and,
optionally, Poisson arrivals from a seeded generator. Each request has its own timeout; an error is
recorded, never retried. Times are `time.monotonic()` as the client saw them. Streams are read to their
end after `[DONE]`, so aiohttp keeps the connection for the next request.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import aiohttp
import orjson

from harness.client.config import ClientConfig, SamplingConfig
from harness.client.dialect import Dialect, Route
from harness.client.requests import (
    Outcome,
    RequestPlan,
    StreamError,
    chat_payload,
    generate_payload,
    meta_problem,
    token_ids,
)
from harness.client.sse import parse_object
from harness.client.streams import (
    ChatStream,
    CumulativeGenerate,
    IncrementalGenerate,
    Parser,
    _chat_meta,
    completion_count,
    joined_response,
    read_stream,
)
from harness.server.redact import clip

READ_BUFSIZE = 4 * 1024 * 1024  # a cumulative event of a 32k-token response is a few hundred KB


async def read_body(resp: aiohttp.ClientResponse) -> dict:
    return parse_object(await resp.read())


async def _read_generate(
    resp: aiohttp.ClientResponse, stream: bool, incremental: bool, out: Outcome, parser: Parser | None
) -> None:
    """Native /generate: the body, or the SSE events (cumulative text in SGLang's default)."""
    if stream:
        await read_stream(resp, IncrementalGenerate() if incremental else CumulativeGenerate(), out, parser)
        return
    body = await read_body(resp)
    out.text, out.meta_info = body.get("text", ""), body.get("meta_info")
    out.output_ids = token_ids(body.get("output_ids"))
    single_chunk(out, completion_count(out.meta_info))


async def _read_chat(
    resp: aiohttp.ClientResponse, stream: bool, incremental: bool, out: Outcome, parser: Parser | None
) -> None:
    """OpenAI chat completions: the body, or the SSE deltas (always incremental on this route)."""
    if stream:
        await read_stream(resp, ChatStream(), out, parser)
        return
    body = await read_body(resp)
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as e:
        raise StreamError(f"the chat response has no choices[0].message ({e!r}): {clip(str(body), 200)}") from None
    out.text = joined_response(message.get("reasoning_content"), message.get("content"))
    details = (body.get("sglext") or {}).get("spec_tokens_details")
    out.meta_info = _chat_meta(choice, body.get("usage"), details)
    single_chunk(out, completion_count(body.get("usage")))


def single_chunk(out: Outcome, completion: int | None) -> None:
    """A response without streaming: one chunk, its arrival."""
    t = time.monotonic()
    out.t_first_token, out.n_chunks, out.chunk_times = t, 1, [t]
    out.chunk_tokens = None if completion is None else [completion]


def sglang_payload(
    route: str, sampling: SamplingConfig, client: ClientConfig, request: RequestPlan, model: str
) -> dict:
    """SGLang's bodies: native /generate, or the OpenAI chat route with SGLang's extensions."""
    if route == "generate":
        return generate_payload(sampling, client, request)
    return chat_payload(sampling, client, request, model)


# SGLang's protocol (SGLang, and the embedded server, which speaks it)
SGLANG = Dialect(
    "sglang",
    {"generate": Route("/generate", _read_generate), "chat": Route("/v1/chat/completions", _read_chat)},
    sglang_payload,
)


async def send_one(
    session: aiohttp.ClientSession,
    base_url: str,
    route: str,
    payload: dict,
    timeout_s: float,
    out: Outcome,
    incremental: bool = False,
    parser: Parser | None = None,
    dialect: Dialect = SGLANG,
) -> Outcome:
    """Send one request; any failure becomes `out.error` (no retry). `incremental`: the server streams
    /generate with --incremental-streaming-output. `parser`: parse the stream there (see Parser). `dialect`:
    the server's protocol (its backend's)."""
    path, read = dialect.route(route).path, dialect.route(route).read
    body = orjson.dumps(payload)
    out.t_sent = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(base_url + path, data=body, headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    out.error = f"HTTP {resp.status}: {clip(await resp.text(), 500)}"
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
    elif out.error is None:
        out.error = meta_problem(out.meta_info)
    return out


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of n requests at `rate` per second, seeded."""
    rng = random.Random(seed)
    t, offsets = 0.0, []
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def new_session(limit: int = 0, force_close: bool = False) -> aiohttp.ClientSession:
    """A session whose connections are kept and reused (`limit` 0: as many as requests in flight), or with
    `force_close` one connection per request (llama-server closes its end after each response: a kept connection
    would fail the next request at random)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=force_close),
        timeout=aiohttp.ClientTimeout(total=None),
        read_bufsize=READ_BUFSIZE,
    )


async def drive(
    base_url: str,
    requests: list[RequestPlan],
    *,
    sampling: SamplingConfig,
    client: ClientConfig,
    model: str,
    concurrency: int,
    arrival_seed: int,
    on_done: Callable[[RequestPlan, Outcome], None],
    incremental: bool = False,
    dialect: Dialect = SGLANG,
) -> None:
    """Send every request (at most `concurrency` in flight; Poisson arrivals when client.request_rate is set),
    calling `on_done` as each finishes (the runner appends its record there). An exception of `on_done`
    cancels the requests still in flight and is raised here.

    `t_scheduled`: open loop, exactly the scheduled arrival (start + offset); closed loop, the start of the
    drive (when the request was queued). `incremental`: the server's /generate stream is incremental. `dialect`:
    the server's protocol (its backend's): the bodies, the readers, whether each request has its own connection."""
    semaphore = asyncio.Semaphore(concurrency)
    rate = client.request_rate
    open_loop = bool(rate)
    offsets = poisson_offsets(len(requests), rate, arrival_seed) if rate else [0.0] * len(requests)
    parser = Parser()
    parsing = asyncio.get_running_loop().create_task(parser.run())
    async with new_session(force_close=dialect.force_close) as session:
        start = time.monotonic()

        async def one(request: RequestPlan, offset: float) -> None:
            scheduled = start + offset
            await asyncio.sleep(max(0.0, scheduled - time.monotonic()))
            out = Outcome(t_scheduled=scheduled if open_loop else start)
            payload = {**dialect.payload(client.route, sampling, client, request, model), **client.extra_body}
            async with semaphore:
                await send_one(
                    session, base_url, client.route, payload, client.timeout_s, out, incremental, parser, dialect
                )
            on_done(request, out)

        tasks = [asyncio.ensure_future(one(s, o)) for s, o in zip(requests, offsets, strict=True)]
        try:
            await asyncio.gather(*tasks)
        finally:  # one that raised (on_done could not write its record) ends the others before the session closes
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            parsing.cancel()
