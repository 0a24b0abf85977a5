"""Per-request state: stop conditions in SGLang's order, text trimming, and the meta_info fields."""

from __future__ import annotations

import torch

from harness.engine.params import SamplingParams
from harness.engine.request import Request, SpecCounters
from harness.engine.tokenizer import EOS_ID, Tokenizer

TOK = Tokenizer(2048)


def make(params: SamplingParams, gamma: int = 0) -> Request:
    return Request(
        rid="r",
        prompt_ids=TOK.encode("prompt"),
        params=params,
        generator=torch.Generator(),
        tokenizer=TOK,
        spec=SpecCounters(gamma) if gamma else None,
        stream=True,
    )


def test_length_cap_truncates_a_step_and_wins_over_eos() -> None:
    r = make(SamplingParams(max_new_tokens=3))
    r.extend([300, 301, EOS_ID, 302])
    assert r.output_ids == [300, 301, EOS_ID]
    assert r.finish_reason == {"type": "length", "length": 3}


def test_eos_stops_unless_ignored() -> None:
    r = make(SamplingParams(max_new_tokens=10))
    r.extend([300, EOS_ID, 301])
    assert r.output_ids == [300, EOS_ID] and r.finish_reason == {"type": "stop", "matched": EOS_ID}
    r = make(SamplingParams(max_new_tokens=10, ignore_eos=True))
    r.extend([300, EOS_ID, 301])
    assert r.output_ids == [300, EOS_ID, 301] and not r.finished


def test_stop_token_ids() -> None:
    r = make(SamplingParams(max_new_tokens=10, stop_token_ids=(301,), ignore_eos=True))
    r.extend([300, 301, 302])
    assert r.output_ids == [300, 301] and r.finish_reason == {"type": "stop", "matched": 301}


def test_stop_string_trims_text_but_keeps_the_tokens() -> None:
    ids = TOK.encode(" ka to mi ba")
    r = make(SamplingParams(max_new_tokens=50, stop=("o m",)))
    r.extend(ids)
    assert r.finish_reason == {"type": "stop", "matched": "o m"}
    assert r.text() == " ka t"
    assert TOK.decode(r.output_ids).startswith(" ka to mi")  # the token completing the stop is kept
    assert len(r.output_ids) == 3


def test_stop_string_spanning_byte_tokens() -> None:
    r = make(SamplingParams(max_new_tokens=50, stop=("é!",)))
    r.extend(TOK.encode("abc é! more"))
    assert r.text() == "abc " and r.finish_reason["matched"] == "é!"


def test_meta_info_spec_fields() -> None:
    r = make(SamplingParams(max_new_tokens=6), gamma=3)
    r.extend([300])  # the prefill token
    for accepted, tokens in [(3, [1, 2, 3, 4]), (0, [5])]:
        r.spec.record(accepted)
        r.extend([t + 300 for t in tokens])
    meta = r.meta_info()
    assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] == len(TOK.encode("prompt"))
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["spec_verify_ct"] == 2 and meta["spec_accept_length"] == 3.0
    assert meta["spec_num_correct_drafts"] == 3 and meta["spec_num_proposed_drafts"] == 6
    assert meta["spec_accept_rate"] == 0.5 and meta["spec_correct_drafts_histogram"] == [1, 0, 0, 1]
    assert meta["e2e_latency"] >= 0


def test_unfinished_meta_info_has_no_final_fields() -> None:
    r = make(SamplingParams(max_new_tokens=6), gamma=3)
    r.extend([300])
    meta = r.meta_info()
    assert meta["finish_reason"] is None and "spec_verify_ct" not in meta and "e2e_latency" not in meta


def test_last_tokens_spans_prompt_and_output() -> None:
    r = make(SamplingParams(max_new_tokens=6))
    r.prompt_ids = [1, 2, 3]
    r.extend([4, 5])
    assert r.last_tokens(4) == [2, 3, 4, 5] and r.last_tokens(10) == [1, 2, 3, 4, 5]
