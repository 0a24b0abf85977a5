"""Parsing and validation of request bodies (`POST /generate`), with SGLang's field names.

Anything wrong raises `BadRequest`, which the HTTP layer turns into a 400 with the message.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default


class BadRequest(ValueError):
    """The request is malformed; the message says what to fix (HTTP 400)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass(frozen=True)
class SamplingParams:
    """`sampling_params` of one request (SGLang names and defaults)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0  # below 1e-6: greedy
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    min_p: float = 0.0  # plain sampling only (not on the verify path, as in SGLang)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    sampling_seed: int | None = None  # honoured only with --enable-deterministic-inference
    n: int = 1

    @classmethod
    def from_json(cls, obj: Any) -> SamplingParams:
        """Validate a JSON `sampling_params` object; unknown keys are an error."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise BadRequest(f"sampling_params must be an object, got {type(obj).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise BadRequest(f"unknown sampling_params key(s) {unknown}; supported: {sorted(known)}")
        values = {k: v for k, v in obj.items() if v is not None}
        if "stop" in values:
            values["stop"] = _stop_strings(values["stop"])
        if "stop_token_ids" in values:
            values["stop_token_ids"] = _int_tuple("stop_token_ids", values["stop_token_ids"])
        params = cls(**values)
        params.check()
        return params

    def check(self) -> None:
        """BadRequest naming the first invalid value."""
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            raise BadRequest(f"max_new_tokens={self.max_new_tokens!r} must be an integer >= 0")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise BadRequest(f"temperature={self.temperature!r} must be a number >= 0")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise BadRequest(f"top_p={self.top_p!r} must be in (0, 1]")
        if not _is_int(self.top_k) or (self.top_k < 1 and self.top_k != -1):
            raise BadRequest(f"top_k={self.top_k!r} must be -1 (whole vocabulary) or an integer >= 1")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise BadRequest(f"min_p={self.min_p!r} must be in [0, 1]")
        if not isinstance(self.ignore_eos, bool):
            raise BadRequest(f"ignore_eos={self.ignore_eos!r} must be true or false")
        if self.sampling_seed is not None and not _is_int(self.sampling_seed):
            raise BadRequest(f"sampling_seed={self.sampling_seed!r} must be an integer")
        if self.n != 1:
            raise BadRequest(f"n={self.n!r}: the embedded server supports n=1 only")


def _stop_strings(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise BadRequest(f"stop={value!r} must be a non-empty string or a list of them")
    return tuple(items)


def _int_tuple(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise BadRequest(f"{name}={value!r} must be a list of integers")
    return tuple(value)


@dataclass(frozen=True)
class PromptSpec:
    """One prompt of a generate request: text or ids (exactly one), its params and request id."""

    text: str | None
    input_ids: list[int] | None
    params: SamplingParams
    rid: str | None


@dataclass(frozen=True)
class GenerateInput:
    """A parsed `POST /generate` body; `batched` when `text`/`input_ids` was a list of prompts."""

    prompts: list[PromptSpec]
    stream: bool
    batched: bool


GENERATE_KEYS = ("text", "input_ids", "sampling_params", "stream", "rid", "return_logprob")


def check_body(body: Any, allowed: tuple[str, ...]) -> dict:
    """The request body as a dict whose keys are all in `allowed`; BadRequest naming the others."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; supported: {list(allowed)}")
    return body


def parse_generate(body: Any) -> GenerateInput:
    """Validate a `/generate` body (see the SGLang protocol notes)."""
    body = check_body(body, GENERATE_KEYS)
    if body.get("return_logprob"):
        raise BadRequest("return_logprob is not supported by the embedded server")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream={stream!r} must be true or false")
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text == has_ids:
        raise BadRequest("give exactly one of `text` or `input_ids`")
    texts, ids, batched = _prompts(body["text"], None) if has_text else _prompts(None, body["input_ids"])
    params = SamplingParams.from_json(body.get("sampling_params"))
    rids = _rids(body.get("rid"), len(texts), batched)
    if batched and stream:
        raise BadRequest("streaming a batch of prompts is not supported; send them as separate requests")
    prompts = [PromptSpec(t, i, params, r) for t, i, r in zip(texts, ids, rids, strict=True)]
    return GenerateInput(prompts=prompts, stream=stream, batched=batched)


def _prompts(text: Any, input_ids: Any) -> tuple[list, list, bool]:
    """([text or None], [ids or None], batched) for a single prompt or a list of prompts."""
    if text is not None:
        if isinstance(text, str):
            return [text], [None], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return text, [None] * len(text), True
        raise BadRequest("text must be a string or a non-empty list of strings")
    if isinstance(input_ids, list) and all(_is_int(t) for t in input_ids):
        return [None], [input_ids], False
    if isinstance(input_ids, list) and input_ids and all(
            isinstance(x, list) and all(_is_int(t) for t in x) for x in input_ids):
        return [None] * len(input_ids), input_ids, True
    raise BadRequest("input_ids must be a list of integers or a non-empty list of such lists")


def _rids(rid: Any, n: int, batched: bool) -> list[str | None]:
    if rid is None:
        return [None] * n
    if not batched and isinstance(rid, str):
        return [rid]
    if batched and isinstance(rid, list) and len(rid) == n and all(isinstance(r, str) for r in rid):
        return rid
    raise BadRequest("rid must be a string (a list of n strings for a batch)")
