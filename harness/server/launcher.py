"""Launch one server (SGLang or the embedded one), wait until it is ready, check its log, stop it.

Both backends are started the same way: `python -m MODULE --model-path M --host H --port P ...`,
argv built as a list, in a process group of its own, stdout and stderr to `server.log`. Stopping sends
SIGTERM to the whole group, then SIGKILL. On Linux the server also gets SIGTERM when the runner
dies (PR_SET_PDEATHSIG), so no server outlives a crashed or killed runner. With `server.cpus` the
server (and every process it starts) runs pinned to those CPUs from its first instruction.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import aiohttp
import psutil

from harness.campaign.plan import PlannedRun
from harness.config import ArmConfig, BenchConfig, LogChecks, ServerConfig

# a name part (split on _ - .) ending so is a secret: HF_TOKEN, OPENAI_API_KEY, PGPASSWORD, --api-key;
# not --speculative-num-draft-tokens or TOKENIZERS_PARALLELISM
SECRET_PART = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?|AUTH|APIKEY)$", re.IGNORECASE)
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
            raise ServerError(f"port {port} on {host} is already in use by {describe_processes(listeners(port))}: "
                              "a run there would measure that server. Stop it, or use server.port=0 (a free "
                              "port per run)") from None


URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):[^@/\s]+@")


def is_secret_name(name: str) -> bool:
    """Whether a variable or flag name (HF_TOKEN, --api-key) names a secret."""
    return any(SECRET_PART.search(part) for part in re.split(r"[_.-]+", name) if part)


def redact_value(value: str) -> str:
    """Hide passwords inside a value (`scheme://user:password@host` -> `scheme://user:***@host`)."""
    return URL_CREDENTIALS.sub(r"\g<head>:***@", value)


def redact(env: dict[str, str]) -> dict[str, str]:
    """Hide the values of variables that look like secrets (tokens, keys, passwords) and the
    credentials inside any other value."""
    return {k: ("***" if is_secret_name(k) else redact_value(str(v))) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """The command with the value of any secret-looking flag (`--api-key X`, `--hf-token=X`) hidden."""
    out: list[str] = []
    for i, token in enumerate(argv):
        flag, eq, _ = token.partition("=")
        if token.startswith("--") and eq and is_secret_name(flag):
            out.append(f"{flag}=***")
        elif i > 0 and argv[i - 1].startswith("--") and "=" not in argv[i - 1] and is_secret_name(argv[i - 1]):
            out.append("***")
        else:
            out.append(redact_value(token))
    return out


@dataclass
class LaunchSpec:
    """Everything needed to start one server; `argv` and `env_overrides` go into the manifest."""

    argv: list[str]
    env_overrides: dict[str, str]
    host: str
    port: int
    log_path: Path
    log_checks: LogChecks
    ready_timeout_s: float
    stop_timeout_s: float
    cpus: list[int] = field(default_factory=list)  # pin the server to these CPUs; [] = no pinning

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def merge_log_checks(*checks: LogChecks) -> LogChecks:
    return LogChecks(must=[r for c in checks for r in c.must], must_not=[r for c in checks for r in c.must_not])


def build_spec(server: ServerConfig, arm: ArmConfig, *, port: int, base_seed: int | None, gpu: int | None,
               log_path: Path) -> LaunchSpec:
    """The exact command and environment of one run of one arm."""
    python = arm.python or server.python or sys.executable
    argv = [python, "-m", server.module, "--model-path", server.model_path,
            "--host", server.host, "--port", str(port)]
    if server.draft_model_path:
        argv += ["--speculative-draft-model-path", server.draft_model_path]
    if server.seed_arg and base_seed is not None:
        argv += [server.seed_arg, str(base_seed)]
    argv += [str(a) for a in server.args] + [str(a) for a in arm.args]
    env = {**{k: str(v) for k, v in server.env.items()}, **{k: str(v) for k, v in arm.env.items()}}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return LaunchSpec(argv=argv, env_overrides=env, host=server.host, port=port, log_path=log_path,
                      log_checks=merge_log_checks(server.log_checks, arm.log_checks),
                      ready_timeout_s=server.ready_timeout_s, stop_timeout_s=server.stop_timeout_s,
                      cpus=list(server.cpus))


def planned_spec(cfg: BenchConfig, run: PlannedRun, *, port: int, log_path: Path = Path("server.log")) -> LaunchSpec:
    """The launch spec of one planned run, as the dry run shows it and the argv preflight checks it."""
    return build_spec(cfg.server, cfg.experiment.arm(run.arm), port=port, base_seed=run.base_seed, gpu=run.gpu,
                      log_path=log_path)


def _set_parent_death_signal() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _prepare_child(cpus: list[int]) -> None:  # runs in the child between fork and exec
    """SIGTERM when the runner dies (Linux), and the CPU pinning the server inherits down its tree."""
    if sys.platform == "linux":
        _set_parent_death_signal()
    if cpus:
        os.sched_setaffinity(0, cpus)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def check_log(path: Path, checks: LogChecks) -> dict:
    """{"must": {regex: found}, "must_not": {regex: found}, "passed": bool} over the log so far."""
    text = path.read_text(errors="replace") if path.exists() else ""
    must = {r: re.search(r, text, re.MULTILINE) is not None for r in checks.must}
    must_not = {r: re.search(r, text, re.MULTILINE) is not None for r in checks.must_not}
    return {"must": must, "must_not": must_not, "passed": all(must.values()) and not any(must_not.values())}


def describe_failed_checks(result: dict) -> str:
    missing = [r for r, ok in result["must"].items() if not ok]
    present = [r for r, hit in result["must_not"].items() if hit]
    parts = ([f"missing {missing}"] if missing else []) + ([f"present but forbidden {present}"] if present else [])
    return "; ".join(parts)


@dataclass
class Server:
    """A running server process (use as an async context manager)."""

    spec: LaunchSpec
    proc: subprocess.Popen | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        ensure_port_free(self.spec.host, self.spec.port)
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.spec.log_path, "ab")  # noqa: SIM115  (closed in stop())
        env = {**os.environ, **self.spec.env_overrides, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.spec.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=functools.partial(_prepare_child, list(self.spec.cpus)),
        )

    def started(self) -> subprocess.Popen:
        """The server's process (set by start(), or given)."""
        assert self.proc is not None, "Server.start() first"
        return self.proc

    async def wait_ready(self) -> None:
        """Poll /health_generate until 200; fail with the log's tail on timeout or exit."""
        proc = self.started()
        deadline = time.monotonic() + self.spec.ready_timeout_s
        url = self.spec.base_url + "/health_generate"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise ServerError(f"server exited with code {proc.returncode} before it was ready; "
                                      f"log {self.spec.log_path}:\n{log_tail(self.spec.log_path)}")
                try:
                    async with session.get(url) as resp:
                        if resp.status == 200:
                            self.check_identity()
                            return
                except (TimeoutError, aiohttp.ClientError):
                    pass
                await asyncio.sleep(0.25)
        raise ServerError(f"server not ready after {self.spec.ready_timeout_s:.0f}s (server.ready_timeout_s); "
                          f"log {self.spec.log_path}:\n{log_tail(self.spec.log_path)}")

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
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.spec.port for c in conns):
                return True
        return False

    def check_identity(self) -> None:
        """ServerError unless the server answering on the port is the one this run started."""
        pid = self.started().pid
        if not self.owns_port():
            others = [p for p in listeners(self.spec.port) if p.pid != pid]
            raise ServerError(f"port {self.spec.port} answers, but not from the server this run started "
                              f"(pid {pid}); it is held by {describe_processes(others)}. "
                              f"Log of ours: {self.spec.log_path}")

    def stop(self) -> None:
        """SIGTERM to the process group, then SIGKILL after stop_timeout_s."""
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            _signal_group(self.proc.pid, signal.SIGCONT)  # a stopped (SIGSTOP) server handles SIGTERM only then
            try:
                self.proc.wait(timeout=self.spec.stop_timeout_s)
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


async def get_json(base_url: str, path: str, timeout_s: float = 30.0) -> dict | None:
    """GET a JSON endpoint; None when the server does not have it."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        try:
            async with session.get(base_url + path) as resp:
                return await resp.json(content_type=None) if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None


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
                raise ServerError(f"/flush_cache kept failing for {timeout_s:.0f}s: HTTP {resp.status} {body[:200]}")
            await asyncio.sleep(0.5)
