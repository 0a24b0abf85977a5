"""Client-overhead benchmark: the project's client and SGLang 0.5.23's `bench_serving` client, against
the same stub SSE server in one run.

    python -m harness.client.overhead [--streams 64 512] [--short-tokens 512] [--long-tokens 32768] ...
    make client-bench

The stub (its own process, pinned to another core than the clients when there are two or more) speaks
SGLang's cumulative `/generate` stream: every event repeats the whole text and token ids so far plus
`meta_info`, then `data: [DONE]`. It steps every active stream in lockstep (one event each per step, as a
server's decode batch does), counts the connections it accepts, and records the monotonic time at which it
wrote each request's last event, keyed by the request's prompt (GET /stats). CLOCK_MONOTONIC is shared by
the processes of one Linux machine, so the client's last-chunk time minus the stub's write time is the
timestamp error: how late the client saw the end of the response.

Per client and case: chunks (events the stub wrote), chunks per client CPU-second (process CPU time of the
client's process during the drive), the timestamp error p50/p99, and the connections the stub accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from tabulate import tabulate

from harness.client.drive import new_session, send_one
from harness.client.requests import Outcome
from harness.client.streams import Parser
from harness.host.machine import CpuPin

HOST = "127.0.0.1"
WORDS = [" the", " token", " value", " é", ' "quoted"', "\n", " x\\y", " 42", " λ", " end", "\t", " speculative"]
HTTP_OK_SSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


# ---------------------------------------------------------------------- the stub's responses


@dataclass
class Response:
    """One response size: the encoded text and ids of `tokens` tokens, with where each token ends, so the
    cumulative event of any step is a few slices (encoded once per size)."""

    tokens: int
    text: str
    text_raw: bytes
    text_ends: list[int]
    ids_raw: bytes
    ids_ends: list[int]

    @classmethod
    def build(cls, tokens: int, seed: int = 0) -> Response:
        rng = random.Random(seed)
        pieces = [rng.choice(WORDS) for _ in range(tokens)]
        raw = [orjson.dumps(p)[1:-1] for p in pieces]
        ids = [str(rng.randrange(151_000)).encode() for _ in range(tokens)]
        return cls(
            tokens=tokens,
            text="".join(pieces),
            text_raw=b"".join(raw),
            text_ends=_ends(raw, 0),
            ids_raw=b",".join(ids),
            ids_ends=_ends(ids, 1),
        )

    def event(self, done: int, final: bool, rid: str) -> list[bytes | memoryview]:
        """The cumulative `/generate` event after `done` tokens as SGLang writes it (orjson, meta_info last),
        in pieces (slices of the encoded text and ids, not copies)."""
        text_end = self.text_ends[done - 1] if done else 0
        ids_end = self.ids_ends[done - 1] if done else 0
        finish = {"type": "length", "length": done} if final else None
        meta = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": 16,
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": done,
            "cached_tokens": 0,
            "spec_verify_ct": 0,
        }
        return [
            b'{"text":"',
            memoryview(self.text_raw)[:text_end],
            b'","output_ids":[',
            memoryview(self.ids_raw)[:ids_end],
            b'],"meta_info":',
            orjson.dumps(meta),
            b"}",
        ]


def _ends(parts: list[bytes], sep: int) -> list[int]:
    ends, at = [], -sep
    for p in parts:
        at += sep + len(p)
        ends.append(at)
    return ends


def sse_chunk(parts: list[bytes | memoryview]) -> bytes:
    """One SSE event (its data in pieces) as one chunk of a chunked HTTP body, joined once."""
    size = len(b"data: \n\n") + sum(len(p) for p in parts)
    return b"".join([b"%x\r\ndata: " % size, *parts, b"\n\n\r\n"])


# ---------------------------------------------------------------------- the stub server


@dataclass
class Stream:
    transport: asyncio.Transport
    response: Response
    prompt: str
    chunk_tokens: int
    done_apart: bool = False  # [DONE] one step after the last event, the end of the body one more step later
    done: int = 0
    tail: list[bytes] = field(default_factory=lambda: [sse_chunk([b"[DONE]"]), b"0\r\n\r\n"])

    def write_next(self, stub: Stub) -> bool:
        """Write the next event; True when the body is complete ([DONE] and the end of the body follow the
        last event in the same write, or one step apart each). The last event's write time is when its last
        byte went to the kernel: at once, or when the transport's buffer drains (StubProtocol.resume_writing)."""
        if self.transport.is_closing():
            return True
        if self.done == self.response.tokens:  # done_apart: [DONE], then the end of the body
            self.transport.write(self.tail.pop(0))
            return not self.tail
        self.done = min(self.response.tokens, self.done + self.chunk_tokens)
        final = self.done == self.response.tokens
        data = sse_chunk(self.response.event(self.done, final, self.prompt))
        if final and not self.done_apart:
            data += sse_chunk([b"[DONE]"]) + b"0\r\n\r\n"
        self.transport.write(data)
        if final:
            events = -(-self.response.tokens // self.chunk_tokens)
            if self.transport.get_write_buffer_size():
                protocol = self.transport.get_protocol()
                assert isinstance(protocol, StubProtocol)  # the stub server's transports serve StubProtocol
                protocol.pending = (self.prompt, events)
            else:
                stub.last_write[self.prompt] = (time.monotonic(), events)
        return final and not self.done_apart


@dataclass
class Stub:
    """Lockstep stepping of every active stream, one batch per `step_s`."""

    step_s: float
    connections: int = 0
    last_write: dict[str, tuple[float, int]] = field(default_factory=dict)
    responses: dict[int, Response] = field(default_factory=dict)
    batches: dict[float, list[Stream]] = field(default_factory=dict)

    def start_stream(self, transport: asyncio.Transport, body: dict) -> None:
        tokens = int(body["sampling_params"]["max_new_tokens"])
        if tokens not in self.responses:
            self.responses[tokens] = Response.build(tokens)
        stream = Stream(
            transport,
            self.responses[tokens],
            str(body["text"]),
            int(body.get("stub_chunk_tokens", 1)),
            bool(body.get("stub_done_apart", False)),
        )
        transport.write(HTTP_OK_SSE)
        step = float(body.get("stub_step_ms", self.step_s * 1000)) / 1000
        if step not in self.batches:
            self.batches[step] = []
            asyncio.get_running_loop().create_task(self.run_batch(step))
        self.batches[step].append(stream)

    async def run_batch(self, step: float) -> None:
        batch = self.batches[step]
        due = time.monotonic()
        while batch:
            batch[:] = [s for s in batch if not s.write_next(self)]
            due += step
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        del self.batches[step]

    def stats(self) -> bytes:
        return orjson.dumps(
            {"connections": self.connections, "last_write": {k: list(v) for k, v in self.last_write.items()}}
        )


class StubProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 with keep-alive: POST /generate (the stream) and GET /stats."""

    def __init__(self, stub: Stub) -> None:
        self.stub = stub
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.pending: tuple[str, int] | None = None  # a last event still in the transport's buffer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=0)  # resume_writing: the buffer has drained to the kernel
        self.stub.connections += 1

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        if self.pending is not None:
            prompt, events = self.pending
            self.stub.last_write[prompt] = (time.monotonic(), events)
            self.pending = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (request := self._next_request()) is not None:
            self._handle(*request)

    def _next_request(self) -> tuple[str, bytes] | None:
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        head = bytes(self.buf[:head_end]).decode("latin-1")
        match = re.search(r"(?im)^content-length:\s*(\d+)", head)
        length = int(match.group(1)) if match else 0
        if len(self.buf) < head_end + 4 + length:
            return None
        body = bytes(self.buf[head_end + 4 : head_end + 4 + length])
        del self.buf[: head_end + 4 + length]
        return head.split(" ", 2)[1], body

    def _handle(self, path: str, body: bytes) -> None:
        assert self.transport is not None
        if path.startswith("/generate"):
            self.stub.start_stream(self.transport, orjson.loads(body))
            return
        reply = self.stub.stats() if path.startswith("/stats") else b"{}"
        status = b"200 OK" if path.startswith("/stats") else b"404 Not Found"
        self.transport.write(
            b"HTTP/1.1 "
            + status
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(reply)).encode()
            + b"\r\n\r\n"
            + reply
        )


async def serve(port: int, step_s: float) -> None:
    stub = Stub(step_s=step_s)
    server = await asyncio.get_running_loop().create_server(lambda: StubProtocol(stub), HOST, port)
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------------- the clients


@dataclass
class Case:
    name: str
    streams: int
    requests: int
    tokens: int
    chunk_tokens: int
    step_ms: float


@dataclass
class Result:
    client: str
    case: str
    streams: int
    requests: int
    tokens: int
    chunk_tokens: int
    step_ms: float
    chunks: int
    cpu_s: float
    wall_s: float
    chunks_per_cpu_s: float
    err_p50_ms: float
    err_p99_ms: float
    err_max_ms: float
    connections: int


@dataclass
class Drive:
    """What a client saw: per prompt, its last-chunk time; the client's CPU seconds and wall time."""

    last_chunk: dict[str, float]
    cpu_s: float
    wall_s: float


def payload(case: Case, prompt: str) -> dict[str, Any]:
    return {
        "text": prompt,
        "sampling_params": {"max_new_tokens": case.tokens, "temperature": 0.0},
        "stream": True,
        "stub_chunk_tokens": case.chunk_tokens,
        "stub_step_ms": case.step_ms,
    }


async def drive_ours(url: str, case: Case, prompts: list[str], expected: str) -> Drive:
    """The project's client (`send_one` on one session, as `drive` runs it)."""
    semaphore = asyncio.Semaphore(case.streams)
    outcomes: dict[str, Outcome] = {}
    cpu, wall = time.process_time(), time.monotonic()
    parser = Parser()
    parsing = asyncio.get_running_loop().create_task(parser.run())
    async with new_session() as session:

        async def one(prompt: str) -> None:
            async with semaphore:
                out = outcomes[prompt] = Outcome(t_scheduled=time.monotonic())
                await send_one(session, url, "generate", payload(case, prompt), 3600, out, parser=parser)

        await asyncio.gather(*(one(p) for p in prompts))
    parsing.cancel()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    for prompt, out in outcomes.items():
        if out.error is not None or out.text != expected or sum(out.chunk_tokens or []) != case.tokens:
            raise RuntimeError(
                f"the project's client got a wrong response ({prompt}): error={out.error!r}, "
                f"{len(out.text)} of {len(expected)} characters, chunk_tokens sum "
                f"{sum(out.chunk_tokens or [])} of {case.tokens}"
            )
    return Drive({p: o.chunk_times[-1] for p, o in outcomes.items()}, cpu, wall)


def sglang_request_func() -> Callable | None:
    """SGLang 0.5.23's `bench_serving` request function for the sglang backend, or None without SGLang."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.benchmark import serving  # noqa: PLC0415  (optional: only in .venv-sglang)
    except ImportError:
        return None
    serving.set_global_args(
        argparse.Namespace(
            temperature=0.0,
            disable_ignore_eos=False,
            top_p=1.0,
            disable_stream=False,
            return_logprob=False,
            return_routed_experts=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            cache_report=False,
        )
    )
    return serving.async_request_sglang_generate


async def drive_sglang(url: str, case: Case, prompts: list[str], expected: str) -> Drive:
    """SGLang's client as its benchmark runs it: one request function call per request, at most
    `streams` in flight (each call opens its own session)."""
    from sglang.benchmark.serving import RequestFuncInput  # noqa: PLC0415  (optional: only in .venv-sglang)

    func = sglang_request_func()
    assert func is not None
    semaphore = asyncio.Semaphore(case.streams)
    extra = {k: v for k, v in payload(case, "").items() if k.startswith("stub_")}
    last: dict[str, float] = {}

    async def one(prompt: str) -> None:
        req = RequestFuncInput(
            prompt=prompt,
            api_url=url + "/generate",
            prompt_len=16,
            output_len=case.tokens,
            model="stub",
            lora_name="",
            image_data=None,
            extra_request_body=extra,
        )
        async with semaphore:
            out = await func(req)
        if not out.success or out.generated_text != expected:
            raise RuntimeError(
                f"SGLang's client got a wrong response ({prompt}): {out.error[:500]!r}, "
                f"{len(out.generated_text)} of {len(expected)} characters"
            )
        last[prompt] = out.start_time + out.latency  # perf_counter is CLOCK_MONOTONIC on Linux

    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.gather(*(one(p) for p in prompts))
    return Drive(last, time.process_time() - cpu, time.monotonic() - wall)


# ---------------------------------------------------------------------- one run


async def get_stats(url: str) -> dict:
    async with aiohttp.ClientSession() as session, session.get(url + "/stats") as resp:
        return orjson.loads(await resp.read())


async def run_case(url: str, client: str, case: Case) -> Result:
    prompts = [f"{client}/{case.name}/{i}" for i in range(case.requests)]
    expected = Response.build(case.tokens).text
    before = (await get_stats(url))["connections"]
    drive = {"sglang": drive_sglang, "ours": drive_ours}[client]
    seen = await drive(url, case, prompts, expected)
    stats = await get_stats(url)
    writes = {p: stats["last_write"][p] for p in prompts}
    errors = np.array([seen.last_chunk[p] - writes[p][0] for p in prompts]) * 1000
    chunks = sum(n for _, n in writes.values())
    return Result(
        client=client,
        case=case.name,
        streams=case.streams,
        requests=case.requests,
        tokens=case.tokens,
        chunk_tokens=case.chunk_tokens,
        step_ms=case.step_ms,
        chunks=chunks,
        cpu_s=seen.cpu_s,
        wall_s=seen.wall_s,
        chunks_per_cpu_s=chunks / seen.cpu_s,
        err_p50_ms=float(np.percentile(errors, 50)),
        err_p99_ms=float(np.percentile(errors, 99)),
        err_max_ms=float(errors.max()),
        connections=stats["connections"] - before - 1,
    )  # the /stats request's own connection


# ---------------------------------------------------------------------- process placement


def pin(pid: int, cpus: set[int]) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, cpus)


def placement() -> tuple[set[int], set[int]]:
    """(stub CPUs, client CPUs): different cores when there are two or more, else none pinned."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return set(), set()
    return {cpus[0]}, {cpus[1]}


def start_stub(step_s: float, cpus: set[int]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.client.overhead", "--serve", "--step-ms", str(step_s * 1000)],
        stdout=subprocess.PIPE,
        text=True,
    )
    pin(proc.pid, cpus)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"the stub server did not start (printed {line!r}); see the error above")
    return proc, f"http://{HOST}:{int(line.split()[1])}"


