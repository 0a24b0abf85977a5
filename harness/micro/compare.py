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
