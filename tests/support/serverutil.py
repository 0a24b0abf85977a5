"""Helpers for tests that run the embedded server (`python -m harness.engine`) as a real subprocess.

    with engine_server(["--model-path", "embedded:mini"]) as server:
        status, body = post_json(server.url + "/generate", {"text": "hi"})

The process is the harness's own launcher (harness.server.process.Server: a free loopback port, its own
process group, readiness on `/health_generate` with the identity check, SIGTERM then SIGKILL), so the
tests start servers exactly as the runner does. Plain-stdlib HTTP helpers (`get`, `post_json`,
`post_sse`) and an aiohttp fan-out (`generate_concurrently`) come with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from harness.server.config import LogChecks
from harness.server.launch import Launch
from harness.server.process import Server, free_port

HOST = "127.0.0.1"


@dataclass
class EngineServer:
    """A running engine subprocess, started by the harness's launcher."""

    server: Server

    @property
    def port(self) -> int:
        return self.server.launch.port

    @property
    def url(self) -> str:
        return self.server.launch.base_url

    @property
    def proc(self):
        return self.server.proc

    @property
    def log_path(self) -> Path:
        return self.server.launch.log_path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.server.alive()


def start_engine(
    args: list[str],
    log_path: Path,
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
) -> EngineServer:
    """Start `python -m harness.engine ARGS --host 127.0.0.1 --port PORT` without waiting; `env` adds to
    (or overrides) the inherited environment."""
    port = port or free_port(HOST)
    spec = Launch(
        argv=[sys.executable, "-m", "harness.engine", *args, "--host", HOST, "--port", str(port)],
        env_overrides=dict(env or {}),
        host=HOST,
        port=port,
        log_path=log_path,
        log_checks=LogChecks(),
        ready_timeout_s=timeout_s,
        stop_timeout_s=15.0,
    )
    server = Server(spec)
    server.start()
    return EngineServer(server)


def wait_ready(server: EngineServer) -> None:
    """Until /health_generate answers 200 from this server (harness.server.process.ServerError with the log's tail
    when it exits or times out)."""
    asyncio.run(server.server.wait_ready())


def stop_engine(server: EngineServer) -> int | None:
    server.server.stop()
    return server.proc.returncode


@contextlib.contextmanager
def engine_server(
    args: list[str], timeout_s: float = 120.0, env: dict[str, str] | None = None
) -> Iterator[EngineServer]:
    """Start the engine with `args` (and extra `env`) on a free loopback port, wait until ready, stop it
    afterwards."""
    with tempfile.TemporaryDirectory(prefix="engine-") as tmp:
        server = start_engine(args, Path(tmp) / "server.log", env=env, timeout_s=timeout_s)
        try:
            wait_ready(server)
            yield server
        finally:
            stop_engine(server)


# ---------------------------------------------------------------------- blocking HTTP


def get(url: str, timeout_s: float = 30.0) -> tuple[int, str]:
    """(status, body text); status 0 when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def get_json(url: str) -> Any:
    status, body = get(url)
    assert status == 200, (url, status, body)
    return json.loads(body)


def post_raw(url: str, data: bytes, timeout_s: float = 120.0) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post_json(url: str, body: Any, timeout_s: float = 120.0) -> tuple[int, Any]:
    """(status, parsed JSON body, or the raw text when it is not JSON)."""
    status, text = post_raw(url, json.dumps(body).encode(), timeout_s)
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def post_sse(url: str, body: Any, timeout_s: float = 120.0) -> list[str]:
    """The `data:` payloads of a streamed response, in order (including '[DONE]')."""
    status, text = post_raw(url, json.dumps(body).encode(), timeout_s)
    assert status == 200, (status, text)
    return [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]


# ---------------------------------------------------------------------- concurrent requests


async def _generate_all(url: str, bodies: list[dict], concurrency: int) -> list[dict]:
    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(body: dict) -> dict:
            async with sem, session.post(url + "/generate", json=body) as resp:
                assert resp.status == 200, (resp.status, await resp.text())
                return await resp.json()

        return await asyncio.gather(*(one(b) for b in bodies))


def generate_concurrently(url: str, bodies: list[dict], concurrency: int) -> list[dict]:
    """POST every body to /generate with at most `concurrency` in flight; replies in input order."""
    return asyncio.run(_generate_all(url, bodies, concurrency))


class Stream:
    """A streamed POST read event by event; `close()` drops the connection mid-stream."""

    def __init__(self, url: str, body: Any, timeout_s: float = 120.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        self._conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout_s)
        self._conn.request("POST", parsed.path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        self.response = self._conn.getresponse()

    def next_event(self) -> str | None:
        """The next `data:` payload, or None at the end of the stream."""
        while True:
            line = self.response.readline()
            if not line:
                return None
            line = line.decode().rstrip("\n")
            if line.startswith("data: "):
                return line[len("data: ") :]

    def close(self) -> None:
        self.response.close()
        self._conn.close()
