"""Validation of `/generate` bodies and `sampling_params` (SGLang names; 400 on anything wrong)."""

from __future__ import annotations

import pytest

from harness.engine.openai_api import COMPLETION_MAX_TOKENS, parse_chat, parse_completion
from harness.engine.params import BadRequest, SamplingParams, parse_generate
from harness.engine.tokenizer import render_chat

# What SGLang 0.5.23's own benchmark client (sglang.benchmark.serving, backend sglang) sends.
BENCH_CLIENT_BODY = {
    "text": "hi",
    "sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True},
    "stream": True,
    "lora_path": None,
    "return_logprob": False,
    "return_routed_experts": False,
    "logprob_start_len": -1,
}


def test_defaults_and_full_params() -> None:
    assert SamplingParams.from_json(None) == SamplingParams()
    p = SamplingParams.from_json(
        {
            "max_new_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "min_p": 0.1,
            "stop": "x",
            "stop_token_ids": [4],
            "ignore_eos": True,
            "sampling_seed": 9,
            "n": 1,
        }
    )
    assert (p.max_new_tokens, p.stop, p.stop_token_ids, p.sampling_seed) == (7, ("x",), (4,), 9)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 1e-300}, "top_p=1e-300 is 0 as a float32"),
        ({"top_k": 0}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"sampling_seed": "1"}, "sampling_seed"),
        ({"n": 2}, "n=2"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": ["a"]}, "stop_token_ids"),
        ({"frequency_penalty": 0.5}, "frequency_penalty=0.5 is not supported"),
        ({"repetition_penalty": 1.2}, "repetition_penalty=1.2 is not supported"),
        ({"json_schema": "{}"}, "json_schema='{}' is not supported"),
        ({"no_stop_trim": True}, "no_stop_trim=True is not supported"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
        ({"stream_interval": 0}, "stream_interval"),
        ({"max_tokens": 3}, "unknown sampling_params key"),
        ("fast", "must be an object"),
    ],
)
def test_bad_sampling_params(params, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        SamplingParams.from_json(params)


def test_sglang_sampling_keys_at_their_neutral_values_are_accepted() -> None:
    neutral = {
        "frequency_penalty": 0.0,
        "presence_penalty": 0,
        "repetition_penalty": 1.0,
        "min_new_tokens": 0,
        "no_stop_trim": False,
        "logit_bias": {},
        "json_schema": None,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": True,
        "stream_interval": 4,
    }
    assert SamplingParams.from_json({**neutral, "max_new_tokens": 5}) == SamplingParams(max_new_tokens=5)


def test_single_and_batched_prompts() -> None:
    single = parse_generate({"text": "hi", "sampling_params": {"max_new_tokens": 3}, "stream": True, "rid": "a"})
    assert not single.batched and single.stream and single.prompts[0].text == "hi" and single.prompts[0].rid == "a"
    batch = parse_generate({"input_ids": [[1, 2], [3]], "rid": ["a", "b"]})
    assert batch.batched and [p.input_ids for p in batch.prompts] == [[1, 2], [3]]


@pytest.mark.parametrize(
    "body, message",
    [
        ({}, "exactly one"),
        ({"text": "a", "input_ids": [1]}, "exactly one"),
        ({"text": 3}, "text must be"),
        ({"input_ids": [1, "2"]}, "input_ids must be"),
        ({"input_ids": []}, "input_ids cannot be empty"),  # SGLang's 400
        ({"input_ids": [[1, 2], []]}, r"input_ids\[1\] cannot be empty"),
        ({"text": ["a", "b"], "stream": True}, "streaming a batch"),
        ({"text": "a", "stream": "yes"}, "stream="),
        ({"text": "a", "return_logprob": True}, "return_logprob=True is not supported"),
        ({"text": ["a", "b"], "return_logprob": [False, True]}, "return_logprob"),
        ({"text": "a", "lora_path": "x"}, "LoRA"),
        ({"text": "a", "image_data": "x.png"}, "text-only"),
        ({"text": "a", "return_hidden_states": True}, "hidden states"),
        ({"text": "a", "logprob_start_len": "x"}, "logprob_start_len='x' must be an integer"),
        ({"text": ["a", "b"], "rid": ["one"]}, "rid"),
        ({"text": "a", "rid": 5}, "rid"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "one object per prompt"),
        ({"text": "a", "sampling_params": {"temperature": -1}}, "temperature"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_bodies(body, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_generate(body)


def test_sglang_bench_client_body_and_unknown_top_level_keys_are_accepted() -> None:
    """SGLang's /generate ignores top-level keys it does not know; the off-valued extras are accepted."""
    parsed = parse_generate({**BENCH_CLIENT_BODY, "session_id": "s", "priority": 3, "no_such_key": [1]})
    assert parsed.stream and parsed.prompts[0].params == SamplingParams(
        temperature=0.0, max_new_tokens=8, ignore_eos=True
    )
    batch = parse_generate({"text": ["a", "b"], "return_logprob": [False, False], "lora_path": [None, None]})
    assert len(batch.prompts) == 2


def test_batch_rids_and_per_prompt_sampling_params() -> None:
    batch = parse_generate(
        {"text": ["a", "b"], "rid": "job", "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}]}
    )
    assert [p.rid for p in batch.prompts] == ["job_0", "job_1"]  # SGLang's expansion of a string rid
    assert [p.params.max_new_tokens for p in batch.prompts] == [1, 2]


# ---------------------------------------------------------------------- OpenAI bodies


def test_completion_prompts_of_every_shape() -> None:
    text = parse_completion({"prompt": "hi", "max_tokens": 5, "seed": 3, "top_k": 2, "stream": True})
    assert not text.batched and text.options.stream and text.prompts[0].text == "hi"
    assert (text.prompts[0].params.max_new_tokens, text.prompts[0].params.sampling_seed) == (5, 3)
    assert parse_completion({"prompt": ["a", "b"]}).prompts[1].text == "b"
    assert parse_completion({"prompt": [1, 2, 3]}).prompts[0].input_ids == [1, 2, 3]
    ids = parse_completion({"prompt": [[1], [2, 3]], "rid": "r"})
    assert ids.batched and [p.rid for p in ids.prompts] == ["r_0", "r_1"]
    assert parse_completion({"prompt": "x"}).prompts[0].params.max_new_tokens == COMPLETION_MAX_TOKENS


def test_sglang_bench_client_completion_body_is_accepted() -> None:
    body = {
        "model": "embedded:mini",
        "prompt": "hi",
        "best_of": 1,
        "max_tokens": 8,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    assert parse_completion(body).prompts[0].params.ignore_eos


@pytest.mark.parametrize(
    "body, message",
    [
        ({"prompt": ""}, "prompt cannot be empty"),
        ({"prompt": []}, "prompt cannot be empty"),
        ({"prompt": [1, "a"]}, "prompt must be"),
        ({"prompt": [[1, 2], []]}, r"prompt\[1\] cannot be empty"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens=0 must be a positive integer"),
        ({"prompt": "a", "echo": True}, "echo=True is not supported"),
        ({"prompt": "a", "best_of": 2}, "best_of=2 is not supported"),
        ({"prompt": "a", "logprobs": 1}, "logprobs=1 is not supported"),
        ({"prompt": "a", "n": 2}, "n=2"),
        ({"prompt": "a", "top_p": 0}, "top_p"),
        ({"prompt": "a", "stream": "yes"}, "stream="),
        ({"prompt": ["a", "b"], "stream": True}, "streaming a list of prompts"),
        ({"prompt": "a", "no_such_key": 1}, "unknown field"),
    ],
)
def test_bad_completion_bodies(body, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_completion(body)


def test_chat_body_fields() -> None:
    chat = parse_chat(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "seed": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_spec_tokens_details": True,
        }
    )
    assert render_chat(chat.messages) == "<|user|>\nhi\n<|assistant|>\n" and chat.params.sampling_seed == 4
    assert chat.options.stream and chat.options.include_usage and chat.options.spec_details
    assert not chat.max_tokens_given
    with pytest.raises(BadRequest, match="frequency_penalty=0.5 is not supported"):
        parse_chat({"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 0.5})
