"""The per-row rules every verify-probability builder applies, in one leaf (torch only): which rows are
greedy, what top_k means, the per-row parameter tensors, and the top-p rule. The Triton kernels of
`topk_fused` follow the same rules (their greedy threshold is this module's constant)."""

from __future__ import annotations

import torch
from torch import Tensor

GREEDY_TEMPERATURE = 1e-6  # SGLang: a temperature strictly below this means greedy


def greedy_rows(temperature: Tensor, top_k: Tensor) -> Tensor:
    """Greedy rows: temperature strictly below 1e-6 (SGLang's `0 <= temperature < 1e-6`), or top_k 1."""
    return (temperature < GREEDY_TEMPERATURE) | (top_k == 1)


def effective_top_k(top_k: Tensor, vocab: int) -> Tensor:
    """top_k <= 0 (SGLang's -1) or >= V means the whole vocabulary."""
    return torch.where((top_k <= 0) | (top_k >= vocab), torch.full_like(top_k, vocab), top_k)


def row_params(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The per-row parameters as the builders use them: [rows] each, contiguous, on the logits' device;
    temperature and top_p fp32, top_k int64."""
    n, device = logits.shape[0], logits.device
    return (
        _as_rows("temperature", temperature, n, device, torch.float32),
        _as_rows("top_k", top_k, n, device, torch.int64),
        _as_rows("top_p", top_p, n, device, torch.float32),
    )


def _as_rows(name: str, x: Tensor | float | list, n: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """x as [n] contiguous `dtype` on `device`; x itself when it already is (checked first: a builder's call
    waits for this on the host, and .to() costs several microseconds even when it changes nothing). A number is
    every row's; ValueError when x holds another count of values than the n rows."""
    if not isinstance(x, Tensor):
        x = torch.as_tensor(x, dtype=dtype)
        x = x.expand(n) if x.dim() == 0 else x
    if x.dtype == dtype and x.dim() == 1 and x.shape[0] == n and x.device == device and x.is_contiguous():
        return x
    if x.numel() != n:
        raise ValueError(f"{name} has {x.numel()} value(s) for {n} rows of logits: give one per row (or a number)")
    return x.to(device=device, dtype=dtype).reshape(n).contiguous()


def top_p_renorm_sorted(probs: Tensor, top_p: Tensor) -> Tensor:
    """Keep the smallest set of most probable tokens whose mass reaches top_p, renormalise.

    probs: [rows, k] sorted descending along the last dim; top_p: [rows]. Returns [rows, k] fp32.
    The threshold is the probability of the token at which the descending mass reaches top_p (the
    last one whose mass before it is below top_p); every token at least that probable is kept, so
    tokens of equal probability are kept or dropped together, whatever their order. This is the rule
    of FlashInfer's top_p_renorm_probs, SGLang's CUDA path; SGLang's CPU fallback drops by position
    the tokens whose mass before them is > top_p. Rows with top_p >= 1 come back untouched, not
    divided by their own sum: as SGLang, which renormalises nothing when no row of the batch uses
    top-p, and so that a row never depends on the other rows of its batch.
    """
    active = (top_p < 1.0).unsqueeze(-1)  # [rows, 1]
    below = torch.cumsum(probs, dim=-1) - probs < top_p.unsqueeze(-1)  # mass before the token < top_p
    threshold = probs.masked_fill(~below, float("inf")).amin(dim=-1, keepdim=True)  # [rows, 1]
    kept = probs.masked_fill((probs < threshold) & active, 0.0)
    return torch.where(active, kept / kept.sum(dim=-1, keepdim=True), probs)
