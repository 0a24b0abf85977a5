"""OpenAI `POST /v1/chat/completions` and `POST /v1/completions`, as SGLang serves them (streaming and not).

Both routes share one body parser for the sampling fields (`seed` maps to `sampling_seed`), one
streaming loop and one response shape; only the prompt (a chat template over `messages`, or
`prompt`) and the choice objects differ. `return_spec_tokens_details` puts the speculative fields under
`sglext.spec_tokens_details` (streaming: an extra chunk with `choices: []` after the last choice
chunk); chat's `return_meta_info` (non-streaming) adds the native `meta_info` to the choice.

SGLang fields that the embedded server cannot honour are accepted at their neutral value and refused
otherwise (400 naming the field); keys that SGLang does not know either are refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from harness.engine.http_api import (
    SERVICE,
    error_response,
    final_output,
    open_sse,
    outputs,
    read_json,
    safe_length,
    send_sse,
    stop_holdback,
)
from harness.engine.params import BadRequest, PromptSpec, SamplingParams, check_body, prompt_lists
from harness.engine.request import Output, Request
from harness.engine.tokenizer import render_chat

ROLES = ("system", "developer", "user", "assistant", "tool")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos", "n")
FLAG_KEYS = ("stream", "return_spec_tokens_details")
COMMON_KEYS = ("seed", "rid", "stream_options", *SAMPLING_KEYS, *FLAG_KEYS)
# Accepted with any value and ignored: naming, routing and cache bookkeeping of a multi-device server.
IGNORED_KEYS = (
    "model",
    "user",
    "skip_special_tokens",
    "return_cached_tokens_details",
    "session_id",
    "extra_key",
    "cache_salt",
    "priority",
    "custom_labels",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "routed_dp_rank",
    "data_parallel_rank",
    "disagg_prefill_dp_rank",
)
# SGLang fields that change the output: accepted at these values only.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logprobs": (False,),
}
COMPLETION_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_tokens": (0,),
    "logprobs": (),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "logit_bias": ({},),
    "response_format": (),
    "json_schema": (),
    "regex": (),
    "ebnf": (),
    "stop_regex": (),
    "no_stop_trim": (False,),
    "return_hidden_states": (False,),
    "return_routed_experts": (False,),
    "return_token_ids": (False,),
    "lora_path": (),
    "custom_logit_processor": (),
    "session_params": (),
    "custom_params": (),
    "watermark": (),
}
CHAT_KEYS = (
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "return_meta_info",
    "chat_template_kwargs",
    *COMMON_KEYS,
    *IGNORED_KEYS,
    *NEUTRAL,
)
COMPLETION_KEYS = ("prompt", "max_tokens", *COMMON_KEYS, *IGNORED_KEYS, *COMPLETION_NEUTRAL)
COMPLETION_MAX_TOKENS = 16  # SGLang's CompletionRequest default
SPEC_DETAIL_KEYS = (
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
)


# ---------------------------------------------------------------------- parsing, shared


@dataclass(frozen=True)
class StreamOptions:
    """What a response carries besides the choices."""

    stream: bool
    include_usage: bool  # streaming: a final usage chunk
    continuous_usage: bool  # streaming: every choice chunk carries the usage so far (continuous_usage_stats)
    spec_details: bool  # sglext.spec_tokens_details


def check_neutral(body: dict[str, Any], neutral: dict[str, tuple[Any, ...]]) -> None:
    """BadRequest for a field the embedded server cannot honour, sent away from its neutral value."""
    for key, values in neutral.items():
        value = body.get(key)
        if value is not None and not any(value == v and type(value) is type(v) for v in values):
            allowed = " or ".join(json.dumps(v) for v in (*values, None))
            raise BadRequest(
                f"{key}={value!r}"[:200] + f" is not supported by the embedded server; leave it out or send {allowed}"
            )


def sampling_params(body: dict[str, Any], max_tokens: int, max_key: str = "max_tokens") -> SamplingParams:
    """The OpenAI sampling fields as SGLang's sampling_params (`seed` -> `sampling_seed`); a refusal names the
    request's own keys (`max_key`: the one that gave max_tokens)."""
    sampling = {
        "max_new_tokens": max_tokens,
        "sampling_seed": body.get("seed"),
        **{k: body[k] for k in SAMPLING_KEYS if k in body},
    }
    try:
        return SamplingParams.from_json(sampling)
    except BadRequest as exc:
        raise BadRequest(str(exc).replace("max_new_tokens", max_key).replace("sampling_seed", "seed")) from None


