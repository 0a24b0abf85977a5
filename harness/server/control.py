"""The server's control endpoints, as the runner uses them around a run: JSON facts (/server_info,
/model_info; llama-server's /props, /slots, /v1/models), text (its /metrics), /health at the end of a run, and
/flush_cache before the measured window."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from harness.server.process import ServerError
from harness.server.redact import clip


async def get_json(base_url: str, path: str, timeout_s: float = 30.0) -> dict | None:
    """GET a JSON endpoint; None when the server does not have it."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        try:
            async with session.get(base_url + path) as resp:
                return await resp.json(content_type=None) if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None


async def get_text(base_url: str, path: str, timeout_s: float = 30.0) -> str:
    """GET a text endpoint (llama-server's Prometheus /metrics); ServerError when it does not answer 200."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        try:
            async with session.get(base_url + path) as resp:
                body = await resp.text()
                if resp.status != 200:
                    raise ServerError(f"GET {path}: HTTP {resp.status} {clip(body, 200)}")
                return body
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ServerError(f"GET {path} failed: {type(exc).__name__}: {exc}") from None


async def flush_cache(base_url: str, timeout_s: float = 60.0) -> None:
    """POST /flush_cache, retrying while the server answers 400 (busy)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while True:
            async with session.post(base_url + "/flush_cache") as resp:
                if resp.status == 200:
                    return
                body = await resp.text()
            if time.monotonic() > deadline:
                raise ServerError(
                    f"/flush_cache kept failing for {timeout_s:.0f}s: HTTP {resp.status} {clip(body, 200)}"
                )
            await asyncio.sleep(0.5)


async def responds(base_url: str, path: str, timeout_s: float) -> bool:
    """Whether GET `path` answers 200 within `timeout_s`."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(base_url + path) as resp:
                return resp.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False
