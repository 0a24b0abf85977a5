"""Parsing and validation of request bodies (`POST /generate`), with SGLang's field names.

Anything wrong raises `BadRequest`, which the HTTP layer turns into a 400 with the message.

What SGLang 0.5.23 accepts is the model: the top level of a `/generate` body is `GenerateReqInput`
(`sglang/srt/managers/io_struct.py`), checked by the JSON contract `GenerateRequest`
(`sglang/api/v1/api_types.py`, "unknown keys ignored"), so unknown top-level keys are ignored; its
`SamplingParams` contract rejects unknown keys. Here the top-level fields the embedded server cannot
honour are accepted at their "off" value and refused otherwise; SGLang's sampling keys that it does
not implement are accepted at their neutral value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Any, TypeGuard

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default
INT32_MAX = 2**31 - 1  # top_k and max_new_tokens live in 32-bit tensors (top_k above the vocabulary = all of it)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # sampling_seed is a 64-bit integer


FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32


class BadRequest(ValueError):
    """The request is malformed; the message says what to fix (HTTP 400)."""


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# SGLang sampling keys the embedded server does not implement: accepted at these neutral values only.
NEUTRAL_SAMPLING: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_new_tokens": (0,),
    "no_stop_trim": (False,),
    "logit_bias": ({},),
    "stop_regex": ([],),
    "json_schema": (),
    "regex": (),
    "ebnf": (),
    "structural_tag": (),
    "custom_params": (),
    "beam_width": (),
    "watermark": (),
    "choice": ([],),
}
# SGLang sampling keys with no effect here: special tokens never reach the text (EOS decodes to
# nothing) and every step is streamed.
IGNORED_SAMPLING: dict[str, str] = {
    "skip_special_tokens": "bool",
    "spaces_between_special_tokens": "bool",
    "stream_interval": "int",
}


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
        """Validate a JSON `sampling_params` object; unknown keys are an error, as in SGLang."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise BadRequest(f"sampling_params must be an object, got {type(obj).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(obj) - known - set(NEUTRAL_SAMPLING) - set(IGNORED_SAMPLING))
        if unknown:
            raise BadRequest(
                f"unknown sampling_params key(s) {unknown}; supported: {sorted(known)} "
                f"(and SGLang's {sorted(NEUTRAL_SAMPLING)} at their neutral values)"
            )
        _check_unimplemented(obj)
        values = {k: v for k, v in obj.items() if k in known and v is not None}
        if "stop" in values:
            values["stop"] = _stop_strings(values["stop"])
        if "stop_token_ids" in values:
            values["stop_token_ids"] = _int_tuple("stop_token_ids", values["stop_token_ids"])
        params = cls(**values)
        params.check()
        return params

    def check(self) -> None:
        """BadRequest naming the first invalid value."""
        if not _is_int(self.max_new_tokens) or not 0 <= self.max_new_tokens <= INT32_MAX:
            raise BadRequest(f"max_new_tokens={self.max_new_tokens!r} must be an integer in [0, {INT32_MAX}]")
        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise BadRequest(f"temperature={self.temperature!r} must be a finite number >= 0")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise BadRequest(f"top_p={self.top_p!r} must be in (0, 1]")
        if self.top_p < FLOAT32_TINY:  # the verify step reads it as float32, where it would be 0: no token kept
            raise BadRequest(
                f"top_p={self.top_p!r} is 0 as a float32 (the smallest is {FLOAT32_TINY:.3g}); a greedy "
                "row takes temperature 0 or top_k 1"
            )
        if not _is_int(self.top_k) or (self.top_k < 1 and self.top_k != -1) or self.top_k > INT32_MAX:
            raise BadRequest(f"top_k={self.top_k!r} must be -1 (whole vocabulary) or an integer in [1, {INT32_MAX}]")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise BadRequest(f"min_p={self.min_p!r} must be in [0, 1]")
        if not isinstance(self.ignore_eos, bool):
            raise BadRequest(f"ignore_eos={self.ignore_eos!r} must be true or false")
        if self.sampling_seed is not None and (
            not _is_int(self.sampling_seed) or not INT64_MIN <= self.sampling_seed <= INT64_MAX
        ):
            raise BadRequest(
                f"sampling_seed={self.sampling_seed!r} must be a 64-bit integer ([{INT64_MIN}, {INT64_MAX}])"
            )
        if self.n != 1:
            raise BadRequest(f"n={self.n!r}: the embedded server supports n=1 only")


def _check_unimplemented(obj: dict[str, Any]) -> None:
    """BadRequest for an unimplemented SGLang sampling key away from its neutral value."""
    for key, neutral in NEUTRAL_SAMPLING.items():
        value = obj.get(key)
        if value is not None and not any(value == n and type(value) is type(n) for n in neutral):
            allowed = " or ".join(json.dumps(n) for n in (*neutral, None))
            raise BadRequest(f"{key}={value!r} is not supported by the embedded server; leave it out or send {allowed}")
    for key, kind in IGNORED_SAMPLING.items():
        value = obj.get(key)
        ok = isinstance(value, bool) if kind == "bool" else (_is_int(value) and value >= 1)
        if value is not None and not ok:
            raise BadRequest(f"{key}={value!r} must be " + ("true or false" if kind == "bool" else "an integer >= 1"))


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


