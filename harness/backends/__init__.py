"""The engines the runner drives, one module each, found by name (`server.backend`): see base.py."""

from __future__ import annotations

import importlib

from harness.backends.base import Backend
from harness.validation import ConfigError

# server.backend -> the module holding its Backend (imported when asked for: an engine's helpers load only for it)
MODULES = {
    "embedded": "harness.backends.embedded",
    "sglang": "harness.backends.sglang",
    "llamacpp": "harness.backends.llamacpp",
    "openai": "harness.backends.openai",
}
NAMES = tuple(MODULES)


def get(name: str) -> Backend:
    """The backend named `name`; ConfigError listing the valid names when there is none."""
    if name not in MODULES:
        raise ConfigError(f"server.backend={name!r} is not a backend; valid: {', '.join(NAMES)} (server=NAME)")
    return importlib.import_module(MODULES[name]).BACKEND
