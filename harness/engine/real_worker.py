"""Decoding steps of a real model (harness.models.real): the same sampling, verification and random draws
as the synthetic model's worker, over a KV cache per request.

Each request keeps its cache and how many of its tokens (prompt + output) the cache holds (`RealState.fed`).
A step feeds what is not cached yet: the prompt at prefill, else the last emitted token. A speculative step
drafts gamma tokens through the first L layers (each a one-token forward on the shared cache), crops the draft's
entries, scores [last token, d_1..d_gamma] with ONE target forward, verifies with harness.verify (token-wise or
block, dense or sparse, the builder as configured) and crops the cache to the accepted prefix: a rejected suffix
is rolled back, never recomputed. With deterministic inference the model runs request by request (caches of
different lengths are never padded into one batch), so a request's floats never depend on its neighbours: a
seeded request gets the same tokens at any concurrency. Without it, requests whose caches and feeds are as long
as each other share one batched forward (the weights read once for all of them). A failed step is retried from the same cache (it is cropped back to `fed` first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from harness import verify
from harness.engine.request import Request
from harness.engine.worker import BatchInput, StepOutput, Worker, WorkerConfig
from harness.models.real import RealLM


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
        return self._sampling_input(
            requests, windows=[], sequences=[(r.model_state, r.prompt_ids + r.output_ids) for r in requests]
        )

    def _next_logits(self, batch: BatchInput) -> Tensor:
        """Each row's next-token logits after its whole sequence -> [B, V] float32."""
        states, feeds = self._rewound(batch)
        rows = self._forward(states, feeds, last_only=True)
        for state, (_, seq) in zip(states, batch.sequences, strict=True):
            state.fed = len(seq)
        return torch.cat(rows)

    def _rewound(self, batch: BatchInput) -> tuple[list[RealState], list[list[int]]]:
        """Every row's state with its cache rewound (`_rewind`), and what the step feeds it: what it does not hold."""
        states: list[RealState] = []
        for state, seq in batch.sequences:
            self._rewind(state, seq)
            states.append(state)
        return states, [seq[state.fed :] for state, (_, seq) in zip(states, batch.sequences, strict=True)]

    def _rewind(self, state: RealState, seq: list[int]) -> None:
        """Crop the cache to what the step may keep: at most all but the last token (a step retried after a failure
        finds its row's cache as the failed attempt left it, possibly holding the whole sequence)."""
        state.fed = min(state.fed, len(seq) - 1)
        self.real.crop(state.cache, state.fed)

    def _forward(
        self, states: list[RealState], feeds: list[list[int]], layers: int | None = None, last_only: bool = False
    ) -> list[Tensor]:
        """Each row's forward: row by row in deterministic mode (a row's floats never depend on its neighbours),
        else rows of equal lengths batched (RealLM.forward_many)."""
        if self.config.deterministic:
            return [self.real.forward(s.cache, f, layers, last_only) for s, f in zip(states, feeds, strict=True)]
        return self.real.forward_many([s.cache for s in states], feeds, layers, last_only)

    def _speculative(self, batch: BatchInput) -> StepOutput:
        gamma = self.config.gamma
        knobs = self._knobs(batch)
        sampled = self.config.draft_mode == "sampled"
        u = verify.draw_uniforms(batch.generators, gamma, self.device) if sampled else None  # [B, G]
        states, feeds = self._rewound(batch)
        drafts = self._draft_rows(states, feeds, knobs, u)
        for state in states:
            self.real.crop(state.cache, state.fed)  # the draft's own entries past the verified prefix
        target = self._forward(states, [f + d for f, d in zip(feeds, drafts.tokens.tolist(), strict=True)])
        logits = torch.stack([t[-(gamma + 1) :] for t in target])  # [B, G+1, V]: after x_n, d_1, ..., d_G
        out = self._verify(logits, drafts.tokens, drafts.probs, knobs, batch.generators)
        n_acc = out.num_accepted.tolist()
        for (state, seq), n in zip(batch.sequences, n_acc, strict=True):
            state.fed = len(seq) + n  # x_n and the accepted drafts; the bonus token is fed next step
            self.real.crop(state.cache, state.fed)
        tokens = out.tokens.tolist()
        drafted = [int(drafts.tokens.shape[1])] * len(n_acc)  # the draft tokens each row was verified with
        rows = [row[: n + 1] for row, n in zip(tokens, n_acc, strict=True)]
        return StepOutput(tokens=rows, num_accepted=n_acc, num_drafted=drafted)

    def _draft_rows(self, states: list[RealState], feeds: list[list[int]], knobs: Any, u: Tensor | None) -> _Drafts:
        """gamma draft tokens per row [B, G], one draft forward of every row per position through the first L
        layers; their distributions [B, G, V] when sampled (None: point masses)."""
        bsz, gamma = len(states), self.config.gamma
        tokens = torch.empty(bsz, gamma, dtype=torch.int64, device=self.device)
        probs: list[list[Tensor]] = [[] for _ in range(bsz)]
        for i in range(gamma):
            rows = self._forward(states, feeds, layers=self.real.draft_layers, last_only=True)  # B x [1, V]
            for b, logits in enumerate(rows):
                if u is None:
                    tokens[b, i] = logits[0].argmax()
                else:
                    k = knobs.row(b)
                    q = self._builder(logits, k.temperature, k.top_k, k.top_p)  # [1, V]
                    tokens[b, i] = verify.sample_from_probs(q, u[b, i : i + 1])[0]
                    probs[b].append(q[0])
            feeds = [[int(t)] for t in tokens[:, i].tolist()]
        return _Drafts(tokens, torch.stack([torch.stack(p) for p in probs]) if u is not None else None)


@dataclass
class _Drafts:
    tokens: Tensor  # [B, G]
    probs: Tensor | None  # [B, G, V] when sampled


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
