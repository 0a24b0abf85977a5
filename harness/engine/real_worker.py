"""Decoding steps of a real model (harness.engine.real_model): the same sampling, verification and random draws
as the synthetic model's worker, over a KV cache per request.

Each request keeps its cache and how many of its tokens (prompt + output) the cache holds (`RealState.fed`).
A step feeds what is not cached yet: the prompt at prefill, else the last emitted token. A speculative step
drafts gamma tokens through the first L layers (each a one-token forward on the shared cache), crops the draft's
entries, scores [last token, d_1..d_gamma] with ONE target forward, verifies with harness.verify (token-wise or
block, dense or sparse, the builder as configured) and crops the cache to the accepted prefix: a rejected suffix
is rolled back, never recomputed. The model runs request by request (caches of different lengths are not
padded into one batch), so a request's floats never depend on its neighbours: a seeded request gets the same
tokens at any concurrency. A failed step is retried from the same cache (it is cropped back to `fed` first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from harness import verify
from harness.engine.real_model import RealLM
from harness.engine.request import Request
from harness.engine.worker import BatchInput, StepOutput, Worker, WorkerConfig


@dataclass
class RealState:
    """A request's KV cache and the number of its tokens (prompt + output) that the cache holds."""

    cache: Any
    fed: int = 0


class RealWorker(Worker):
    """Prefill and decode steps of a `RealLM` (called from one thread at a time)."""

    def __init__(self, model: RealLM, config: WorkerConfig) -> None:
        super().__init__(cast(Any, model), config)  # the steps below never read a window
        self.real = model

    def batch_input(self, requests: list[Request]) -> BatchInput:
        for r in requests:
            if r.model_state is None:
                r.model_state = RealState(self.real.new_cache())
        return self._sampling_input(requests, windows=[],
                                    sequences=[(r.model_state, r.prompt_ids + r.output_ids) for r in requests])

    def _next_logits(self, batch: BatchInput) -> Tensor:
        """Each row's next-token logits after its whole sequence -> [B, V] float32."""
        rows = []
        for state, seq in batch.sequences:
            self._rewind(state, seq)
            rows.append(self.real.forward(state.cache, seq[state.fed:], last_only=True))
            state.fed = len(seq)
        return torch.cat(rows)

    def _rewind(self, state: RealState, seq: list[int]) -> None:
        """Crop the cache to what the step may keep: at most all but the last token (a step retried after a failure
        finds its row's cache as the failed attempt left it, possibly holding the whole sequence)."""
        state.fed = min(state.fed, len(seq) - 1)
        self.real.crop(state.cache, state.fed)

    def _speculative(self, batch: BatchInput) -> StepOutput:
        bsz, gamma = len(batch), self.config.gamma
        knobs = self._knobs(batch)
        sampled = self.config.draft_mode == "sampled"
        u = verify.draw_uniforms(batch.generators, gamma, self.device) if sampled else None  # [B, G]
        drafts = torch.empty(bsz, gamma, dtype=torch.int64, device=self.device)
        draft_probs: list[Tensor] = []
        target = []
        for b, (state, seq) in enumerate(batch.sequences):
            q = self._draft_row(state, seq, drafts[b], knobs.row(b), None if u is None else u[b])
            if q is not None:
                draft_probs.append(q)
            self.real.crop(state.cache, state.fed)  # the draft's own entries past the verified prefix
            logits = self.real.forward(state.cache, seq[state.fed:] + drafts[b].tolist())
            target.append(logits[-(gamma + 1):])  # [G+1, V]: the positions after x_n, d_1, ..., d_G
        probs = torch.stack(draft_probs) if sampled else None  # [B, G, V]
        out = self._verify(torch.stack(target), drafts, probs, knobs, batch.generators)
        n_acc = out.num_accepted.tolist()
        for (state, seq), n in zip(batch.sequences, n_acc, strict=True):
            state.fed = len(seq) + n  # x_n and the accepted drafts; the bonus token is fed next step
            self.real.crop(state.cache, state.fed)
        tokens = out.tokens.tolist()
        return StepOutput(tokens=[row[:n + 1] for row, n in zip(tokens, n_acc, strict=True)], num_accepted=n_acc)

    def _draft_row(self, state: RealState, seq: list[int], out: Tensor, knobs: Any, u: Tensor | None) -> Tensor | None:
        """gamma draft tokens of one request into out [G], through the first L layers; their distributions
        [G, V] when sampled (None: point masses)."""
        self._rewind(state, seq)
        feed, probs = seq[state.fed:], []
        for i in range(self.config.gamma):
            logits = self.real.forward(state.cache, feed, layers=self.real.draft_layers, last_only=True)  # [1, V]
            if u is None:
                token = logits.argmax(dim=-1)
            else:
                q = self._builder(logits, knobs.temperature, knobs.top_k, knobs.top_p)  # [1, V]
                token = verify.sample_from_probs(q, u[i:i + 1])
                probs.append(q[0])
            out[i] = token[0]
            feed = [int(token[0])]
        return torch.stack(probs) if u is not None else None


def run_alone(worker: Worker, request: Request) -> Request:
    """Serve one request to the end in this process, without the scheduler or HTTP (tools and tests): prefill,
    then decode steps, each step's tokens appended with the request's own stop rules."""
    request.extend(worker.prefill(worker.batch_input([request])).tokens[0])
    while not request.finished:
        out = worker.decode(worker.batch_input([request]))
        if out.num_accepted is not None and request.spec is not None:
            request.spec.record(out.num_accepted[0])
        request.extend(out.tokens[0])
    return request
