"""Inputs of the microbenchmark: per-row sampling parameters, rotated copies (the logits: harness.micro.families)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class RowParams:
    """Per-row sampling parameters, every row alike. Each: [rows]."""

    temperature: Tensor  # fp32
    top_k: Tensor  # int64
    top_p: Tensor  # fp32


def padding_row_count(rows: int, padding_fraction: float) -> int:
    """How many of `rows` rows are padding (all-equal logits): round(rows * padding_fraction)."""
    return min(rows, int(round(rows * padding_fraction)))


def make_params(rows: int, *, temperature: float, top_k: int, top_p: float, device: torch.device) -> RowParams:
    """The same temperature / top_k / top_p on every row."""
    return RowParams(
        temperature=torch.full((rows,), temperature, dtype=torch.float32, device=device),
        top_k=torch.full((rows,), top_k, dtype=torch.int64, device=device),
        top_p=torch.full((rows,), top_p, dtype=torch.float32, device=device),
    )


def rotation_count(bytes_per_copy: int, min_rotate_bytes: int) -> int:
    """The fewest copies whose total strictly exceeds `min_rotate_bytes` (at least one)."""
    if bytes_per_copy <= 0:
        raise ValueError(f"bytes_per_copy={bytes_per_copy} must be positive")
    return max(1, min_rotate_bytes // bytes_per_copy + 1)


def rotated_copies(logits: Tensor, min_rotate_bytes: int) -> list[Tensor]:
    """`logits` followed by clones of it, enough that together they exceed `min_rotate_bytes`."""
    n = rotation_count(logits.numel() * logits.element_size(), min_rotate_bytes)
    return [logits] + [logits.clone() for _ in range(n - 1)]
