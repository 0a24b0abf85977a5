"""The argv preflight: every planned SGLang server command, checked by the SGLang that will run it.

The server runs under its own interpreter (`server.python` or the arm's `python:`), which may hold
another SGLang than the harness's, or none. So the check runs there: one subprocess per interpreter
(and environment) runs `sglang_argv_probe.py`, which feeds each argv to SGLang's own parser and to
the checks SGLang runs before it needs a checkpoint or a GPU (that file says which). The harness
never imports SGLang for this.

`server.preflight=require` (the default): a refused argv, or one that could not be checked (no such
interpreter, no SGLang in it, a probe that crashed), fails the dry run and stops a real run before
anything is launched. `server.preflight=skip`: nothing is checked, and the dry run says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from harness.server.ask import AskError, Question, ask_all
from harness.server.config import ServerConfig
from harness.server.spec import PlannedLaunch

PROBE = Path(__file__).with_name("sglang_argv_probe.py")
RESULT_MARK = "SPECBENCH_PREFLIGHT "
PROBE_TIMEOUT_S = 300.0
EXIT_CODE = 2
PLACEMENT_ENV = ("CUDA_VISIBLE_DEVICES",)  # per-run placement, not part of what is checked
PROBE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
# Only SGLang's refusal fails the preflight. "error" is a stage that crashed: running SGLang's hook
# outside its pipeline leaves some fields unresolved (e.g. page_size for NGRAM), so a crash there says
# "not checked past this point", like "stopped", and is printed as such.
FAILING = ("refused",)
FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")
FIELD = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
WHAT_IS_CHECKED = (
    "SGLang's own argument parser (unknown flags, choices, types), its model-independent validation, and "
    "its speculative-decoding checks as on a CUDA host up to the first read of a checkpoint; not checked: "
    "what needs the checkpoint or a GPU (model-dependent defaults and limits, kernels, memory)")


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
        return dict(self.sources).get(flag, "the launch command (harness/server/spec.py build_spec)")


@dataclass(frozen=True)
class Stage:
    stage: str  # parse | model_independent | speculative
    status: str  # passed | refused | stopped | unavailable | error
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
    sglang_version: str | None = None
    unchecked: str | None = None  # why the argv was not checked at all

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
        by = f"SGLang {self.sglang_version}"
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
        named = f"{flag} (from {self.planned.source_of(flag)})" if flag else "(SGLang names no flag)"
        where = f", in {stage.where}" if stage.where else ""
        return f"{named}: refused by SGLang's {stage.stage} check{where}: {stage.message}"


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
        return sorted({f"SGLang {o.sglang_version} in {o.planned.python}" for o in self.outcomes if o.sglang_version})


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
    argv = launch.spec.argv
    env = tuple(sorted((k, v) for k, v in launch.spec.env_overrides.items() if k not in PLACEMENT_ENV))
    return PlannedArgv(label=launch.run.run_id, arm=launch.run.arm, python=argv[0], args=tuple(argv[3:]), env=env,
                       sources=launch.sources)


def _question(python: str, env: dict[str, str], argvs: list[tuple[str, ...]], timeout_s: float) -> Question:
    return Question(python, PROBE, [], RESULT_MARK, {**env, **PROBE_ENV}, timeout_s,
                    stdin=json.dumps({"argvs": [list(a) for a in argvs]}))


def _checked(python: str, answer: dict | AskError) -> dict:
    """The probe's answer ({"sglang_version", "results"}), or PreflightError saying why there is none."""
    if isinstance(answer, AskError):
        raise PreflightError(str(answer))
    if "error" in answer:
        raise PreflightError(f"{answer['error']} (interpreter {python})")
    return answer


def check_planned(items: list[PlannedArgv], timeout_s: float = PROBE_TIMEOUT_S) -> PreflightReport:
    """Check the items, one probe per (interpreter, environment), each distinct argv once; the probes run side
    by side (two arms on two SGLang installs take the time of one)."""
    groups: dict[tuple[str, tuple], list[PlannedArgv]] = {}
    for item in items:
        groups.setdefault((item.python, item.env), []).append(item)
    argvs = {key: list(dict.fromkeys(i.args for i in group)) for key, group in groups.items()}
    answers = ask_all([_question(python, dict(env), argvs[(python, env)], timeout_s) for python, env in groups])
    found: dict[tuple, Outcome] = {}
    for ((python, env), group), answer in zip(groups.items(), answers, strict=True):
        try:
            checked = _checked(python, answer)
        except PreflightError as exc:
            found.update({(python, env, a): Outcome(group[0], unchecked=str(exc)) for a in argvs[(python, env)]})
            continue
        for args, result in zip(argvs[(python, env)], checked["results"], strict=True):
            stages = tuple(Stage(**s) for s in result["stages"])
            found[(python, env, args)] = Outcome(group[0], stages, checked["sglang_version"])
    return PreflightReport([_for(found[(i.python, i.env, i.args)], i) for i in items])


def _for(outcome: Outcome, item: PlannedArgv) -> Outcome:
    return Outcome(item, outcome.stages, outcome.sglang_version, outcome.unchecked)


def run_preflight(server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> PreflightReport | None:
    """The report for these planned launches, or None when the preflight does not apply (say why)."""
    if server.backend != "sglang":
        if server.backend == "embedded":
            console.print(f"argv preflight: not applicable to backend {server.backend} (it checks SGLang commands)",
                          highlight=False)
        return None
    if server.preflight == "skip":
        console.print("[bold yellow]argv preflight SKIPPED (server.preflight=skip)[/]: the commands were NOT "
                      "checked against SGLang", highlight=False)
        return None
    items = [planned_argv(launch) for launch in launches]
    pythons = sorted({i.python for i in items})
    console.print(f"argv preflight: checking {len({(i.python, i.env, i.args) for i in items})} distinct command(s) "
                  f"with the SGLang of {', '.join(pythons)} ...", highlight=False)
    return check_planned(items)


def print_verdict(report: PreflightReport, console: Console) -> int:
    """The preflight's conclusion; the exit code it implies (0 or EXIT_CODE)."""
    if report.ok:
        console.print(f"[bold green]argv preflight passed[/]: {report.distinct_argvs()} distinct command(s) accepted "
                      f"by {'; '.join(report.checked_by())}. Checked: {WHAT_IS_CHECKED}.", highlight=False)
        for limit in report.limits():
            console.print(f"  not checked past: {escape(limit)}", highlight=False, soft_wrap=True)
        return 0
    console.print("[bold red]argv preflight FAILED[/] (server.preflight=require):", highlight=False)
    for problem in report.problems():
        console.print(f"  - {escape(problem)}", highlight=False, soft_wrap=True)
    if any(o.unchecked for o in report.outcomes):
        console.print("  the commands were NOT checked: point server.python (or the arm's python) at the interpreter "
                      "that will run SGLang, or set server.preflight=skip to go on unchecked", highlight=False)
    if any(o.failing_stage for o in report.outcomes):
        console.print("  SGLang would not start with these commands: fix the flag in the config key named above",
                      highlight=False)
    return EXIT_CODE


def preflight_before_launch(server: ServerConfig, launches: list[PlannedLaunch], console: Console) -> int:
    """A real run's fail-fast check, before any workload is loaded or server launched: 0 to go on.
    Silent for the embedded backend (the dry run says it does not apply)."""
    if server.backend != "sglang":
        return 0
    report = run_preflight(server, launches, console)
    if report is None:
        return 0
    code = print_verdict(report, console)
    if code:
        console.print("no server was launched", highlight=False)
    return code
