"""The state of one generation request: its tokens, stop conditions, counters and `meta_info`.

Lives on the event loop; the scheduler appends each step's tokens with `extend`, which applies the
stop conditions token by token in SGLang's order (length, then EOS / stop token ids, then stop strings).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.engine.params import SamplingParams
from harness.engine.tokenizer import TextDecoder, TextTokenizer


@dataclass
class SpecCounters:
    """Per-request speculative statistics (SGLang's `spec_*` fields)."""

    gamma: int
    verify_ct: int = 0
    num_correct: int = 0
    histogram: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.histogram = [0] * (self.gamma + 1)

    def record(self, num_accepted: int) -> None:
        self.verify_ct += 1
        self.num_correct += num_accepted
        self.histogram[num_accepted] += 1

    def fields(self, completion_tokens: int) -> dict[str, Any]:
        proposed = self.verify_ct * self.gamma
        return {
            "spec_verify_ct": self.verify_ct,
            "spec_accept_length": completion_tokens / self.verify_ct if self.verify_ct else 0.0,
            "spec_num_correct_drafts": self.num_correct,
            "spec_num_proposed_drafts": proposed,
            "spec_accept_rate": self.num_correct / proposed if proposed else 0.0,
            "spec_correct_drafts_histogram": list(self.histogram),
        }


@dataclass
class Output:
    """A snapshot sent to the request's handler: after a step, or the final one."""

    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]
    finished: bool


@dataclass(eq=False)
class Request:
    """One prompt being served. Created by the HTTP layer, driven by the scheduler."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    tokenizer: TextTokenizer
    spec: SpecCounters | None  # None without a speculative algorithm
    stream: bool
    enable_metrics: bool = False
    health_check: bool = False  # /health_generate's own probe
    model_state: Any = None  # a real model's KV cache (harness.engine.real_worker.RealState)
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    aborted: bool = False
    t_received: float = field(default_factory=time.time)
    t_scheduled: float | None = None
    t_finished: float | None = None
    events: asyncio.Queue[Output] = field(default_factory=asyncio.Queue)
    _decoder: TextDecoder = field(init=False)  # set in __post_init__
    _final_text: str | None = None  # set when a stop string trims the text

    def __post_init__(self) -> None:
        self._decoder = self.tokenizer.stream_decoder()
        self._max_stop = max((len(s) for s in self.params.stop), default=0)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def last_tokens(self, n: int) -> list[int]:
        """The last n tokens of prompt + output (fewer if the sequence is shorter)."""
        out = self.output_ids
        if len(out) >= n:
            return out[-n:]
        return self.prompt_ids[max(0, len(self.prompt_ids) - (n - len(out))) :] + out

    # ------------------------------------------------------------------ appending tokens

    def extend(self, tokens: list[int]) -> None:
        """Append a step's tokens one by one, stopping at the first finish condition."""
        for token in tokens:
            if self.finished:
                return
            self.output_ids.append(token)
            self._decoder.feed_one(token)
            self._check_stop(token)

    def finish_now(self, reason: dict[str, Any]) -> None:
        """Finish without more tokens (max_new_tokens=0, abort, shutdown)."""
        if not self.finished:
            self.finish_reason = reason
            self.t_finished = time.time()

    def _check_stop(self, token: int) -> None:
        p = self.params
        if len(self.output_ids) >= p.max_new_tokens:
            self.finish_now({"type": "length", "length": p.max_new_tokens})
        elif token in self.tokenizer.eos_ids and not p.ignore_eos:
            self.finish_now({"type": "stop", "matched": token})
        elif token in p.stop_token_ids:
            self.finish_now({"type": "stop", "matched": token})
        elif p.stop:
            self._check_stop_strings()

    def _check_stop_strings(self) -> None:
        tail = self._decoder.tail_text(4 * self._max_stop + 8)
        for stop in self.params.stop:
            if stop in tail:
                text = self._decoder.text()
                self._final_text = text[: text.find(stop)]
                self.finish_now({"type": "stop", "matched": stop})
                return

    # ------------------------------------------------------------------ outputs

    def text(self) -> str:
        return self._final_text if self._final_text is not None else self._decoder.text()

    def meta_info(self) -> dict[str, Any]:
        """SGLang's `meta_info`; the spec fields and latency only once finished."""
        info: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": len(self.output_ids),
            "cached_tokens": 0,
            "reasoning_tokens": 0,
        }
        if not self.finished:
            return info
        assert self.t_finished is not None  # finish_now sets it with finish_reason
        info["e2e_latency"] = self.t_finished - self.t_received
        if self.spec is not None:
            info.update(self.spec.fields(len(self.output_ids)))
        if self.enable_metrics:
            scheduled = self.t_scheduled if self.t_scheduled is not None else self.t_finished
            info.update(
                {
                    "queue_time": scheduled - self.t_received,
                    "request_received_ts": self.t_received,
                    "request_finished_ts": self.t_finished,
                }
            )
        return info

    def snapshot(self) -> Output:
        return Output(
            text=self.text(), output_ids=list(self.output_ids), meta_info=self.meta_info(), finished=self.finished
        )

    def publish(self) -> None:
        """Send a snapshot to the handler: every step when streaming, else only the final one."""
        if self.stream or self.finished:
            self.events.put_nowait(self.snapshot())
