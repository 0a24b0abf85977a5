"""Logging of the embedded server: SGLang-like lines on stdout that log checks can search."""

from __future__ import annotations

import logging
import sys

FORMAT = "[%(asctime)s %(levelname)s] %(message)s"
DATEFMT = "%Y-%m-%d %H:%M:%S"


def setup_logging(level: str) -> logging.Logger:
    """Configure the root logger once, at start-up (never at import)."""
    logging.basicConfig(level=level.upper(), format=FORMAT, datefmt=DATEFMT, stream=sys.stdout, force=True)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return logging.getLogger("harness.engine")
