"""Validation of `/generate` bodies and `sampling_params` (SGLang names; 400 on anything wrong)."""

from __future__ import annotations

import pytest

from harness.engine.params import BadRequest, SamplingParams, parse_generate


def test_defaults_and_full_params() -> None:
    assert SamplingParams.from_json(None) == SamplingParams()
    p = SamplingParams.from_json({"max_new_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 3, "min_p": 0.1,
                                  "stop": "x", "stop_token_ids": [4], "ignore_eos": True, "sampling_seed": 9, "n": 1})
    assert (p.max_new_tokens, p.stop, p.stop_token_ids, p.sampling_seed) == (7, ("x",), (4,), 9)


@pytest.mark.parametrize("params, message", [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"sampling_seed": "1"}, "sampling_seed"),
    ({"n": 2}, "n=2"),
    ({"stop": [""]}, "stop"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"frequency_penalty": 0.5}, "unknown sampling_params"),
    ("fast", "must be an object"),
])
def test_bad_sampling_params(params, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        SamplingParams.from_json(params)


def test_single_and_batched_prompts() -> None:
    single = parse_generate({"text": "hi", "sampling_params": {"max_new_tokens": 3}, "stream": True, "rid": "a"})
    assert not single.batched and single.stream and single.prompts[0].text == "hi" and single.prompts[0].rid == "a"
    batch = parse_generate({"input_ids": [[1, 2], [3]], "rid": ["a", "b"]})
    assert batch.batched and [p.input_ids for p in batch.prompts] == [[1, 2], [3]]


@pytest.mark.parametrize("body, message", [
    ({}, "exactly one"),
    ({"text": "a", "input_ids": [1]}, "exactly one"),
    ({"text": 3}, "text must be"),
    ({"input_ids": [1, "2"]}, "input_ids must be"),
    ({"text": ["a", "b"], "stream": True}, "streaming a batch"),
    ({"text": "a", "stream": "yes"}, "stream="),
    ({"text": "a", "return_logprob": True}, "not supported"),
    ({"text": "a", "lora_path": "x"}, "unknown field"),
    ({"text": ["a", "b"], "rid": "one"}, "rid"),
    ([1, 2], "JSON object"),
])
def test_bad_bodies(body, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_generate(body)
