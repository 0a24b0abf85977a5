"""Top-k of each row: torch.topk, and the radix top-k (FlashInfer's on CUDA when it imports)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

TopkFn = Callable[[Tensor, int], tuple[Tensor, Tensor]]


def torch_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """torch.topk, sorted descending. x: [rows, V] -> ([rows, k], [rows, k] int64)."""
    return torch.topk(x, k, dim=-1, largest=True, sorted=True)


@functools.cache
def _flashinfer_top_k() -> Callable | None:
    """FlashInfer's radix top-k function, or None when FlashInfer does not import (resolved once)."""
    try:
        import flashinfer  # noqa: PLC0415
    except Exception:  # noqa: BLE001  (any import failure means: not available)
        return None
    fn = getattr(flashinfer, "top_k", None)
    return fn if callable(fn) else None


def radix_topk_backend(device: torch.device | str) -> str:
    """Which implementation `radix_topk` uses for tensors on `device`: 'flashinfer' or 'torch'."""
    is_cuda = torch.device(device).type == "cuda"
    return "flashinfer" if is_cuda and _flashinfer_top_k() is not None else "torch"


def radix_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k values and indices of each row, sorted descending; any k up to the vocabulary.

    FlashInfer's radix top-k (`sorted=True, deterministic=True`) for CUDA tensors when FlashInfer
    imports, `torch.topk` otherwise. x: [rows, V] -> ([rows, k], [rows, k] int64).
    """
    if not 1 <= k <= x.shape[-1]:
        raise ValueError(f"radix_topk: k={k} must be in [1, {x.shape[-1]}] (the row length)")
    if radix_topk_backend(x.device) == "torch":
        return torch_topk(x, k)
    fi_top_k = _flashinfer_top_k()
    assert fi_top_k is not None  # the backend is flashinfer: it imported (resolved once)
    values, indices = fi_top_k(x.contiguous(), k, sorted=True, deterministic=True)
    return values, indices.long()
