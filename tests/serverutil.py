"""Helpers for tests that run the embedded server (`python -m harness.engine`) as a real subprocess.

    with engine_server(["--model-path", "embedded:mini"]) as server:
        status, body = post_json(server.url + "/generate", {"text": "hi"})

`engine_server` binds a free loopback port, waits until `/health_generate` answers 200, and on exit
sends SIGTERM (then SIGKILL) and keeps the log for `server.log_text()`. Plain-stdlib HTTP helpers
(`get`, `post_json`, `post_sse`) and an aiohttp fan-out (`generate_concurrently`) come with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port that was free a moment ago on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class EngineServer:
    """A running engine subprocess."""

    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None


class ServerStartError(RuntimeError):
    pass


def start_engine(args: list[str], log_path: Path, port: int | None = None,
                 env: dict[str, str] | None = None) -> EngineServer:
    """Start `python -m harness.engine ARGS --host 127.0.0.1 --port PORT` without waiting; `env` adds to
    (or overrides) the inherited environment."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "harness.engine", *args, "--host", HOST, "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    log = open(log_path, "wb")  # noqa: SIM115  (the child owns it; closed with the process)
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env)
    log.close()
    return EngineServer(proc=proc, port=port, log_path=log_path)


def wait_ready(server: EngineServer, timeout_s: float = 120.0) -> None:
    """Poll /health_generate until 200; ServerStartError with the log if it dies or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise ServerStartError(f"engine exited with {server.proc.returncode}:\n{server.log_text()}")
        if get(server.url + "/health_generate", timeout_s=5)[0] == 200:
            return
        time.sleep(0.1)
    raise ServerStartError(f"engine not ready after {timeout_s}s:\n{server.log_text()}")


def stop_engine(server: EngineServer, timeout_s: float = 15.0) -> int:
    if server.alive():
        server.proc.terminate()
        try:
            server.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(timeout=10)
    return server.proc.returncode


@contextlib.contextmanager
def engine_server(args: list[str], timeout_s: float = 120.0,
                  env: dict[str, str] | None = None) -> Iterator[EngineServer]:
    """Start the engine with `args` (and extra `env`) on a free loopback port, wait until ready, stop it
    afterwards."""
    with tempfile.TemporaryDirectory(prefix="engine-") as tmp:
        server = start_engine(args, Path(tmp) / "server.log", env=env)
        try:
            wait_ready(server, timeout_s)
            yield server
        finally:
            stop_engine(server)


# ---------------------------------------------------------------------- blocking HTTP


def get(url: str, timeout_s: float = 30.0) -> tuple[int, str]:
    """(status, body text); status 0 when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
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
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
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
    return [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]


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
                return line[len("data: "):]

    def close(self) -> None:
        self.response.close()
        self._conn.close()
