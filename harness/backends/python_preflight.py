"""The argv preflight: every planned server command, checked by the server code that will run it.

The server runs under its own interpreter (`server.python` or the arm's `python:`), which may hold
another SGLang than the harness's, or none, and a source arm imports its own snapshot's code. So the check
runs there: one subprocess per interpreter (and environment) runs the backend's probe, which feeds each argv
to the server's own parser: for SGLang `sglang_argv_probe.py` (its parser and the checks SGLang runs before it
needs a checkpoint or a GPU; that file says which; the harness never imports SGLang for this), for the embedded
server `harness/engine/argv_probe.py` (`harness.engine.args`, as `python -m harness.engine` starts).

`server.preflight=require` (the default): a refused argv, or one that could not be checked (no such
interpreter, no SGLang in it, a probe that crashed), fails the dry run and stops a real run before
anything is launched. `server.preflight=skip`: nothing is checked, and the dry run says so.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.markup import escape

from harness.server.ask import AskError, Question, ask_all
from harness.server.config import ServerConfig
from harness.server.launch import PlannedLaunch
from harness.server.redact import Secrets

PROBES = {
    "sglang": Path(__file__).with_name("sglang_argv_probe.py"),
    "embedded": Path(__file__).parents[1] / "engine" / "argv_probe.py",  # run by path, never imported
}
ENGINE_MODULE = "harness.engine"  # the embedded server's module: its parser is what the embedded probe runs
OWNERS = {"sglang": "SGLang", "embedded": "the embedded server"}  # whose checks refused
RESULT_MARK = "SPECBENCH_PREFLIGHT "
PROBE_TIMEOUT_S = 300.0
EXIT_CODE = 2
PLACEMENT_ENV = ("CUDA_VISIBLE_DEVICES",)  # per-run placement, not part of what is checked
PROBE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
# Only SGLang's refusal fails the preflight. "error" is a stage that crashed: running SGLang's hook
# outside its pipeline leaves some fields unresolved (e.g. page_size for NGRAM), so a crash there says
# "not checked past this point", like "stopped", and is printed as such.
FAILING = ("refused",)
StageStatus = Literal["passed", "refused", "stopped", "unavailable", "error"]  # a probe's verdict on one stage
FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")
FIELD = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
WHAT_IS_CHECKED = {
    "sglang": "SGLang's own argument parser (unknown flags, choices, types), its model-independent validation, and "
    "its speculative-decoding checks as on a CUDA host up to the first read of a checkpoint; not checked: "
    "what needs the checkpoint or a GPU (model-dependent defaults and limits, kernels, memory)",
    "embedded": "the embedded server's own parser (unknown flags, choices, types) and the checks it makes before it "
    "loads a model (algorithms, verify windows, ranges, the device); not checked: loading the model",
}


class PreflightError(RuntimeError):
    """The probe could not answer for an interpreter (missing, no SGLang, crashed, timed out)."""


@dataclass(frozen=True)
class PlannedArgv:
    """One planned server command, and which config key each of its tokens comes from."""

    label: str  # the run id
    arm: str
    python: str
    args: tuple[str, ...]  # what follows `-m MODULE`
    env: tuple[tuple[str, str], ...]  # the run's environment overrides, placement left out
    sources: tuple[tuple[str, str], ...] = ()  # (token, config key)

    def source_of(self, flag: str) -> str:
        return dict(self.sources).get(flag, "the launch command (harness/backends/launch.py build_launch)")


@dataclass(frozen=True)
class Stage:
    stage: str  # parse | model_independent | speculative
    status: StageStatus
    message: str = ""
    where: str | None = None

    def describe(self) -> str:
        if self.status == "stopped":
            return f"{self.stage} passed up to {self.where}, which reads {self.message}"
        if self.status == "error":
            return f"{self.stage} not completed (the probe's call crashed: {self.message})"
        where = f" at {self.where}" if self.where else ""
        detail = f": {self.message}" if self.message and self.status != "refused" else ""
        return f"{self.stage} {self.status}{where}{detail}"


@dataclass(frozen=True)
class Outcome:
    """What the preflight found for one planned argv."""

    planned: PlannedArgv
    stages: tuple[Stage, ...] = ()
    version: str | None = None  # of the checker: SGLang's version, or where the embedded server's parser is from
    unchecked: str | None = None  # why the argv was not checked at all
    checker: str = "SGLang"  # what checked it: SGLang | the embedded server's parser
    owner: str = "SGLang"  # whose check refused, in the problem's words

    @property
    def by(self) -> str:
        return f"SGLang {self.version}" if self.checker == "SGLang" else f"{self.checker} ({self.version})"

    @property
    def failing_stage(self) -> Stage | None:
        return next((s for s in self.stages if s.status in FAILING), None)

    @property
    def ok(self) -> bool:
        return self.unchecked is None and self.failing_stage is None

    @property
    def flag(self) -> str | None:
        stage = self.failing_stage
        return named_flag(stage.message, self.planned.args) if stage else None

    def line(self) -> str:
        """One line for the dry run."""
        if self.unchecked:
            return f"NOT checked: {self.unchecked}"
        by = self.by
        stage = self.failing_stage
        if stage is None:
            return f"accepted by {by} ({'; '.join(s.describe() for s in self.stages)})"
        return f"REFUSED by {by}: {self.problem()}"

    def problem(self) -> str | None:
        """The error (None when the argv passed): the flag, where it comes from, SGLang's words."""
        if self.unchecked:
            return f"not checked: {self.unchecked}"
        stage = self.failing_stage
        if stage is None:
            return None
        flag = self.flag
        named = f"{flag} (from {self.planned.source_of(flag)})" if flag else f"({self.owner} names no flag)"
        where = f", in {stage.where}" if stage.where else ""
        return f"{named}: refused by {self.owner}'s {stage.stage} check{where}: {stage.message}"


