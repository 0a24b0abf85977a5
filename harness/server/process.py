"""One server process: start it (own process group, log file, CPU pinning, parent-death signal), wait
until it is ready and check that the listener on its port is ours, stop it.

Stopping sends SIGTERM to the whole group, then SIGKILL; then the secrets of the launch are masked in its
log. On Linux the server also gets SIGTERM when the runner dies (PR_SET_PDEATHSIG), so no server outlives a
crashed or killed runner. With `server.cpus` the server (and every process it starts) runs pinned to those
CPUs from its first instruction.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

import aiohttp
import psutil

from harness.server.launch import Launch
from harness.server.logs import log_tail
from harness.server.redact import Secrets

PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """The server failed to start, died, or failed a log check."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listeners(port: int) -> list[psutil.Process]:
    """The processes (that this user may inspect) listening on TCP `port`."""
    out = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                out.append(psutil.Process(conn.pid))
            except psutil.NoSuchProcess:
                pass
    return out


def describe_processes(procs: list[psutil.Process]) -> str:
    parts = []
    for proc in procs:
        try:
            parts.append(f"pid {proc.pid} ({' '.join(proc.cmdline())[:120]})")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            parts.append(f"pid {proc.pid}")
    return ", ".join(parts) or "a process this user cannot see"


def ensure_port_free(host: str, port: int) -> None:
    """ServerError when something already listens on host:port (it would answer in our server's place)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            raise ServerError(
                f"port {port} on {host} is already in use by {describe_processes(listeners(port))}: "
                "a run there would measure that server. Stop it, or use server.port=0 (a free "
                "port per run)"
            ) from None


def _set_parent_death_signal() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _prepare_child(cpus: list[int], runner: int) -> None:  # runs in the child between fork and exec
    """SIGTERM when the runner dies (Linux), and the CPU pinning the server inherits down its tree.

    The death signal only covers a runner that dies after it is set: one that died between the fork and
    here (a SIGKILL, an OOM kill) has left this child to init already, so the child checks that its parent
    is still the runner and otherwise exits before it becomes a server nobody will stop."""
    if sys.platform == "linux":
        _set_parent_death_signal()
        if os.getppid() != runner:
            os._exit(1)
    if cpus:
        os.sched_setaffinity(0, cpus)


async def poll_ready(url: str, timeout_s: float, check: Callable[[], None] = lambda: None) -> bool:
    """Whether `url` answered 200 within timeout_s, polled every 0.25 s; `check` runs before each poll and raises to
    stop early (a launched server that exited)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while time.monotonic() < deadline:
            check()
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return True
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.25)
    return False


@dataclass
class Server:
    """A running server process (use as an async context manager)."""

    launch: Launch
    proc: subprocess.Popen | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def secrets(self) -> Secrets:
        """The secret values of this launch (its environment, its argv): masked in the log tails its errors
        quote, and in its log once it has exited."""
        return Secrets.of_server(self.launch.env_overrides, self.launch.argv)

    def log_tail(self) -> str:
        return self.secrets.scrub(log_tail(self.launch.log_path))

    def start(self) -> None:
        ensure_port_free(self.launch.host, self.launch.port)
        self.launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.launch.log_path, "ab")  # noqa: SIM115  (closed in stop())
        env = {**os.environ, **self.launch.env_overrides, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.launch.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.launch.cwd,
            start_new_session=True,
            preexec_fn=functools.partial(_prepare_child, list(self.launch.cpus), os.getpid()),
        )

    def started(self) -> subprocess.Popen:
        """The server's process (set by start(), or given)."""
        assert self.proc is not None, "Server.start() first"
        return self.proc

    def pid(self) -> int | None:
        """The server process's pid: the root of the tree whose CPU time a run measures."""
        return self.started().pid

    async def wait_ready(self) -> None:
        """Poll the launch's ready path (/health_generate; llama-server's /health) until 200; fail with the log's
        tail on timeout or exit."""
        if await poll_ready(self.launch.base_url + self.launch.ready_path, self.launch.ready_timeout_s, self._exited):
            self.check_identity()
            return
        raise ServerError(
            f"server not ready after {self.launch.ready_timeout_s:g} s (server.ready_timeout_s: a longer "
            f"one resumes the campaign); log {self.launch.log_path}:\n{self.log_tail()}"
        )

    def _exited(self) -> None:
        """ServerError, with the log's tail, if the server process has exited."""
        proc = self.started()
        if proc.poll() is not None:
            raise ServerError(
                f"server exited with code {proc.returncode} before it was ready; "
                f"log {self.launch.log_path}:\n{self.log_tail()}"
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def owns_port(self) -> bool:
        """Whether the process this Server started, or one of its descendants, listens on its port."""
        try:
            root = psutil.Process(self.started().pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return False
        for proc in tree:
            try:
                conns = proc.net_connections(kind="tcp")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.launch.port for c in conns):
                return True
        return False

    def check_identity(self) -> None:
        """ServerError unless the server answering on the port is the one this run started."""
        pid = self.started().pid
        if not self.owns_port():
            others = [p for p in listeners(self.launch.port) if p.pid != pid]
            raise ServerError(
                f"port {self.launch.port} answers, but not from the server this run started "
                f"(pid {pid}); it is held by {describe_processes(others)}. "
                f"Log of ours: {self.launch.log_path}"
            )

    def stop(self) -> None:
        """SIGTERM to the process group, then SIGKILL after stop_timeout_s."""
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            _signal_group(self.proc.pid, signal.SIGCONT)  # a stopped (SIGSTOP) server handles SIGTERM only then
            try:
                self.proc.wait(timeout=self.launch.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None:
            _signal_group(self.proc.pid, signal.SIGKILL)  # leftovers of the group, if any
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
            self.secrets.scrub_file(self.launch.log_path)  # the server is gone: nothing writes it any more

    async def __aenter__(self) -> Server:
        self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Attached:
    """A server already running at a URL (a launch with launched=False): nothing is started or stopped; readiness is
    its ready path answering 200 within ready_timeout_s. Its log is not ours: the run's server.log says so."""

    launch: Launch

    async def wait_ready(self) -> None:
        url = self.launch.base_url + self.launch.ready_path
        if await poll_ready(url, self.launch.ready_timeout_s):
            return
        raise ServerError(
            f"the server at {self.launch.base_url} did not answer {url} with 200 within "
            f"{self.launch.ready_timeout_s:g} s (server.ready_timeout_s); it was not launched by the run"
        )

    def alive(self) -> bool:
        return True  # (not ours to watch: the /health check at the end of the run says whether it still serves)

    def started(self) -> subprocess.Popen:
        raise ServerError(f"the server at {self.launch.base_url} was not launched by the run")

    def pid(self) -> int | None:
        return None  # its processes are not ours to read (they may be on another machine)

    async def __aenter__(self) -> Attached:
        self.launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.launch.log_path.write_text(
            f"(the server at {self.launch.base_url} was running before the run: not launched, its log not kept)\n"
        )
        return self

    async def __aexit__(self, *exc) -> None:
        pass


def server_for(launch: Launch) -> Server | Attached:
    """The server of a run: started by it, or (launched=False) one already running at its URL."""
    return Server(launch) if launch.launched else Attached(launch)
