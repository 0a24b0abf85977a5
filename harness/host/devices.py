"""The torch device a `device` setting names (`auto`, `cpu`, `cuda`, `cuda:N`), shared by the embedded
server and the microbenchmark."""

from __future__ import annotations

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