def stream_options(body: dict[str, Any]) -> StreamOptions:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest(f"stream_options={options!r} must be an object")
    flags = {k: _flag(body, k) for k in FLAG_KEYS}
    return StreamOptions(
        stream=flags["stream"],
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("continuous_usage_stats")),
        spec_details=flags["return_spec_tokens_details"],
    )


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{key}={value!r} must be true or false")
    return value


def _rid(body: dict[str, Any]) -> str | None:
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest(f"rid={rid!r} must be a string")
    return rid


# ---------------------------------------------------------------------- parsing, chat


def chat_messages(messages: Any) -> list[dict[str, str]]:
    """`messages` checked: a non-empty list of {role, content} with a known role and text content."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"each message needs a role in {list(ROLES)}, got {m!r}"[:300])
        out.append({"role": m["role"], "content": _content(m.get("content"))})
    return out


def apply_chat_template(messages: Any) -> str:
    """The embedded models' chat template over checked `messages` (tokenizer.render_chat)."""
    return render_chat(chat_messages(messages))


def _content(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise BadRequest("message content must be a string or a list of {'type': 'text', 'text': ...} parts")


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat body."""

    messages: list[dict[str, str]]  # checked; the server's chat template renders them
    params: SamplingParams
    max_tokens_given: bool  # without max_tokens, generate up to the context length (as SGLang does)
    options: StreamOptions
    meta_info: bool
    rid: str | None


def parse_chat(body: Any) -> ChatRequest:
    body = check_body(body, CHAT_KEYS)
    check_neutral(body, NEUTRAL)
    messages = chat_messages(body.get("messages"))
    # as SGLang: max_completion_tokens, else max_tokens (an explicit null counts as not given)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    return ChatRequest(
        messages=messages,
        params=sampling_params(body, max_tokens, key),
        max_tokens_given=max_tokens is not None,
        options=stream_options(body),
        meta_info=_flag(body, "return_meta_info"),
        rid=_rid(body),
    )


# ---------------------------------------------------------------------- parsing, completions


@dataclass(frozen=True)
class CompletionRequest:
    """A validated `/v1/completions` body: one or several prompts (text or token ids)."""

    prompts: list[PromptSpec]
    batched: bool
    options: StreamOptions


def parse_completion(body: Any) -> CompletionRequest:
    body = check_body(body, COMPLETION_KEYS)
    check_neutral(body, COMPLETION_NEUTRAL)
    max_tokens = body.get("max_tokens")
    max_tokens = COMPLETION_MAX_TOKENS if max_tokens is None else max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        raise BadRequest(f"max_tokens={max_tokens!r} must be a positive integer")
    params = sampling_params(body, max_tokens)
    texts, ids, batched = _completion_prompts(body.get("prompt"))
    rid = _rid(body)
    rids = [f"{rid}_{i}" for i in range(len(texts))] if rid is not None and batched else [rid] * len(texts)
    options = stream_options(body)
    if batched and options.stream:
        raise BadRequest("streaming a list of prompts is not supported; send them as separate requests")
    prompts = [PromptSpec(t, i, params, r) for t, i, r in zip(texts, ids, rids, strict=True)]
    return CompletionRequest(prompts=prompts, batched=batched, options=options)


def _completion_prompts(prompt: Any) -> tuple[list, list, bool]:
    """`prompt`: a string, a list of strings, a list of token ids, or a list of such lists."""
    if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
        raise BadRequest("prompt cannot be empty: give a string, a list of strings or a list of token ids")
    is_text = isinstance(prompt, str) or (isinstance(prompt, list) and isinstance(prompt[0], str))
    try:
        return prompt_lists(prompt, None) if is_text else prompt_lists(None, prompt)
    except BadRequest as exc:
        if "cannot be empty" in str(exc):
            raise BadRequest(str(exc).replace("input_ids", "prompt")) from None
        raise BadRequest(
            "prompt must be a string, a list of strings, a list of token ids or a list of such lists"
        ) from None


# ---------------------------------------------------------------------- response pieces


def finish_fields(out: Output) -> dict[str, Any]:
    reason = out.meta_info.get("finish_reason") or {}
    kind = reason.get("type")
    return {
        "finish_reason": kind if kind in ("stop", "length", "abort") else None,
        "matched_stop": reason.get("matched"),
    }


def spec_tokens_details(meta: dict[str, Any]) -> dict[str, Any] | None:
    if "spec_verify_ct" not in meta:
        return None
    details = {k: meta[k] for k in SPEC_DETAIL_KEYS}
    return {**details, "spec_cap_length": 0.0, "spec_block_accept_length": 0.0, "spec_cap_lens_histogram": []}


def usage(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """Token counts summed over the choices."""
    prompt = sum(m["prompt_tokens"] for m in metas)
    completion = sum(m["completion_tokens"] for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }


def _sglext(out: Output, options: StreamOptions) -> dict[str, Any] | None:
    details = spec_tokens_details(out.meta_info) if options.spec_details else None
    return None if details is None else {"spec_tokens_details": details}


class Chunks:
    """Builds the chunk objects of one stream; subclasses say how a choice carries its text."""

    object = ""
    id_prefix = ""

    def __init__(self, rid: str, model: str) -> None:
        self.base = {"id": f"{self.id_prefix}{rid}", "object": self.object, "created": int(time.time()), "model": model}

    def first(self) -> dict[str, Any] | None:
        """A chunk before any text, or None."""
        return None

    def choice(
        self, text: str, finish: dict[str, Any] | None = None, usage_so_far: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A choice chunk; `usage_so_far` (continuous_usage_stats) goes with it as SGLang sends it."""
        fin = finish or {"finish_reason": None, "matched_stop": None}
        chunk = {**self.base, "choices": [{"index": 0, **self.text_field(text), "logprobs": None, **fin}]}
        if usage_so_far is not None:
            chunk["usage"] = usage_so_far
        return chunk

    def text_field(self, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def extra(self, **fields: Any) -> dict[str, Any]:
        return {**self.base, "choices": [], **fields}


class ChatChunks(Chunks):
    object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def first(self) -> dict[str, Any]:
        return self.choice_delta({"role": "assistant", "content": ""})

    def choice_delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        fin = {"finish_reason": None, "matched_stop": None}
        return {**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": None, **fin}]}

    def text_field(self, text: str) -> dict[str, Any]:
        return {"delta": {"content": text} if text else {}}


class CompletionChunks(Chunks):
    object = "text_completion"
    id_prefix = "cmpl-"

    def text_field(self, text: str) -> dict[str, Any]:
        return {"text": text}


# ---------------------------------------------------------------------- routes


async def chat_completions(http: web.Request) -> web.StreamResponse:
    service = http.app[SERVICE]
    if not service.ready:
        return error_response(503, "the server is starting")
    try:
        chat = parse_chat(await read_json(http))
        prompt = service.tokenizer.chat_prompt(chat.messages)
        # without max_tokens the reply may fill the context: the prompt needs room for one token, not the default's
        checked = chat.params if chat.max_tokens_given else replace(chat.params, max_new_tokens=1)
        ids = await service.prompt_ids_async(PromptSpec(text=prompt, input_ids=None, params=checked, rid=chat.rid))
        params = chat.params
        if not chat.max_tokens_given:
            params = replace(params, max_new_tokens=max(0, service.context_length - len(ids)))
        req = service.new_request(ids, params, stream=chat.options.stream, rid=chat.rid)
        service.check_rids([req])
    except BadRequest as e:
        return error_response(400, str(e))
    service.running.submit(req)
    if chat.options.stream:
        return await stream_openai(http, req, chat.options, ChatChunks(req.rid, service.args.model_path))
    last = await final_output(http, service, req)
    if last is None:
        return web.Response(status=499)  # the client is gone; nobody reads this
    return web.json_response(_chat_response(req, last, chat, service.args.model_path))


def _chat_response(req: Request, out: Output, chat: ChatRequest, model: str) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": out.text, "reasoning_content": None, "tool_calls": None},
        "logprobs": None,
        **finish_fields(out),
    }
    if chat.meta_info:
        choice["meta_info"] = out.meta_info
    body = {
        "id": f"chatcmpl-{req.rid}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage([out.meta_info]),
        "metadata": {"weight_version": "default"},
    }
    sglext = _sglext(out, chat.options)
    if sglext is not None:
        body["sglext"] = sglext
    return body


async def completions(http: web.Request) -> web.StreamResponse:
    service = http.app[SERVICE]
    if not service.ready:
        return error_response(503, "the server is starting")
    try:
        comp = parse_completion(await read_json(http))
        reqs = [
            service.new_request(await service.prompt_ids_async(p), p.params, stream=comp.options.stream, rid=p.rid)
            for p in comp.prompts
        ]
        service.check_rids(reqs)
    except BadRequest as e:
        return error_response(400, str(e))
    for r in reqs:
        service.running.submit(r)
    model = service.args.model_path
    if comp.options.stream:
        return await stream_openai(http, reqs[0], comp.options, CompletionChunks(reqs[0].rid, model))
    finals = await asyncio.gather(*(final_output(http, service, r) for r in reqs))
    outs = [f for f in finals if f is not None]
    if len(outs) < len(finals):
        return web.Response(status=499)
    return web.json_response(_completion_response(reqs, outs, comp, model))


def _completion_response(
    reqs: list[Request], outs: list[Output], comp: CompletionRequest, model: str
) -> dict[str, Any]:
    choices = [{"index": i, "text": out.text, "logprobs": None, **finish_fields(out)} for i, out in enumerate(outs)]
    body = {
        "id": f"cmpl-{reqs[0].rid}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage([o.meta_info for o in outs]),
        "metadata": {"weight_version": "default"},
    }
    sglext = _sglext(outs[0], comp.options)  # SGLang reports the first prompt's details when n == 1
    if sglext is not None:
        body["sglext"] = sglext
    return body


async def stream_openai(http: web.Request, req: Request, options: StreamOptions, chunks: Chunks) -> web.StreamResponse:
    """Choice chunks with text deltas (never a stop string's prefix; with `continuous_usage_stats` each
    carries the usage so far, as SGLang's do), then sglext and usage, then [DONE]."""
    service = http.app[SERVICE]
    resp = await open_sse(http)
    holdback = stop_holdback(req)
    sent, last = 0, None
    try:
        first = chunks.first()
        if first is not None:
            await send_sse(resp, first)
        async for out in outputs(http, service, req):
            last = out
            end = safe_length(out.text, out.finished, holdback)
            delta = out.text[sent:end] if end > sent else ""
            sent = max(sent, end)
            so_far = usage([out.meta_info]) if options.continuous_usage else None
            if out.finished:
                await send_sse(resp, chunks.choice(delta, finish_fields(out), so_far))
            elif delta:
                await send_sse(resp, chunks.choice(delta, usage_so_far=so_far))
        if last is None or not last.finished:  # the client went away
            return resp
        sglext = _sglext(last, options)
        if sglext is not None:
            await send_sse(resp, chunks.extra(sglext=sglext))
        if options.include_usage:
            await send_sse(resp, chunks.extra(usage=usage([last.meta_info])))
        await send_sse(resp, "[DONE]")
    except ConnectionError:
        service.running.abort(req, "client disconnected")
    return resp


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
