"""A minimal OpenAI `POST /v1/chat/completions`, as SGLang serves it (streaming and not).

Messages are joined by a trivial chat template; `seed` maps to `sampling_seed`;
`return_spec_tokens_details` puts the speculative fields under `sglext.spec_tokens_details` (streaming:
an extra chunk with `choices: []` after the last choice chunk); `return_meta_info` (non-streaming) adds
the native `meta_info` to the choice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from harness.engine.http_api import (
    SERVICE,
    error_response,
    open_sse,
    outputs,
    read_json,
    safe_length,
    send_sse,
    stop_holdback,
)
from harness.engine.params import BadRequest, PromptSpec, SamplingParams, check_body
from harness.engine.request import Output, Request

ROLES = ("system", "developer", "user", "assistant", "tool")
CHAT_KEYS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
             "min_p", "stop", "stop_token_ids", "ignore_eos", "seed", "n", "stream", "stream_options",
             "return_spec_tokens_details", "return_meta_info", "chat_template_kwargs", "rid", "user",
             "logprobs", "frequency_penalty", "presence_penalty")
SPEC_DETAIL_KEYS = ("spec_accept_rate", "spec_accept_length", "spec_num_correct_drafts",
                    "spec_num_proposed_drafts", "spec_verify_ct", "spec_correct_drafts_histogram")


def apply_chat_template(messages: Any) -> str:
    """'<|role|>\\ncontent\\n' per message, then '<|assistant|>\\n'."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    parts = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"each message needs a role in {list(ROLES)}, got {m!r}"[:300])
        parts.append(f"<|{m['role']}|>\n{_content(m.get('content'))}\n")
    return "".join(parts) + "<|assistant|>\n"


def _content(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BadRequest("message content must be a string or a list of {'type': 'text', 'text': ...} parts")


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat body."""

    prompt: str
    params: SamplingParams
    max_tokens_given: bool  # without max_tokens, generate up to the context length (as SGLang does)
    stream: bool
    include_usage: bool
    spec_details: bool
    meta_info: bool
    rid: str | None


def parse_chat(body: Any) -> ChatRequest:
    body = check_body(body, CHAT_KEYS)
    if body.get("logprobs"):
        raise BadRequest("logprobs is not supported by the embedded server")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise BadRequest(f"{key} is not supported by the embedded server (only 0)")
    prompt = apply_chat_template(body.get("messages"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sampling = {"max_new_tokens": max_tokens, "sampling_seed": body.get("seed"),
                **{k: body[k] for k in ("temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
                                        "ignore_eos", "n") if k in body}}
    params = SamplingParams.from_json(sampling)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object")
    flags = {k: body.get(k, False) for k in ("stream", "return_spec_tokens_details", "return_meta_info")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise BadRequest(f"{k}={v!r} must be true or false")
    return ChatRequest(prompt=prompt, params=params, max_tokens_given=max_tokens is not None, stream=flags["stream"],
                       include_usage=bool(options.get("include_usage")),
                       spec_details=flags["return_spec_tokens_details"],
                       meta_info=flags["return_meta_info"], rid=body.get("rid"))


def finish_fields(out: Output) -> dict[str, Any]:
    reason = out.meta_info.get("finish_reason") or {}
    kind = reason.get("type")
    return {"finish_reason": kind if kind in ("stop", "length", "abort") else None,
            "matched_stop": reason.get("matched")}


def spec_tokens_details(meta: dict[str, Any]) -> dict[str, Any] | None:
    if "spec_verify_ct" not in meta:
        return None
    details = {k: meta[k] for k in SPEC_DETAIL_KEYS}
    return {**details, "spec_cap_length": 0.0, "spec_block_accept_length": 0.0, "spec_cap_lens_histogram": []}


def usage(meta: dict[str, Any]) -> dict[str, Any]:
    return {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
            "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"], "prompt_tokens_details": None,
            "reasoning_tokens": 0}


class _Chunks:
    """Builds `chat.completion.chunk` objects of one stream."""

    def __init__(self, rid: str, model: str) -> None:
        self.base = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": model}

    def choice(self, delta: dict[str, Any], finish: dict[str, Any] | None = None) -> dict[str, Any]:
        fin = finish or {"finish_reason": None, "matched_stop": None}
        return {**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": None, **fin}]}

    def extra(self, **fields: Any) -> dict[str, Any]:
        return {**self.base, "choices": [], **fields}


async def chat_completions(http: web.Request) -> web.StreamResponse:
    service = http.app[SERVICE]
    if not service.ready:
        return error_response(503, "the server is starting")
    try:
        chat = parse_chat(await read_json(http))
        ids = service.prompt_ids(PromptSpec(text=chat.prompt, input_ids=None, params=chat.params, rid=chat.rid))
        params = chat.params
        if not chat.max_tokens_given:
            params = replace(params, max_new_tokens=max(0, service.preset.context_length - len(ids)))
        req = service.new_request(ids, params, stream=chat.stream, rid=chat.rid)
    except BadRequest as e:
        return error_response(400, str(e))
    service.scheduler.submit(req)
    if chat.stream:
        return await _stream(http, req, chat)
    last = None
    async for out in outputs(http, service, req):
        last = out
    if last is None or not last.finished:
        return web.Response(status=499)
    return web.json_response(_response(req, last, chat, service.args.model_path))


def _response(req: Request, out: Output, chat: ChatRequest, model: str) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": out.text, "reasoning_content": None,
                                      "tool_calls": None}, "logprobs": None, **finish_fields(out)}
    if chat.meta_info:
        choice["meta_info"] = out.meta_info
    body = {"id": f"chatcmpl-{req.rid}", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(out.meta_info), "metadata": {"weight_version": "default"}}
    details = spec_tokens_details(out.meta_info) if chat.spec_details else None
    if details is not None:
        body["sglext"] = {"spec_tokens_details": details}
    return body


async def _stream(http: web.Request, req: Request, chat: ChatRequest) -> web.StreamResponse:
    service = http.app[SERVICE]
    resp = await open_sse(http)
    chunks = _Chunks(req.rid, service.args.model_path)
    holdback = stop_holdback(req)
    sent, last = 0, None
    try:
        await send_sse(resp, chunks.choice({"role": "assistant", "content": ""}))
        async for out in outputs(http, service, req):
            last = out
            end = safe_length(out.text, out.finished, holdback)
            delta = out.text[sent:end] if end > sent else ""
            sent = max(sent, end)
            if out.finished:
                await send_sse(resp, chunks.choice({"content": delta} if delta else {}, finish_fields(out)))
            elif delta:
                await send_sse(resp, chunks.choice({"content": delta}))
        if last is None or not last.finished:  # the client went away
            return resp
        details = spec_tokens_details(last.meta_info) if chat.spec_details else None
        if details is not None:
            await send_sse(resp, chunks.extra(sglext={"spec_tokens_details": details}))
        if chat.include_usage:
            await send_sse(resp, chunks.extra(usage=usage(last.meta_info)))
        await send_sse(resp, "[DONE]")
    except ConnectionError:
        service.scheduler.abort(req, "client disconnected")
    return resp


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
