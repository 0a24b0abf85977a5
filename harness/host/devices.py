"""The torch device a `device` setting names (`auto`, `cpu`, `cuda`, `cuda:N`), shared by the embedded
server and the microbenchmark, and whether tensors of a given size can fit on it."""

from __future__ import annotations

import psutil
import torch

from harness.validation import ConfigError


def resolve_device(name: str, key: str = "device") -> torch.device:
    """auto -> cuda when torch sees a GPU, else cpu. A CUDA device that torch does not see is a ConfigError
    naming `key` (the setting it came from)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{key}={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{key}={name} but torch sees no CUDA device; use {key}=cpu or auto")
    return device


def available_bytes(device: torch.device) -> int:
    """Memory free for new tensors now: the GPU's free memory (cudaMemGetInfo), else the host's available RAM."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def check_fits(needed: int, device: torch.device, what: str, fix: str) -> None:
    """ConfigError, before anything is allocated, when `needed` bytes (the least `what` must allocate) exceed the
    memory free on `device`; the message names the size and `fix`."""
    free = available_bytes(device)
    if needed > free:
        raise ConfigError(
            f"{what} needs at least {needed:,} bytes ({needed / 2**30:,.1f} GiB) on {device}, which has "
            f"{free / 2**30:,.1f} GiB free: it cannot be allocated; {fix}"
        )