# GenerateReqInput fields that would change what a request returns or how it is computed, and that
# the embedded server cannot honour: accepted when off (null, false, or a list of those), else 400.
OFF_ONLY_FIELDS: dict[str, str] = {
    "return_logprob": "it computes no log probabilities",
    "return_hidden_states": "it returns no hidden states",
    "return_routed_experts": "its models have no experts",
    "return_sampling_mask": "it returns no sampling masks",
    "return_indexer_topk": "its models have no indexer",
    "return_prompt_token_ids": "it does not echo prompt token ids",
    "lora_path": "it loads no LoRA adapters",
    "lora_id": "it loads no LoRA adapters",
    "input_embeds": "it takes text or input_ids only",
    "image_data": "its models are text-only",
    "video_data": "its models are text-only",
    "audio_data": "its models are text-only",
    "custom_logit_processor": "it runs no custom logit processors",
    "session_params": "it keeps no sessions",
    "positional_embed_overrides": "it takes no embedding overrides",
}
# GenerateReqInput fields that only matter with one of the above on: type-checked, then ignored.
INT_OR_LIST_FIELDS = ("logprob_start_len", "top_logprobs_num", "routed_experts_start_len")
# All other top-level keys (routing, disaggregation, session ids, labels, priority, unknown keys)
# have no effect on a one-device server and are ignored, as SGLang ignores keys it does not know.


def parse_generate(body: Any) -> GenerateInput:
    """Validate a `/generate` body (see the module docstring and the SGLang protocol notes)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_off_fields(body)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(f"stream={stream!r} must be true or false")
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text == has_ids:
        raise BadRequest("give exactly one of `text` or `input_ids`")
    texts, ids, batched = prompt_lists(body["text"], None) if has_text else prompt_lists(None, body["input_ids"])
    params = _sampling_params(body.get("sampling_params"), len(texts), batched)
    rids = _rids(body.get("rid"), len(texts), batched)
    if batched and stream:
        raise BadRequest("streaming a batch of prompts is not supported; send them as separate requests")
    prompts = [PromptSpec(t, i, p, r) for t, i, p, r in zip(texts, ids, params, rids, strict=True)]
    return GenerateInput(prompts=prompts, stream=stream, batched=batched)


def _is_off(value: Any) -> bool:
    if isinstance(value, list):
        return all(v is None or v is False for v in value)
    return value is None or value is False


def _check_off_fields(body: dict[str, Any]) -> None:
    for key, why in OFF_ONLY_FIELDS.items():
        if not _is_off(body.get(key)):
            raise BadRequest(
                f"{key}={body[key]!r}"[:200] + f" is not supported: the embedded server {why}; "
                f"leave it out or send null/false"
            )
    for key in INT_OR_LIST_FIELDS:
        value = body.get(key)
        if (
            value is not None
            and not _is_int(value)
            and not (isinstance(value, list) and all(_is_int(v) for v in value))
        ):
            raise BadRequest(f"{key}={value!r} must be an integer or a list of integers")
    if body.get("token_ids_logprob") is not None and not isinstance(body["token_ids_logprob"], list):
        raise BadRequest(f"token_ids_logprob={body['token_ids_logprob']!r} must be a list of token ids")


def prompt_lists(text: Any, input_ids: Any) -> tuple[list, list, bool]:
    """([text or None], [ids or None], batched) for a single prompt or a list of prompts."""
    if text is not None:
        if isinstance(text, str):
            return [text], [None], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return text, [None] * len(text), True
        raise BadRequest("text must be a string or a non-empty list of strings")
    if input_ids == []:
        raise BadRequest("input_ids cannot be empty")  # (SGLang's words)
    if isinstance(input_ids, list) and all(_is_int(t) for t in input_ids):
        return [None], [input_ids], False
    if (
        isinstance(input_ids, list)
        and input_ids
        and all(isinstance(x, list) and all(_is_int(t) for t in x) for x in input_ids)
    ):
        if empty := [i for i, x in enumerate(input_ids) if not x]:
            raise BadRequest(f"input_ids[{empty[0]}] cannot be empty")
        return [None] * len(input_ids), input_ids, True
    raise BadRequest("input_ids must be a list of integers or a non-empty list of such lists")


def _sampling_params(value: Any, n: int, batched: bool) -> list[SamplingParams]:
    """One SamplingParams per prompt: an object for all, or (batches) a list of n objects."""
    if batched and isinstance(value, list):
        if len(value) != n:
            raise BadRequest(
                f"sampling_params is a list of {len(value)}; give one object per prompt ({n}) "
                f"or a single object for all"
            )
        return [SamplingParams.from_json(v) for v in value]
    return [SamplingParams.from_json(value)] * n


def _rids(rid: Any, n: int, batched: bool) -> list[str | None]:
    """As SGLang: a string rid of a batch becomes '<rid>_<i>'; a list needs one id per prompt."""
    if rid is None:
        return [None] * n
    if isinstance(rid, str):
        return [f"{rid}_{i}" for i in range(n)] if batched else [rid]
    if batched and isinstance(rid, list) and len(rid) == n and all(isinstance(r, str) for r in rid):
        return rid
    raise BadRequest(f"rid={rid!r}"[:200] + f" must be a string (or, for a batch of {n}, a list of {n} strings)")


def check_body(body: Any, allowed: tuple[str, ...]) -> dict:
    """The request body as a dict whose keys are all in `allowed`; BadRequest naming the others."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; supported: {list(allowed)}")
    return body
