"""Any server speaking the OpenAI-compatible API (`server.backend=openai`, `server=openai`): vLLM, TGI, a hosted
endpoint, llama-server. Routes `/v1/completions` (client.route=completions: the item's raw prompt) and
`/v1/chat/completions` (client.route=chat: its messages), streamed or not; readiness `/v1/models`.

The server is launched per run by `server.command` (`{host}`, `{port}` and `{model}` filled in), or it is already
running at `server.url`: then the campaign did not launch it, cannot pin its code (manifest `server_url`, the audit's
code check says so) and its log is not kept. What the records hold: the text, the chunk times (TTFT, ITL, throughput),
`usage` (prompt and completion tokens); output identity compares text. The API carries no per-request speculative
counts: acceptance comes from the server's Prometheus counters over each measured window, through `server.counters`
(the harness' counter -> the server's metric; `server=openai_vllm` names vLLM's), checked by the audit against the
records' token sums and turned into an acceptance length (harness/backends/counters.py acceptance_length).
"""

from __future__ import annotations

from typing import Any

import aiohttp
from rich.console import Console

from harness.backends.base import Backend, Preflight
from harness.backends.counters import CounterMap
from harness.client.config import ClientConfig, SamplingConfig
from harness.client.dialect import Dialect, Route
from harness.client.drive import read_body, single_chunk
from harness.client.requests import Outcome, RequestPlan, StreamError
from harness.client.sse import parse_object
from harness.client.streams import (
    Chunks,
    Parser,
    choice_text,
    completion_count,
    first_choice,
    joined_response,
    read_stream,
)
from harness.contract import Manifest, ServerBinary, ServerCode
from harness.server.config import ArmConfig, ServerConfig
from harness.server.control import get_json
from harness.server.launch import Launch, PlannedLaunch
from harness.server.redact import clip
from harness.validation import ConfigError

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def payload(route: str, sampling: SamplingConfig, client: ClientConfig, request: RequestPlan, model: str) -> dict:
    """The body of one request: the OpenAI fields only (a server may refuse others), the seed when seeded."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stream": client.stream,
    }
    if route == "chat":
        body["messages"] = request.item.messages
    else:
        body["prompt"] = request.item.prompt
    if client.stream:
        body["stream_options"] = {"include_usage": True}
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if request.request_seed is not None:
        body["seed"] = request.request_seed
    return body


def _count(usage: Any, key: str) -> int | None:
    value = (usage or {}).get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def meta_info(reason: Any, usage: Any) -> dict[str, Any]:
    """The record's counts of one response, from its `usage` (kept under `raw`); StreamError without one."""
    completion = _count(usage, "completion_tokens")
    if completion is None:
        raise StreamError(f"the response carries no usage.completion_tokens: {clip(str(usage), 200)}")
    return {
        "finish_reason": {"type": reason} if isinstance(reason, str) else reason,
        "prompt_tokens": _count(usage, "prompt_tokens"),
        "completion_tokens": completion,
        "raw": {"usage": usage},
    }


class OpenAIStream:
    """One streamed response: its text, finish reason and final usage; each chunk that carried text is one chunk
    (the API says no token count per chunk: ITL per chunk, tokens from usage)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.reason: Any = None
        self.usage: Any = None
        self.chunks = Chunks()

    def feed(self, data: bytes, t: float) -> None:
        chunk = parse_object(data)
        if chunk.get("error") is not None:
            raise StreamError(f"the server sent an error in the stream: {clip(str(chunk['error']), 300)}")
        self.usage = chunk.get("usage") or self.usage
        carried = False
        for choice in chunk.get("choices") or []:
            content, thought = choice_text(choice)
            carried = carried or bool(content or thought)
            self.parts.append(content)
            self.reasoning.append(thought)
            if choice.get("finish_reason") is not None:
                self.reason = choice["finish_reason"]
        if carried:
            self.chunks.add(t, True, None)

    def finish(self, out: Outcome) -> None:
        out.text = joined_response("".join(self.reasoning), "".join(self.parts))
        out.meta_info = meta_info(self.reason, self.usage)
        self.chunks.store(out)


async def read_response(
    resp: aiohttp.ClientResponse, stream: bool, incremental: bool, out: Outcome, parser: Parser | None
) -> None:
    if stream:
        await read_stream(resp, OpenAIStream(), out, parser)
        return
    body = await read_body(resp)
    choice = first_choice(body)
    content, thought = choice_text(choice)
    out.text = joined_response(thought, content)
    out.meta_info = meta_info(choice.get("finish_reason"), body.get("usage"))
    single_chunk(out, completion_count(out.meta_info))


# one connection per request: a server may close a kept-alive connection between requests (llama-server does), and
# a request sent on it would fail as "Server disconnected"; both arms pay the same connect (loopback: microseconds)
DIALECT = Dialect("openai", {route: Route(path, read_response) for route, path in PATHS.items()}, payload, True)


class OpenAI(Backend):
    name = "openai"
    title = "an OpenAI-compatible server"
    ready_path = "/v1/models"
    info_path = "/v1/models"
    routes = ("completions", "chat")
    flushes_cache = False
    attaches = True
    cannot_measure = (
        "per-request speculative counts (the OpenAI API has none): acceptance only per run, from the server's "
        "Prometheus counters named in server.counters",
        "a server already running (server.url, an arm's url): what code it runs (the campaign did not launch it)",
        "output token ids (outputs are compared as text)",
    )

    def check_config(self, server: ServerConfig, client: ClientConfig, flush_cache: bool) -> None:
        super().check_config(server, client, flush_cache)
        if bool(server.url) == bool(server.command):
            raise ConfigError(
                "server=openai needs exactly one of server.url (a server already running: "
                "server.url=http://HOST:PORT, or one per arm: experiment.arms.N.url) or server.command (the command "
                "that starts one per run, with {port}; "
                f"given: url={server.url!r}, command={list(server.command)!r})"
            )
        self.counter_map(server)  # (a ConfigError naming an unknown counter)

    def launch_argv(self, server: ServerConfig, arm: ArmConfig, port: int | str, slots: int) -> list[str]:
        fill = {"host": server.host, "port": str(port), "model": server.model_path}
        try:
            return [str(token).format(**fill) for token in server.command]
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"server.command {list(server.command)!r}: {exc!r}; only {{host}}, {{port}} and {{model}} are "
                "filled in (write a literal brace twice)"
            ) from None

    def flag_keys(self) -> list[tuple[str, str]]:
        return []

    def preflight(self, server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> Preflight | None:
        console.print(
            "argv preflight: not applicable to backend openai (its server's parser is not known to the harness; "
            "a refused command fails the run's readiness, with its log)",
            highlight=False,
        )
        return None

    def describe_code(self, launch: Launch) -> ServerCode | ServerBinary | None:
        return None  # a command of the user's or a server at a URL: what it runs is not the harness' to read

    async def read_facts(self, launch: Launch, manifest: Manifest, seeded: bool) -> None:
        """/v1/models (model_info); the server's word on seeds is unknown: honoured only when unseeded."""
        manifest.model_info = await get_json(launch.base_url, "/v1/models")
        manifest.seeds_honoured = not seeded

    def incremental(self, server_info: dict | None) -> bool:
        return True

    def counter_map(self, server: ServerConfig) -> CounterMap | None:
        return CounterMap(dict(server.counters)) if server.counters else None

    @property
    def dialect(self) -> Dialect:
        return DIALECT


BACKEND = OpenAI()
