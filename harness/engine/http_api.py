"""SGLang's native HTTP routes on aiohttp: /generate, health, flush_cache, server and model info.

Errors in a request's body answer 400 `{"error": {"message": ...}}` and touch nothing else; a client that
closes its connection in the middle of its body is one line in the log. As in
SGLang, `/generate` ignores top-level keys it does not know and refuses unknown `sampling_params` keys
(params.py). A client that goes away (closed connection) has its request aborted, which frees its slot
in the batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from harness.engine.params import BadRequest, parse_generate
from harness.engine.request import Output, Request
from harness.engine.service import EngineService

log = logging.getLogger("harness.engine")
SERVICE = web.AppKey("service", EngineService)
POLL_S = 0.5  # how often a waiting non-streaming handler checks that its client is still there


MAX_FLUSH_TIMEOUT_S = 3600.0


def error_response(status: int, message: str) -> web.Response:
    body = {
        "error": {"message": message, "type": "BadRequestError" if status == 400 else "ServerError", "code": status}
    }
    return web.json_response(body, status=status)


class ClientGone(Exception):
    """The client closed its connection before its request body had arrived: nobody is left to answer."""


async def read_json(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("the body nests JSON arrays or objects too deeply") from None
    except ConnectionError:
        raise ClientGone from None


@web.middleware
async def quiet_when_client_gone(request: web.Request, handler: Any) -> web.StreamResponse:
    """A client that went away in the middle of its request body is one line in the log, not a traceback."""
    try:
        return await handler(request)
    except ClientGone:
        log.info(
            f"{request.method} {request.path}: the client closed the connection before its request body "
            "had arrived; nothing was run"
        )
        return web.Response(status=499)


def client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def outputs(http: web.Request, service: EngineService, req: Request) -> AsyncIterator[Output]:
    """The request's snapshots until the final one; aborts it if the client disconnects."""
    try:
        while True:
            try:
                out = await asyncio.wait_for(req.events.get(), timeout=POLL_S)
            except TimeoutError:
                if client_gone(http):
                    return
                continue
            yield out
            if out.finished:
                return
    finally:
        if not req.finished:
            service.running.abort(req, "client disconnected")


async def open_sse(http: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(http)
    return resp


async def send_sse(resp: web.StreamResponse, payload: dict | str) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    await resp.write(f"data: {data}\n\n".encode())


def safe_length(text: str, finished: bool, holdback: int) -> int:
    """How much of a growing text can be sent as a delta now: not the part a stop string may still
    trim (`holdback` = longest stop string - 1), nor a trailing incomplete character (U+FFFD)."""
    if finished:
        return len(text)
    end = len(text.rstrip("\ufffd"))
    return max(0, min(end, len(text) - holdback))


def stop_holdback(req: Request) -> int:
    return max((len(s) for s in req.params.stop), default=1) - 1


# ---------------------------------------------------------------------- /generate


def generate_payload(out: Output) -> dict[str, Any]:
    return {"text": out.text, "output_ids": out.output_ids, "meta_info": out.meta_info}


async def generate(http: web.Request) -> web.StreamResponse:
    service = http.app[SERVICE]
    if not service.ready:
        return error_response(503, "the server is starting")
    try:
        parsed = parse_generate(await read_json(http))
        requests = [
            service.new_request(await service.prompt_ids_async(p), p.params, stream=parsed.stream, rid=p.rid)
            for p in parsed.prompts
        ]
        service.check_rids(requests)
    except BadRequest as e:
        return error_response(400, str(e))
    for r in requests:
        service.running.submit(r)
    if parsed.stream:
        return await _stream_generate(http, service, requests[0])
    finals = await asyncio.gather(*(final_output(http, service, r) for r in requests))
    outs = [f for f in finals if f is not None]
    if len(outs) < len(finals):
        return web.Response(status=499)  # the client is gone; nobody reads this
    payloads = [generate_payload(f) for f in outs]
    return web.json_response(payloads if parsed.batched else payloads[0])


async def final_output(http: web.Request, service: EngineService, req: Request) -> Output | None:
    """The request's final snapshot; None when the client went away first (the request is aborted)."""
    last = None
    async for out in outputs(http, service, req):
        last = out
    return last if last is not None and last.finished else None


async def _stream_generate(http: web.Request, service: EngineService, req: Request) -> web.StreamResponse:
    resp = await open_sse(http)
    incremental = service.args.incremental_streaming_output
    chars, ids = 0, 0  # already sent, in incremental mode
    last = None
    try:
        async for last in outputs(http, service, req):
            payload = generate_payload(last)
            if incremental:
                end = max(chars, safe_length(last.text, last.finished, stop_holdback(req)))
                payload.update(text=last.text[chars:end], output_ids=last.output_ids[ids:])
                chars, ids = end, len(last.output_ids)
            await send_sse(resp, payload)
        if last is not None and last.finished:  # not when the client went away
            await send_sse(resp, "[DONE]")
    except ConnectionError:
        service.running.abort(req, "client disconnected")
    return resp


# ---------------------------------------------------------------------- health, flush, info


async def health(http: web.Request) -> web.Response:
    ready = http.app[SERVICE].ready
    return web.Response(status=200 if ready else 503, text="" if ready else "starting")


async def health_generate(http: web.Request) -> web.Response:
    ok = await http.app[SERVICE].health_generate()
    return web.Response(status=200 if ok else 503, text="" if ok else "not ready")


async def flush_cache(http: web.Request) -> web.Response:
    """Resets the lifetime counters when idle; waits up to `?timeout=` seconds for idleness, else 400."""
    service = http.app[SERVICE]
    try:
        timeout = float(http.query.get("timeout", "0"))
    except ValueError:
        timeout = math.nan
    if not 0 <= timeout <= MAX_FLUSH_TIMEOUT_S:  # NaN fails too
        return error_response(
            400, f"timeout={http.query.get('timeout')!r} must be a number of seconds in [0, {MAX_FLUSH_TIMEOUT_S:.0f}]"
        )
    deadline = asyncio.get_running_loop().time() + timeout
    while service.scheduler is None or not service.scheduler.flush():
        if asyncio.get_running_loop().time() >= deadline:
            return web.Response(
                status=400, text="Cache not flushed: the server has running or queued requests (or is still starting)."
            )
        await asyncio.sleep(0.05)
    return web.Response(status=200, text="Cache flushed.")


async def metrics(http: web.Request) -> web.Response:
    """The server's cumulative counters in the Prometheus text format (harness/engine/metrics.py)."""
    scheduler = http.app[SERVICE].scheduler
    if scheduler is None:
        return web.Response(status=503, text="the server is starting")
    return web.Response(body=scheduler.metrics.text(), content_type="text/plain", charset="utf-8")


async def server_info(http: web.Request) -> web.Response:
    return web.json_response(http.app[SERVICE].server_info())


async def model_info(http: web.Request) -> web.Response:
    return web.json_response(http.app[SERVICE].model_info())


async def models(http: web.Request) -> web.Response:
    return web.json_response(http.app[SERVICE].models_list())


def add_routes(app: web.Application) -> None:
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_route("*", "/flush_cache", flush_cache)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)
    app.router.add_get("/v1/models", models)
