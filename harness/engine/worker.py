"""One decoding step over a batch of running requests: the model worker.

`prefill` samples each new request's first token from the target (as SGLang's prefill does). `decode`
is one plain sampling step (NONE), or one speculative step (DFLASH/DSPARK): gamma cheap draft forwards
propose a block, then ONE batched target forward scores all B * (gamma + 1) positions and the verifier
(token-wise or block, `harness.verify`) keeps a prefix and adds one token.

Randomness comes only from each request's own generator, and each request consumes a fixed number of
uniforms per step (prefill 1; plain 1; speculative gamma + 1, plus gamma for sampled drafts), so a
request's draws never depend on its neighbours. With `deterministic`, the probability builders, the
samplers and the verifier also run request by request, so their floating-point reductions have the
same shapes whatever the batch; the model's logits are batch-invariant by construction (exact integer
products). Then a request with a seed gets the same tokens at any concurrency.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from harness import verify
from harness.engine.model import SyntheticLM
from harness.verify import sparse

if TYPE_CHECKING:
    from harness.engine.request import Request


@dataclass(frozen=True)
class WorkerConfig:
    gamma: int  # draft tokens per verify step; 0 = plain decoding
    draft_mode: str  # greedy | sampled
    block_verification: bool
    builder: str  # a name in harness.verify.BUILDERS
    deterministic: bool
    verify_path: str = "dense"  # sparse: the target as each row's top-k entries (harness.verify.sparse)


@dataclass
class BatchInput:
    """What a step needs of each running request (B rows)."""

    windows: list[list[int]]  # [B][C] the last C tokens of each sequence, -1 padded
    temperature: list[float]
    top_k: list[int]
    top_p: list[float]
    min_p: list[float]
    generators: list[torch.Generator]
    sequences: list[tuple[Any, list[int]]] = field(default_factory=list)  # a real model's (state, tokens) per row

    def __len__(self) -> int:
        return len(self.generators)


@dataclass
class StepOutput:
    """Per row: the emitted tokens, and for speculative steps the number of draft tokens proposed and accepted."""

    tokens: list[list[int]]
    num_accepted: list[int] | None
    num_drafted: list[int] | None = None


@dataclass
class _Knobs:
    """The batch's sampling parameters as tensors on the model's device. Each [B]."""

    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    min_p: Tensor

    def repeat(self, n: int) -> _Knobs:
        """Each row repeated n times (for the B * n positions of a verify step)."""
        return _Knobs(*(t.repeat_interleave(n) for t in (self.temperature, self.top_k, self.top_p, self.min_p)))

    def row(self, b: int) -> _Knobs:
        return _Knobs(*(t[b : b + 1] for t in (self.temperature, self.top_k, self.top_p, self.min_p)))


class Worker:
    """Runs prefill and decode steps of a `SyntheticLM` (called from one thread at a time)."""

    def __init__(self, model: SyntheticLM, config: WorkerConfig) -> None:
        self.model = model
        self.config = config
        self.device = model.device
        self._builder = verify.get_builder(config.builder)
        self._verifier: Callable[..., verify.VerifyOutput] = (
            verify.verify_block if config.block_verification else verify.verify_tokenwise
        )
        if config.verify_path not in ("dense", "sparse"):
            raise ValueError(f"verify_path {config.verify_path!r}: use dense or sparse")

    # ------------------------------------------------------------------ public steps

    def batch_input(self, requests: list[Request]) -> BatchInput:
        """What a step over `requests` needs: each one's last C tokens, and its sampling parameters."""
        c = self.model.context_window
        return self._sampling_input(requests, windows=[self.model.windows(r.last_tokens(c)) for r in requests])

    @staticmethod
    def _sampling_input(requests: list[Request], **rows: Any) -> BatchInput:
        return BatchInput(
            temperature=[float(r.params.temperature) for r in requests],
            top_k=[r.params.top_k for r in requests],
            top_p=[float(r.params.top_p) for r in requests],
            min_p=[float(r.params.min_p) for r in requests],
            generators=[r.generator for r in requests],
            **rows,
        )

    @torch.inference_mode()
    def prefill(self, batch: BatchInput) -> StepOutput:
        """Sample the first output token of each new request."""
        tokens = self._plain(batch)
        return StepOutput(tokens=[[t] for t in tokens], num_accepted=None)

    @torch.inference_mode()
    def decode(self, batch: BatchInput) -> StepOutput:
        """One decoding step for every row: plain sampling, or draft + verify."""
        if self.config.gamma == 0:
            return StepOutput(tokens=[[t] for t in self._plain(batch)], num_accepted=None)
        return self._speculative(batch)

    # ------------------------------------------------------------------ plain sampling

    def _plain(self, batch: BatchInput) -> list[int]:
        logits = self._next_logits(batch)  # [B, V]
        knobs = self._knobs(batch)
        u = verify.draw_uniforms(batch.generators, 1, self.device)[:, 0]  # [B]
        return self._rows(lambda lg, k, uu: self._sample(lg, k, uu, with_min_p=True), logits, knobs, u).tolist()

    def _next_logits(self, batch: BatchInput) -> Tensor:
        contexts = torch.tensor(batch.windows, dtype=torch.int64, device=self.device)  # [B, C]
        return self.model.target_logits(contexts)  # [B, V]

    def _sample(self, logits: Tensor, knobs: _Knobs, u: Tensor, with_min_p: bool) -> Tensor:
        """Inverse-CDF sample of builder(logits) [n, V] with u [n] -> [n] int64 (min_p as in SGLang)."""
        probs = self._builder(logits, knobs.temperature, knobs.top_k, knobs.top_p)  # [n, V]
        if with_min_p and bool((knobs.min_p > 0).any()):
            floor = knobs.min_p.unsqueeze(-1) * probs.max(dim=-1, keepdim=True).values  # [n, 1]
            probs = probs.masked_fill(probs < floor, 0.0)
        return verify.sample_from_probs(probs, u)

    # ------------------------------------------------------------------ speculative step

    def _speculative(self, batch: BatchInput) -> StepOutput:
        bsz, gamma, c = len(batch), self.config.gamma, self.model.context_window
        knobs = self._knobs(batch)
        ext = torch.empty(bsz, c + gamma, dtype=torch.int64, device=self.device)  # window + drafts
        ext[:, :c] = torch.tensor(batch.windows, dtype=torch.int64, device=self.device)
        draft_probs = self._draft(ext, knobs, batch.generators)  # [B, G, V] or None
        contexts = ext.unfold(1, c, 1).reshape(bsz * (gamma + 1), c)  # [B*(G+1), C], position j sees x_1..x_j
        logits = self.model.target_logits(contexts)  # [B*(G+1), V]: one batched target forward
        out = self._verify(logits.view(bsz, gamma + 1, -1), ext[:, c:], draft_probs, knobs, batch.generators)
        n_acc = out.num_accepted.tolist()
        tokens = out.tokens.tolist()
        drafted = [int(ext.shape[1]) - c] * bsz  # the draft tokens each row was verified with
        rows = [row[: n + 1] for row, n in zip(tokens, n_acc, strict=True)]
        return StepOutput(tokens=rows, num_accepted=n_acc, num_drafted=drafted)

    def _draft(self, ext: Tensor, knobs: _Knobs, generators: list[torch.Generator]) -> Tensor | None:
        """Fill ext[:, C:] with gamma draft tokens; return their distributions [B, G, V] if sampled."""
        c, gamma = self.model.context_window, self.config.gamma
        sampled = self.config.draft_mode == "sampled"
        u = verify.draw_uniforms(generators, gamma, self.device) if sampled else None  # [B, G]
        probs = []
        for i in range(gamma):
            logits = self.model.draft_logits(ext[:, i : i + c])  # [B, V]
            if u is None:  # not sampled
                ext[:, c + i] = logits.argmax(dim=-1)  # a point mass: the verifier gets q = None
                continue
            q = self._rows(lambda lg, k: self._builder(lg, k.temperature, k.top_k, k.top_p), logits, knobs)
            ext[:, c + i] = self._rows(verify.sample_from_probs, q, u[:, i])
            probs.append(q)
        return torch.stack(probs, dim=1) if sampled else None  # [B, G, V]

    def _verify(
        self,
        logits: Tensor,
        drafts: Tensor,
        draft_probs: Tensor | None,
        knobs: _Knobs,
        generators: list[torch.Generator],
    ) -> verify.VerifyOutput:
        """logits [B, G+1, V], drafts [B, G], draft_probs [B, G, V] | None -> the verifier's output."""
        bsz, positions, vocab = logits.shape

        def one(lg: Tensor, k: _Knobs, d: Tensor, q: Tensor | None, gens: list[torch.Generator]):
            n = lg.shape[0]
            kk = k.repeat(positions)
            rows = lg.reshape(n * positions, vocab)
            if self.config.verify_path == "sparse":  # [n * positions, K] entries, never a dense [rows, V]
                return sparse.verify_step(
                    rows,
                    kk.temperature,
                    kk.top_k,
                    kk.top_p,
                    d,
                    q,
                    generators=gens,
                    block=self.config.block_verification,
                    fused=self.config.builder == "topk_fused",
                )
            target = self._builder(rows, kk.temperature, kk.top_k, kk.top_p)
            return self._verifier(target.view(n, positions, vocab), d, q, generators=gens)

        if not self.config.deterministic:
            return one(logits, knobs, drafts, draft_probs, generators)
        outs = [
            one(
                logits[b : b + 1],
                knobs.row(b),
                drafts[b : b + 1],
                None if draft_probs is None else draft_probs[b : b + 1],
                generators[b : b + 1],
            )
            for b in range(bsz)
        ]
        return verify.VerifyOutput(
            num_accepted=torch.cat([o.num_accepted for o in outs]), tokens=torch.cat([o.tokens for o in outs])
        )

    # ------------------------------------------------------------------ helpers

    def _knobs(self, batch: BatchInput) -> _Knobs:
        def t(values: list, dtype: torch.dtype) -> Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        return _Knobs(
            t(batch.temperature, torch.float32),
            t(batch.top_k, torch.int64),
            t(batch.top_p, torch.float32),
            t(batch.min_p, torch.float32),
        )

    def _rows(self, fn: Callable[..., Tensor], x: Tensor, *rest) -> Tensor:
        """fn over the whole batch, or row by row (then concatenated) in deterministic mode.

        x: [B, ...]; rest: tensors [B, ...] or _Knobs, sliced alongside x.
        """
        if not self.config.deterministic:
            return fn(x, *rest)
        parts = [
            fn(x[b : b + 1], *(r.row(b) if isinstance(r, _Knobs) else r[b : b + 1] for r in rest))
            for b in range(x.shape[0])
        ]
        return torch.cat(parts)
