"""The backend interface: everything the runner, the plan, the dry run and the report need to know of one engine.

Each engine is one module of harness/backends/ holding a `Backend` subclass, found by its name (`server.backend`, the
`server=` config group) through `harness.backends.get`. A backend says: the command that starts its server (argv from
the config), the check of that command by the engine's own parser (the argv preflight), its readiness and identity
routes, the protocol the client speaks to it (request bodies, stream parsing into records: a `Dialect`), the engine's
own counters (its Prometheus /metrics through a `CounterMap`), what code it runs (the provenance probe), and what it
cannot measure (said in the dry run and the manifest). Nothing outside harness/backends/ asks which engine it is.

A backend imports the shared parts (harness.server, harness.client, harness.contract, harness.validation), never the
runner; docs/backends.md "Adding a backend" walks through writing one.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

from rich.console import Console

from harness.backends.counters import CounterMap
from harness.client.config import ClientConfig
from harness.client.dialect import Dialect
from harness.contract import Manifest, ServerBinary, ServerCode
from harness.server.config import ArmConfig, ServerConfig
from harness.server.control import get_json, get_text
from harness.server.launch import Launch, PlannedLaunch
from harness.server.provenance import probe_server_code
from harness.validation import ConfigError


class Preflight(Protocol):
    """A backend's verdict on the planned commands: one line per run for the dry run, and the conclusion."""

    def line(self, run_id: str) -> str: ...

    def verdict(self, console: Console) -> int:
        """Print the conclusion; the exit code it implies (0: go on)."""
        ...


class Backend(ABC):
    """One engine. Class attributes are its facts; methods what differs in how it is driven."""

    name: ClassVar[str]  # server.backend
    title: ClassVar[str]  # in words, for messages ("llama.cpp's llama-server")
    native: ClassVar[bool] = False  # a binary: no interpreter to ask what code it runs (its file is hashed instead)
    ready_path: ClassVar[str] = "/health_generate"  # 200 once the server serves
    info_path: ClassVar[str] = "/server_info"  # what it runs, read after readiness and at the end of every run
    routes: ClassVar[tuple[str, ...]] = ("generate", "chat")  # the client.route values it serves
    flushes_cache: ClassVar[bool] = True  # has /flush_cache (experiment.warmup.flush_cache)
    seed_max: ClassVar[int | None] = None  # the largest per-request seed it takes (None: 64 bits)
    counters: ClassVar[CounterMap | None] = None  # its /metrics counters, read around each measured window
    attaches: ClassVar[bool] = False  # can measure a server already running at server.url
    cannot_measure: ClassVar[tuple[str, ...]] = ()  # what a campaign on it does not measure, in words

    # ------------------------------------------------------------------ the config

    def check_config(self, server: ServerConfig, client: ClientConfig, flush_cache: bool) -> None:
        """ConfigError, before anything runs, for a route or a setting this engine does not serve."""
        if server.url and not self.attaches:
            raise ConfigError(
                f"server.url={server.url}: backend {self.name} launches its own server per run (what code it runs is "
                "recorded); leave server.url unset, or use server=openai for a server already running"
            )
        if client.route not in self.routes:
            raise ConfigError(
                f"{self.title} does not serve client.route={client.route} (server.backend={self.name}); "
                f"use one of: {', '.join('client.route=' + r for r in self.routes)}"
            )
        if flush_cache and not self.flushes_cache:
            raise ConfigError(
                f"experiment.warmup.flush_cache=true: {self.title} has no /flush_cache; "
                "set experiment.warmup.flush_cache=false"
            )

    # ------------------------------------------------------------------ the command

    @abstractmethod
    def launch_argv(self, server: ServerConfig, arm: ArmConfig, port: int | str, slots: int) -> list[str]:
        """The command up to the seed flag (then server.args and the arm's follow). `port`: harness.server.launch's
        PORT_FIELD in a planned launch (filled in when the run starts: write it with str()). `slots`: the requests
        the server must hold at once (client.concurrency)."""

    def flag_keys(self) -> list[tuple[str, str]]:
        """(flag, config key) of the flags launch_argv writes."""
        return [("--model-path", "server.model_path"), ("--host", "server.host"), ("--port", "server.port")]

    def preflight(self, server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> Preflight | None:
        """Each planned command checked by the engine's own parser, or None when it is not (said so)."""
        console.print(f"argv preflight: not applicable to backend {self.name}", highlight=False)
        return None

    # ------------------------------------------------------------------ what runs

    def describe_code(self, launch: Launch) -> ServerCode | ServerBinary | None:
        """What code the server will run (the manifest's server_code or server_binary): asked of its interpreter
        (ProvenanceError when it cannot say); None when the backend cannot know (a server it did not launch)."""
        return probe_server_code(launch)

    def declared_draft_length(self, argv: list[str]) -> int | None:
        """The draft tokens per verify step that the command declares, or None (none declared, or not fixed)."""
        return None

    def python(self, server: ServerConfig, arm: ArmConfig) -> str:
        return arm.python or server.python or sys.executable

    # ------------------------------------------------------------------ at run time

    async def read_facts(self, launch: Launch, manifest: Manifest, seeded: bool) -> None:
        """After readiness: what the server says it runs (manifest server_info, model_info) and whether it honours
        per-request seeds (`seeded`: the requests carry seeds). ServerError when it is not what was launched."""
        base = launch.base_url
        manifest.server_info = await get_json(base, "/server_info") or await get_json(base, "/get_server_info")
        manifest.model_info = await get_json(base, "/model_info") or await get_json(base, "/get_model_info")
        honoured = bool((manifest.server_info or {}).get("enable_deterministic_inference", False))
        manifest.seeds_honoured = honoured or not seeded

    def incremental(self, server_info: dict | None) -> bool:
        """Whether its /generate stream carries only the new text in each chunk."""
        return bool((server_info or {}).get("incremental_streaming_output"))

    @property
    @abstractmethod
    def dialect(self) -> Dialect:
        """How the client talks to it."""

    def counter_map(self, server: ServerConfig) -> CounterMap | None:
        """Its counters (read around each measured window), or None when it has none."""
        return self.counters

    async def read_counters(self, server: ServerConfig, base_url: str) -> dict[str, float] | None:
        """Its counters now (the engine's names), or None when it has none."""
        counters = self.counter_map(server)
        return counters.read(await get_text(base_url, counters.path)) if counters is not None else None