@dataclass
class PreflightReport:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def outcome_of(self, label: str) -> Outcome:
        return next(o for o in self.outcomes if o.planned.label == label)

    def problems(self) -> list[str]:
        """Each distinct problem once, with the runs it concerns."""
        runs: dict[str, list[str]] = {}
        for o in self.outcomes:
            if (problem := o.problem()) is not None:  # exactly the outcomes that are not ok
                runs.setdefault(problem, []).append(o.planned.label)
        return [f"{problem} [runs: {', '.join(labels)}]" for problem, labels in runs.items()]

    def distinct_argvs(self) -> int:
        return len({(o.planned.python, o.planned.env, o.planned.args) for o in self.outcomes})

    def limits(self) -> list[str]:
        """The distinct points past which some command was not checked."""
        return sorted({s.describe() for o in self.outcomes for s in o.stages if s.status != "passed"})

    def checked_by(self) -> list[str]:
        return sorted({f"{o.by} in {o.planned.python}" for o in self.outcomes if o.version})


def named_flag(message: str, args: Sequence[str]) -> str | None:
    """The flag an SGLang error is about: a --flag of the argv named in it, else a field name that is one."""
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    named = FLAG.findall(message)
    for flag in named:
        if flag in given:
            return flag
    for word in FIELD.findall(message):
        flag = "--" + word.replace("_", "-")
        if flag in given:
            return flag
    return named[0] if named else None


def planned_argv(launch: PlannedLaunch) -> PlannedArgv:
    """A planned launch as the probe checks it: the interpreter, what follows `-m MODULE` (any port parses
    the same as the real one), the environment without its placement."""
    argv = launch.launch.argv
    env = tuple(sorted((k, v) for k, v in launch.launch.env_overrides.items() if k not in PLACEMENT_ENV))
    return PlannedArgv(
        label=launch.run.run_id,
        arm=launch.run.arm,
        python=argv[0],
        args=tuple(argv[3:]),
        env=env,
        sources=launch.flag_keys,
    )


def _question(
    backend: str, python: str, env: dict[str, str], argvs: list[tuple[str, ...]], timeout_s: float, cwd: Path | None
) -> Question:
    return Question(
        python,
        PROBES[backend],
        [],
        RESULT_MARK,
        {**env, **PROBE_ENV},
        timeout_s,
        stdin=json.dumps({"argvs": [list(a) for a in argvs]}),
        cwd=cwd,
        what="the argv preflight",
    )


def _checked(python: str, answer: dict | AskError) -> dict:
    """The probe's answer ({"sglang_version" or "checker" and "version", "results"}), or PreflightError saying why
    there is none."""
    if isinstance(answer, AskError):
        raise PreflightError(str(answer))
    if "error" in answer:
        raise PreflightError(f"{answer['error']} (interpreter {python})")
    return answer


