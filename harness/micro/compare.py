"""Compare an implementation's output with the baseline's: bitwise, kept sets, kept values."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class OutputMatch:
    """How an output [rows, vocab] relates to the baseline's.

    bitwise_equal: torch.equal. kept_sets_equal: the same tokens have non-zero probability.
    kept_counts_equal: every row keeps as many tokens. values_equal: every row's kept probabilities,
    sorted, are bitwise the same (ties may move which token holds a value, not the values).
    max_abs_diff: largest difference between the sorted kept probabilities (0.0 when values_equal).
    """

    bitwise_equal: bool
    kept_sets_equal: bool
    kept_counts_equal: bool
    values_equal: bool
    max_abs_diff: float | None

    def summary(self) -> str:
        """One word or phrase for tables."""
        if self.bitwise_equal:
            return "bitwise"
        if self.values_equal:
            return "values (kept set differs)" if not self.kept_sets_equal else "values"
        if self.kept_sets_equal:
            return f"same kept set (max diff {self.max_abs_diff:.2e})"
        if self.kept_counts_equal:
            return f"counts only (max diff {self.max_abs_diff:.2e})"
        return "differs"


def _sorted_kept(x: Tensor, m: int) -> Tensor:
    """The m largest values of each row, descending. x: [rows, vocab] -> [rows, m]."""
    return torch.topk(x.float(), m, dim=-1, sorted=True).values


def compare_outputs(out: Tensor, ref: Tensor) -> OutputMatch:
    """Compare `out` with the baseline `ref` (both [rows, vocab] probabilities)."""
    if out.shape != ref.shape:
        return OutputMatch(False, False, False, False, None)
    if torch.equal(out, ref):
        return OutputMatch(True, True, True, True, 0.0)
    kept_out, kept_ref = out > 0, ref > 0
    counts_out, counts_ref = kept_out.sum(dim=-1), kept_ref.sum(dim=-1)
    counts_equal = torch.equal(counts_out, counts_ref)
    m = max(1, int(torch.maximum(counts_out, counts_ref).max()))
    top_out, top_ref = _sorted_kept(out, m), _sorted_kept(ref, m)
    return OutputMatch(
        bitwise_equal=False,
        kept_sets_equal=torch.equal(kept_out, kept_ref),
        kept_counts_equal=counts_equal,
        values_equal=counts_equal and torch.equal(top_out, top_ref),
        max_abs_diff=float((top_out - top_ref).abs().max()),
    )


TIE_TOLERANCE = 1e-6  # two probabilities closer than this tie at the top-p cut (float32 rounding of softmax sums)


def tied_rows(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """[rows] bool: rows whose kept set the rules leave open, so that two correct builders may keep different
    tokens: the logits tie at the k-th value (which of the tied tokens is kept is the builder's choice: the
    fused kernel keeps the lowest indices, torch.topk and FlashInfer others), or two probabilities tie, to
    float32 rounding, at the top-p cut (a builder summing in another order may cut one token earlier).
    Greedy rows (temperature < 1e-6 or top_k 1) are k = 1; top_k <= 0 or >= V, the whole vocabulary."""
    x = logits.float()
    n, vocab = x.shape
    k = torch.where((top_k <= 0) | (top_k >= vocab), torch.full_like(top_k, vocab), top_k).long()
    k = torch.where((temperature < 1e-6) | (top_k == 1), torch.ones_like(k), k)
    m = int(min(vocab, int(k.max()) + 1))
    vals = torch.topk(x, m, dim=-1, sorted=True).values  # [rows, m]
    rows = torch.arange(n, device=x.device)
    kth, nxt = vals[rows, (k - 1).clamp(max=m - 1)], vals[rows, k.clamp(max=m - 1)]
    tie_k = (k < vocab) & (kth == nxt)
    ranks = torch.arange(m, device=x.device).unsqueeze(0)
    scaled = torch.where(ranks < k.unsqueeze(1), vals / temperature.clamp(min=1e-6).unsqueeze(1), float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    below = torch.cumsum(probs, dim=-1) - probs < top_p.unsqueeze(1)  # the tokens before the cut's mass
    cut = (below.sum(dim=-1) - 1).clamp(min=0)  # the last token whose mass before it is below top_p
    p_cut, p_next = probs[rows, cut], probs[rows, (cut + 1).clamp(max=m - 1)]
    tie_p = (top_p < 1) & (cut + 1 < k) & ((p_cut - p_next).abs() <= TIE_TOLERANCE)
    return tie_k | tie_p


def unexplained_rows(out: Tensor, ref: Tensor, tied: Tensor) -> tuple[int, int]:
    """(rows whose kept set differs from the reference's, those of them that are not `tied`): a correct
    builder leaves the second at 0."""
    differ = ((out > 0) != (ref > 0)).any(dim=-1)
    return int(differ.sum()), int((differ & ~tied).sum())