# ---------------------------------------------------------------------- report


def cases(args: argparse.Namespace) -> list[Case]:
    steps = args.step_ms * len(args.streams) if len(args.step_ms) == 1 else args.step_ms
    if len(steps) != len(args.streams):
        raise SystemExit(f"--step-ms {args.step_ms}: give one value or one per --streams value {args.streams}")
    short = [
        Case(f"short-{s}", s, s * args.waves, args.short_tokens, 1, step)
        for s, step in zip(args.streams, steps, strict=True)
    ]
    long = Case(
        "long", args.long_streams, args.long_requests, args.long_tokens, args.long_chunk_tokens, args.long_step_ms
    )
    return [*short, long] if args.long_tokens else short


MD_HEADERS = (
    "client",
    "streams",
    "tokens/response (per chunk)",
    "stub step ms",
    "requests",
    "chunks",
    "chunks per client CPU-s",
    "CPU-s",
    "wall s",
    "last-chunk error p50 / p99 / max (ms)",
    "connections opened",
)


def table_md(results: list[Result], note: str) -> str:
    rows = [
        [
            r.client,
            r.streams,
            f"{r.tokens} ({r.chunk_tokens})",
            f"{r.step_ms:g}",
            r.requests,
            r.chunks,
            f"{r.chunks_per_cpu_s:,.0f}",
            f"{r.cpu_s:.2f}",
            f"{r.wall_s:.2f}",
            f"{r.err_p50_ms:.2f} / {r.err_p99_ms:.2f} / {r.err_max_ms:.2f}",
            r.connections,
        ]
        for r in results
    ]
    return f"{note}\n\n" + tabulate(rows, headers=MD_HEADERS, tablefmt="pipe", disable_numparse=True) + "\n"