def check_planned(
    items: list[PlannedArgv],
    timeout_s: float = PROBE_TIMEOUT_S,
    backend: str = "sglang",
    cwds: dict[str, Path | None] | None = None,
) -> PreflightReport:
    """Check the items, one probe per (interpreter, environment), each distinct argv once; the probes run side
    by side (two arms on two SGLang installs take the time of one). `cwds`: each arm's working directory (a
    source arm's snapshot)."""
    groups: dict[tuple[str, tuple], list[PlannedArgv]] = {}
    for item in items:
        groups.setdefault((item.python, item.env), []).append(item)
    argvs = {key: list(dict.fromkeys(i.args for i in group)) for key, group in groups.items()}
    answers = ask_all(
        [
            _question(backend, python, dict(env), argvs[(python, env)], timeout_s, (cwds or {}).get(group[0].arm))
            for (python, env), group in groups.items()
        ]
    )
    found: dict[tuple, Outcome] = {}
    owner = OWNERS[backend]
    for ((python, env), group), answer in zip(groups.items(), answers, strict=True):
        try:
            checked = _checked(python, answer)
        except PreflightError as exc:
            found.update(
                {(python, env, a): Outcome(group[0], unchecked=str(exc), owner=owner) for a in argvs[(python, env)]}
            )
            continue
        checker, version = checked.get("checker", "SGLang"), checked.get("version", checked.get("sglang_version"))
        for args, result in zip(argvs[(python, env)], checked["results"], strict=True):
            secrets = Secrets.of(dict(env), [list(args)])  # a refusal quotes the argv: --api-key's value too
            stages = tuple(
                Stage(**{**s, "message": secrets.scrub(str(s.get("message") or ""))}) for s in result["stages"]
            )
            found[(python, env, args)] = Outcome(group[0], stages, version, checker=checker, owner=owner)
    return PreflightReport([_for(found[(i.python, i.env, i.args)], i) for i in items])


def _for(outcome: Outcome, item: PlannedArgv) -> Outcome:
    return dataclasses.replace(outcome, planned=item)


def run_preflight(server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> PreflightReport | None:
    """The report for these planned launches (the backend's probe: PROBES), or None when skipped (said so)."""
    owner = OWNERS[server.backend]
    if server.preflight == "skip":
        console.print(
            "[bold yellow]argv preflight SKIPPED (server.preflight=skip)[/]: the commands were NOT "
            f"checked against {owner}",
            highlight=False,
        )
        return None
    items = [planned_argv(launch) for launch in launches]
    pythons = sorted({i.python for i in items})
    console.print(
        f"argv preflight: checking {len({(i.python, i.env, i.args) for i in items})} distinct command(s) "
        f"with {owner} of {', '.join(pythons)} ...",
        highlight=False,
    )
    return check_planned(
        items,
        timeout_s=min(PROBE_TIMEOUT_S, server.ready_timeout_s),  # a server that must start within it, asked
        backend=server.backend,
        cwds={p.run.arm: p.launch.cwd for p in launches},
    )


def print_verdict(report: PreflightReport, console: Console, backend: str = "sglang") -> int:
    """The preflight's conclusion; the exit code it implies (0 or EXIT_CODE)."""
    owner = OWNERS[backend]
    if report.ok:
        console.print(
            f"[bold green]argv preflight passed[/]: {report.distinct_argvs()} distinct command(s) accepted "
            f"by {'; '.join(report.checked_by())}. Checked: {WHAT_IS_CHECKED[backend]}.",
            highlight=False,
        )
        for limit in report.limits():
            console.print(f"  not checked past: {escape(limit)}", highlight=False, soft_wrap=True)
        return 0
    console.print("[bold red]argv preflight FAILED[/] (server.preflight=require):", highlight=False)
    for problem in report.problems():
        console.print(f"  - {escape(problem)}", highlight=False, soft_wrap=True)
    if any(o.unchecked for o in report.outcomes):
        console.print(
            "  the commands were NOT checked: point server.python (or the arm's python) at the interpreter "
            "that will run the server, or set server.preflight=skip to go on unchecked",
            highlight=False,
        )
    if any(o.failing_stage for o in report.outcomes):
        console.print(
            f"  {owner} would not start with these commands: fix the flag in the config key named above",
            highlight=False,
        )
    return EXIT_CODE


@dataclass(frozen=True)
class PythonPreflight:
    """The preflight of a Python server (the backends' Preflight): each run's line, the verdict."""

    report: PreflightReport
    backend: str

    def line(self, run_id: str) -> str:
        return self.report.outcome_of(run_id).line()

    def verdict(self, console: Console) -> int:
        return print_verdict(self.report, console, self.backend)


def python_preflight(server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> PythonPreflight | None:
    report = run_preflight(server, launches, console)
    return PythonPreflight(report, server.backend) if report is not None else None
