"""The argv conformance check of the llama.cpp backend: every planned llama-server command parsed by the binary
that will run it (harness.runner.server.llamacpp.parse_run: its own parser, then `--version`), before a dry run says
"ok" and before a real run launches anything. A refused flag exits 2 naming the flag, llama-server's words and the
config key it came from; `server.preflight=skip` goes on unchecked and says so.

What it checks: that the binary is llama-server (its `--version` answers as llama.cpp's builds do), every flag llama-server knows, removed flags (`--draft-max`), choices (`--spec-type`) and numbers,
as its parser does. Not checked: what needs the model (its vocabulary against a draft's, context sizes, memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from harness.runner.server.config import ServerConfig
from harness.runner.server.llamacpp import ArgvCheck, check_argvs, identity_problem
from harness.runner.server.spec import PlannedLaunch

EXIT_CODE = 2
WHAT_IS_CHECKED = (
    "llama-server's own argument parser (unknown and removed flags, choices, numbers), run with "
    "--version after the command's flags; not checked: what needs the model file"
)


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
    binary = launches[0].spec.argv[0]
    argvs = [tuple(launch.spec.argv[1:]) for launch in launches]
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


def preflight_before_launch(server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> int:
    """A real run's fail-fast check before anything is launched: 0 to go on."""
    report = run_check(server, launches, console)
    if report is None:
        return 0
    code = print_verdict(report, console)
    if code:
        console.print("no server was launched", highlight=False)
    return code