def rich_table(results: list[Result]) -> Table:
    table = Table(title="client overhead (stub SSE server, SGLang cumulative /generate)")
    for col in (
        "client",
        "streams",
        "tokens (per chunk)",
        "chunks",
        "chunks/CPU-s",
        "err p50 ms",
        "err p99 ms",
        "connections",
    ):
        table.add_column(col, justify="left" if col == "client" else "right")
    for r in results:
        table.add_row(
            r.client,
            str(r.streams),
            f"{r.tokens} ({r.chunk_tokens})",
            str(r.chunks),
            f"{r.chunks_per_cpu_s:,.0f}",
            f"{r.err_p50_ms:.2f}",
            f"{r.err_p99_ms:.2f}",
            str(r.connections),
        )
    return table


async def run_all(url: str, clients: list[str], all_cases: list[Case], progress: Progress) -> list[Result]:
    task = progress.add_task("client bench", total=len(clients) * len(all_cases))
    results = []
    for case in all_cases:
        for client in clients:
            progress.update(task, description=f"{client} {case.name}")
            progress.refresh()
            results.append(await run_case(url, client, case))
            progress.advance(task)
            progress.refresh()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.client.overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", action="store_true", help="run the stub server only (used internally)")
    p.add_argument("--streams", type=int, nargs="+", default=[64, 512], help="concurrent streams, short responses")
    p.add_argument("--waves", type=int, default=2, help="requests per stream slot (requests = streams x waves)")
    p.add_argument("--short-tokens", type=int, default=512)
    p.add_argument(
        "--step-ms",
        type=float,
        nargs="+",
        default=[20.0, 40.0],
        help="the stub's step per --streams value (one event per stream per step)",
    )
    p.add_argument("--long-tokens", type=int, default=32768, help="0 skips the long case")
    p.add_argument("--long-streams", type=int, default=4)
    p.add_argument("--long-requests", type=int, default=4)
    p.add_argument("--long-chunk-tokens", type=int, default=8, help="tokens per event (speculative decoding)")
    p.add_argument("--long-step-ms", type=float, default=5.0)
    p.add_argument("--clients", default="ours,sglang", help="comma-separated: ours, sglang")
    p.add_argument("--out", type=Path, default=Path("results/client_bench"))
    args = p.parse_args(argv)
    if args.serve:
        asyncio.run(serve(0, args.step_ms[0] / 1000))
        return 0
    console = Console()
    clients = [c for c in args.clients.split(",") if c]
    bad = [c for c in clients if c not in ("ours", "sglang")]
    if bad or not clients:
        p.error(f"--clients={args.clients!r}: give ours and/or sglang")
    note = f"Python {sys.version.split()[0]}, aiohttp {aiohttp.__version__}, orjson {orjson.__version__}"
    if "sglang" in clients and sglang_request_func() is None:
        clients.remove("sglang")
        console.print(
            "[bold yellow]SGLang is not importable here: running the project's client alone "
            "(make client-bench runs in .venv-sglang when it exists)"
        )
        note += "; SGLang's client not run (SGLang not importable)"
    elif "sglang" in clients:
        import sglang  # noqa: PLC0415  (optional: only in .venv-sglang)

        note += f", SGLang {sglang.__version__} (`sglang.benchmark.serving.async_request_sglang_generate`)"
    stub_cpus, client_cpus = placement()
    note += f"; stub on CPUs {sorted(stub_cpus) or 'unpinned'}, clients on CPUs {sorted(client_cpus) or 'unpinned'}"
    proc, url = start_stub(args.step_ms[0] / 1000, stub_cpus)
    own = CpuPin(sorted(client_cpus))  # this process, for the drive only (main() may run inside a larger program)
    own.acquire()
    try:
        with Progress(console=console, auto_refresh=False) as progress:
            results = asyncio.run(run_all(url, clients, cases(args), progress))
    finally:
        own.release()
        proc.terminate()
        proc.wait(timeout=10)
    out_dir = args.out / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "python -m harness.client.overhead " + " ".join(argv if argv is not None else sys.argv[1:])
    (out_dir / "client_bench.md").write_text(f"`{command}`\n\n" + table_md(results, note))
    (out_dir / "client_bench.json").write_bytes(
        orjson.dumps(
            {
                "command": command,
                "note": note,
                "args": {k: str(v) for k, v in vars(args).items()},
                "results": [asdict(r) for r in results],
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    console.print(rich_table(results))
    console.print(note)
    console.print(f"table written to {out_dir / 'client_bench.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
