"""The argv conformance check of the llama.cpp backend: every planned llama-server command parsed by the binary
that will run it (harness.backends.llamacpp.parse_run: its own parser, then `--version`), before a dry run says
"ok" and before a real run launches anything. A refused flag exits 2 naming the flag, llama-server's words and the
config key it came from; `server.preflight=skip` goes on unchecked and says so.

What it checks: that the binary is llama-server (its `--version` answers as llama.cpp's builds do), every flag llama-server knows, removed flags (`--draft-max`), choices (`--spec-type`) and numbers,
as its parser does. Not checked: what needs the model (its vocabulary against a draft's, context sizes, memory).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from harness.server.config import ServerConfig
from harness.server.launch import PlannedLaunch

PARSE_TIMEOUT_S = 30.0
EXIT_CODE = 2
WHAT_IS_CHECKED = (
    "llama-server's own argument parser (unknown and removed flags, choices, numbers), run with "
    "--version after the command's flags; not checked: what needs the model file"
)


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


@dataclass(frozen=True)
class LlamaPreflight:
    """The binary's verdict on each planned launch (same order)."""

    binary: str
    launches: list[PlannedLaunch]
    checks: list[ArgvCheck]
    not_llama_server: str | None = None  # why the binary is not llama-server (then nothing was parsed by it)

    @property
    def ok(self) -> bool:
        return self.not_llama_server is None and all(c.ok for c in self.checks)

    def line(self, run_id: str) -> str:
        """One line for the dry run."""
        launch, check = next(
            (lc, c) for lc, c in zip(self.launches, self.checks, strict=True) if lc.run.run_id == run_id
        )
        if self.not_llama_server:
            return f"REFUSED: {self.not_llama_server}"
        return "accepted by llama-server's parser" if check.ok else f"REFUSED: {self.problem(launch, check)}"

    @staticmethod
    def problem(launch: PlannedLaunch, check: ArgvCheck) -> str:
        named = f"{check.flag} (from {launch.source_of(check.flag)})" if check.flag else "(llama-server names no flag)"
        return f"{named}: {check.message}"

    def verdict(self, console: Console) -> int:
        return print_verdict(self, console)

    def problems(self) -> list[str]:
        if self.not_llama_server:
            return [self.not_llama_server]
        runs: dict[str, list[str]] = {}
        for launch, check in zip(self.launches, self.checks, strict=True):
            if not check.ok:
                runs.setdefault(self.problem(launch, check), []).append(launch.run.run_id)
        return [f"{problem} [runs: {', '.join(ids)}]" for problem, ids in runs.items()]


def run_check(server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> LlamaPreflight | None:
    """The binary's verdict on every planned argv, or None when skipped (said so)."""
    if server.preflight == "skip":
        console.print(
            "[bold yellow]argv preflight SKIPPED (server.preflight=skip)[/]: the commands were NOT "
            "checked by llama-server",
            highlight=False,
        )
        return None
    binary = launches[0].launch.argv[0]
    argvs = [tuple(launch.launch.argv[1:]) for launch in launches]
    console.print(f"argv preflight: {len(set(argvs))} distinct command(s) parsed by {binary} ...", highlight=False)
    problem = identity_problem(binary)
    if problem:  # /bin/true "accepts" every argv: only llama-server's own parser counts
        return LlamaPreflight(binary, launches, [ArgvCheck(a, False, problem, None) for a in argvs], problem)
    return LlamaPreflight(binary, launches, check_argvs(binary, argvs))


def print_verdict(report: LlamaPreflight, console: Console) -> int:
    """The conclusion; the exit code it implies (0 or EXIT_CODE)."""
    if report.ok:
        console.print(
            f"[bold green]argv preflight passed[/]: {len({c.args for c in report.checks})} distinct "
            f"command(s) accepted by {report.binary}. Checked: {WHAT_IS_CHECKED}.",
            highlight=False,
        )
        return 0
    console.print("[bold red]argv preflight FAILED[/] (server.preflight=require):", highlight=False)
    for problem in report.problems():
        console.print(f"  - {escape(problem)}", highlight=False, soft_wrap=True)
    console.print(
        "  llama-server would not start with these commands: fix the flag in the config key named above",
        highlight=False,
    )
    return EXIT_CODE
