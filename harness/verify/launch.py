"""Where a Triton kernel launches: on the current CUDA device, so both kernel modules (topk_fused, sparse_kernel)
make it their tensors' device first."""

from __future__ import annotations

import contextlib

import torch


def launch_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it the tensors' (a CPU, under the interpreter: nothing)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
