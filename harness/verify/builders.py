"""The verify-probability builders: target logits -> the distribution that sampled drafts are verified
against (temperature, then top-k, then top-p; min_p is not applied on this path, as in SGLang).

- `full_vocab` ("before"): divide the whole [rows, V] matrix by the temperature, then top-k.
- `topk_first` ("after"): top-k on the raw logits (radix top-k), then divide only the k values.
- `topk_first_torch`: "after" with torch.topk forced.
- `topk_fused`: one read of the logits, one write of the output (the Triton kernels of `topk_fused`).
Dividing by a positive temperature keeps the order, so the first three give bitwise the same probabilities
(ties aside: which of several tied logits is kept may differ, the values may not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.verify.checks import check_logits
from harness.verify.rows import effective_top_k, greedy_rows, row_params, top_p_renorm_sorted
from harness.verify.topk import TopkFn, radix_topk, torch_topk

BuilderFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def _topk_probs(vals: Tensor, k_eff: Tensor, top_p: Tensor) -> Tensor:
    """Mask ranks >= top_k, softmax, top-p. vals: [n, kmax] fp32 sorted descending (already divided by the
    temperature) -> [n, kmax] fp32 probabilities, in the same order."""
    ranks = torch.arange(vals.shape[-1], device=vals.device)
    vals = vals.masked_fill(ranks.unsqueeze(0) >= k_eff.unsqueeze(-1), float("-inf"))
    return top_p_renorm_sorted(torch.softmax(vals, dim=-1), top_p)


def _dense_probs(scaled: Tensor, top_p: Tensor) -> Tensor:
    """Rows whose top-k covers the vocabulary: softmax then top-p (top-k renorm is the identity).

    scaled: [rows, V] fp32 already divided by the temperature.
    """
    probs = torch.softmax(scaled, dim=-1)
    if not bool((top_p < 1.0).any()):
        return probs
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    return torch.empty_like(probs).scatter_(1, order, top_p_renorm_sorted(sorted_probs, top_p))


def _subset(x: Tensor, rows: Tensor, n_total: int) -> Tensor:
    """x[rows] without a copy when `rows` is every row."""
    return x if rows.numel() == n_total else x[rows]


@dataclass
class RowGroup:
    """Rows of a batch built the same way: `rows` (None: every row of the batch), their probabilities
    `probs` [len, width] and the token ids they belong to, `ids` [len, width] (None: the whole vocabulary,
    in id order)."""

    rows: Tensor | None
    probs: Tensor
    ids: Tensor | None


def row_groups(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, topk_fn: TopkFn, scale_first: bool
) -> Iterator[RowGroup]:
    """What every builder computes, before it is laid out: greedy rows (one token, probability 1), rows whose
    top-k covers the vocabulary (dense), and the others (their kmax largest logits, kmax = the group's
    largest top_k). Only where the temperature is applied differs (scale_first: before the top-k, on an
    fp32 temporary of the full [rows, V] size; else on the k values of each row). temperature, top_k,
    top_p: [rows], as row_params gives them."""
    n, vocab = logits.shape
    greedy = greedy_rows(temperature, top_k)
    k_eff = effective_top_k(top_k, vocab)
    dense = ~greedy & (k_eff >= vocab)
    sparse = ~greedy & (k_eff < vocab)
    if bool(greedy.any()):
        g = greedy.nonzero().squeeze(-1)
        best = _subset(logits, g, n).argmax(dim=-1, keepdim=True)
        yield RowGroup(g, torch.ones(best.shape, dtype=torch.float32, device=logits.device), best)
    if bool(dense.any()):
        d = dense.nonzero().squeeze(-1)
        yield RowGroup(d, _dense_probs(_subset(logits, d, n).float() / temperature[d].unsqueeze(-1), top_p[d]), None)
    if bool(sparse.any()):
        s = sparse.nonzero().squeeze(-1)
        kmax = int(k_eff[s].max())
        t = temperature[s].unsqueeze(-1)
        x = _subset(logits, s, n)
        if scale_first:
            vals, idx = topk_fn(x.float() / t, kmax)
        else:
            vals, idx = topk_fn(x, kmax)
            vals = vals.float() / t
        yield RowGroup(None if s.numel() == n else s, _topk_probs(vals, k_eff[s], top_p[s]), idx)


def _build(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, topk_fn: TopkFn, scale_first: bool
) -> Tensor:
    """The dense builders: row_groups laid out as [rows, V] fp32 (zeros elsewhere)."""
    n, vocab = check_logits(logits).shape
    temperature, top_k, top_p = row_params(logits, temperature, top_k, top_p)
    out = torch.zeros(n, vocab, dtype=torch.float32, device=logits.device)
    for group in row_groups(logits, temperature, top_k, top_p, topk_fn, scale_first):
        if group.ids is None:
            assert group.rows is not None  # a dense group is never handed over as "every row" (see row_groups)
            out[group.rows] = group.probs
        elif group.rows is None:
            out.scatter_(1, group.ids, group.probs)
        else:
            out.index_put_((group.rows.unsqueeze(-1).expand_as(group.ids), group.ids), group.probs)
        del group  # placed: its probabilities are freed before the next group is built (peak memory)
    return out


def full_vocab_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """ "before": scale the whole logits matrix by the temperature, then torch.topk. -> [rows, V] fp32."""
    return _build(logits, temperature, top_k, top_p, torch_topk, scale_first=True)


def topk_first_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """ "after": radix top-k on the raw logits, then scale the k values. -> [rows, V] fp32."""
    return _build(logits, temperature, top_k, top_p, radix_topk, scale_first=False)


def topk_first_torch_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """ "after" with torch.topk forced (the fallback path on every device). -> [rows, V] fp32."""
    return _build(logits, temperature, top_k, top_p, torch_topk, scale_first=False)


def topk_fused_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """One read of the logits, one write of the output: the Triton kernels of harness.verify.topk_fused on CUDA for
    the rows they take (top_k up to its FAST_K, greedy rows), topk_first for the others; off CUDA or without
    Triton, topk_first for every row. -> [rows, V] fp32.

    The kept tokens are those of full_vocab, except where logits tie at a row's k-th value: the kernel
    keeps the lowest indices (torch.topk and FlashInfer may keep others of equal value). The probabilities
    agree with full_vocab's to float32 rounding (another order of the softmax sums), not bitwise."""
    from harness.verify import topk_fused  # noqa: PLC0415  (imports Triton)

    if logits.device.type != "cuda" or not topk_fused.available():
        return topk_first_probs(logits, temperature, top_k, top_p)
    return fused_build(logits, temperature, top_k, top_p)


def fused_build(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, config: dict[str, int] | None = None
) -> Tensor:
    """topk_fused on any device Triton runs on (CUDA; a CPU under TRITON_INTERPRET=1, for tests); `config`
    overrides topk_fused.launch_config()."""
    from harness.verify import topk_fused  # noqa: PLC0415  (imports Triton)

    check_logits(logits)
    temperature, top_k, top_p = row_params(logits, temperature, top_k, top_p)
    out, left = topk_fused.run(logits, temperature, top_k, top_p, config)
    if left is not None:  # rows the kernels did not take (top_k above FAST_K, the whole vocabulary)
        out[left] = topk_first_probs(logits[left], temperature[left], top_k[left], top_p[left])
    return out


BUILDERS: dict[str, BuilderFn] = {
    "full_vocab": full_vocab_probs,
    "topk_first": topk_first_probs,
    "topk_first_torch": topk_first_torch_probs,
    "topk_fused": topk_fused_probs,
}


def get_builder(name: str) -> BuilderFn:
    """The builder called `name`; a ValueError lists the valid names."""
    try:
        return BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown verify-probability builder {name!r}; valid: {', '.join(BUILDERS)}") from None
