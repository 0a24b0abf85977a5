"""What the client sends and what it saw: one request of a run (RequestPlan), the JSON bodies of the two
routes (SGLang's native `/generate`, the OpenAI chat route), and what came back of it (Outcome)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.client.config import ClientConfig, SamplingConfig
from harness.server.redact import clip
from workloads.base import Item


@dataclass
class RequestPlan:
    """One request of a run: the item, its seed, whether it is a warmup, its token cap."""

    item: Item
    request_seed: int | None
    warmup: bool
    max_new_tokens: int


@dataclass
class Outcome:
    """What the client saw of one request (turned into a record by the runner).

    `chunk_times`: the monotonic time at which the network piece holding each event that carried new output
    (text or tokens) was read, before parsing; `chunk_tokens`: the tokens each of those events added
    (the increase of the cumulative completion_tokens), None when the route does not report them per chunk.
    """

    t_scheduled: float
    t_sent: float | None = None
    t_first_token: float | None = None
    t_end: float | None = None
    n_chunks: int = 0
    text: str = ""
    output_ids: list[int] | None = None  # the response's token ids, where the route returns them
    meta_info: dict[str, Any] | None = None
    error: str | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def token_ids(value: Any) -> list[int] | None:
    """A response's `output_ids` as a list of token ids, or None when it sent none (or something else)."""
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return value
    return None


class StreamError(Exception):
    """Something in a response that makes this one request an error (never the run)."""


# the meta_info counts a record copies (harness.runner.records): each a non-negative integer or absent/null
COUNT_KEYS = ("prompt_tokens", "completion_tokens", "spec_verify_ct", "spec_num_correct_drafts")


def meta_problem(meta: Any) -> str | None:
    """Why a final meta_info cannot be recorded as it is (its request then fails alone), or None.
    The server's own fields are kept verbatim in the record; those the record reads must be what they say."""
    if not isinstance(meta, dict):
        return f"the final meta_info is a {type(meta).__name__}, not an object: {clip(str(meta), 200)}"
    for key in COUNT_KEYS:
        value = meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return f"malformed meta_info: {key} is {value!r} ({type(value).__name__}), not a non-negative integer"
    return None


def sampling_params(sampling: SamplingConfig, request: RequestPlan) -> dict[str, Any]:
    """SGLang's `sampling_params` for one request."""
    params: dict[str, Any] = {
        "max_new_tokens": request.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_p": sampling.min_p,
        "ignore_eos": sampling.ignore_eos,
    }
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if request.request_seed is not None:
        params["sampling_seed"] = request.request_seed
    return params


def generate_payload(sampling: SamplingConfig, client: ClientConfig, request: RequestPlan) -> dict[str, Any]:
    return {"text": request.item.prompt, "sampling_params": sampling_params(sampling, request), "stream": client.stream}


def chat_payload(sampling: SamplingConfig, client: ClientConfig, request: RequestPlan, model: str) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model,
        "messages": request.item.messages,
        "max_tokens": request.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_p": sampling.min_p,
        "ignore_eos": sampling.ignore_eos,
        "stream": client.stream,
        "return_spec_tokens_details": True,
    }
    if client.stream:  # continuous_usage_stats: every content chunk carries the cumulative usage (SGLang)
        payload["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if sampling.stop:
        payload["stop"] = list(sampling.stop)
    if request.request_seed is not None:
        payload["seed"] = request.request_seed
    if client.chat_template_kwargs:
        payload["chat_template_kwargs"] = dict(client.chat_template_kwargs)
    return payload
