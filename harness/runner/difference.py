"""A comparison needs a difference: before any server starts (and in the dry run), the arms' launches are resolved
and compared pairwise. Two arms that would run the same command, environment, interpreter and code compare a
thing with itself; unless the experiment declares an A/A (`experiment.aa=true`) that is refused, naming the
arms and what resolved equal. An A/A whose arms would launch differently is refused too.

What is compared per arm: its command's options as parsed (server.args then the arm's own args; the last value of
a flag counts, `--flag=v` is `--flag v`), its own env (the server's is shared), its interpreter (two paths that
resolve to one file are one interpreter; two installs count as one when both answer the provenance probe with the
same Python, the same package set and the same code of the served module; when a probe cannot answer and nothing
else differs, the arms are refused: whether they differ cannot be told), and its code (the tree of the commit its source resolved to, with its package_dir; no source:
whatever the interpreter has installed). Seed streams are not a launch difference: arms that differ only there
are an A/A. Servers already running (server.url, an arm's url) differ only in where they are.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.contract import ServerCode, SourceDoc
from harness.runner.config import BenchConfig
from harness.runner.sources import git
from harness.server.config import ArmConfig
from harness.server.launch import Launch, PlannedLaunch
from harness.server.provenance import ProvenanceError, probe_server_code
from harness.validation import ConfigError

Probe = Callable[[Launch], ServerCode]
NUMBER = re.compile(r"-\d[\d.eE+-]*")  # a negative number is a value, not a flag
Options = tuple[tuple[tuple[str, str | None], ...], tuple[str, ...]]


def parsed_options(tokens: list[str]) -> Options:
    """A command's options as its parser ends up with them: (sorted (flag, value) pairs, positional tokens). The
    last value of a flag counts; `--flag=v` is `--flag v`; a flag not followed by a value is a switch (None)."""
    flags: dict[str, str | None] = {}
    positional: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("-") and not NUMBER.fullmatch(token):
            name, eq, value = token.partition("=")
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if not eq and nxt is not None and (not nxt.startswith("-") or NUMBER.fullmatch(nxt)):
                value, i = nxt, i + 1
            flags[name] = value if eq or value else None
        else:
            positional.append(token)
        i += 1
    return tuple(sorted(flags.items())), tuple(positional)


@dataclass(frozen=True)
class ArmLaunch:
    """What one arm's server would be, as far as the arms can differ."""

    name: str
    args: tuple[str, ...]  # its own, as given (for the messages)
    options: Options  # server.args then its own, parsed: what is compared
    env: tuple[tuple[str, str], ...]
    python: str
    code: str  # `tree <sha> (package_dir)` of its source, or `installed`
    launch: Launch


def tree_of(src: SourceDoc) -> str:
    """The tree of a source's commit: two commits of equal files are one code."""
    return f"tree {git(Path(src.repo), 'rev-parse', f'{src.commit}^{{tree}}')} ({src.package_dir})"


def arm_launch(cfg: BenchConfig, arm: ArmConfig, launch: PlannedLaunch, sources: dict[str, SourceDoc]) -> ArmLaunch:
    src = sources.get(arm.name)
    return ArmLaunch(
        arm.name,
        tuple(str(a) for a in arm.args),
        parsed_options([str(a) for a in [*cfg.server.args, *arm.args]]),
        tuple(sorted((k, str(v)) for k, v in arm.env.items())),
        arm.python or cfg.server.python or sys.executable,
        tree_of(src) if src else "installed",
        launch.launch,
    )


def code_key(code: ServerCode) -> tuple:
    """What makes two installs run the same code: the Python, the package set, the served module's distribution,
    and its checkout's state (not where it lies); an editable install outside git: its folder."""
    c = code.checkout
    checkout = (c.kind, c.commit, c.dirty, c.diff_sha256, tuple(c.untracked), c.content_sha256) if c else None
    editable = bool((code.direct_url or {}).get("dir_info", {}).get("editable"))
    folder = code.module_origin if c is None and (editable or code.distribution is None) else None
    return (
        code.python,
        code.packages_sha256,
        code.module,
        code.distribution,
        code.distribution_version,
        checkout,
        folder,
    )


def same_interpreter(a: ArmLaunch, b: ArmLaunch, probe: Probe) -> bool:
    """One interpreter: two paths of one file, or two installs whose probes say the same Python, packages and code.
    ConfigError when a probe cannot answer (so whether they differ cannot be told)."""
    if os.path.realpath(a.python) == os.path.realpath(b.python):
        return True
    try:
        ca, cb = probe(a.launch), probe(b.launch)
    except ProvenanceError as exc:
        raise ConfigError(
            f"arms {a.name} and {b.name} differ only in their interpreters ({a.python} vs {b.python}), and one "
            f"cannot say what code it runs: {exc}. Whether the arms differ cannot be told: fix that interpreter, "
            "or give both arms one path"
        ) from None
    return code_key(ca) == code_key(cb)


def differences(a: ArmLaunch, b: ArmLaunch, probe: Probe) -> list[str]:
    """What differs between two arms' launches, in words; [] when they resolve equal. The interpreters are
    probed only when nothing else differs (then they decide). Servers already running (a url): only where they are
    can differ (harness.runner.config.check_attached refuses anything else given to them)."""
    if a.launch.url or b.launch.url:
        where_a, where_b = a.launch.base_url, b.launch.base_url
        return [] if where_a == where_b else [f"server {where_a} vs {where_b}"]
    out = []
    if a.options != b.options:
        out.append(f"args {list(a.args)} vs {list(b.args)}")
    if a.env != b.env:
        out.append(f"env {dict(a.env)} vs {dict(b.env)}")
    if a.code != b.code:
        out.append(f"code {a.code} vs {b.code}")
    if out:
        if os.path.realpath(a.python) != os.path.realpath(b.python):
            out.append(f"interpreter {a.python} vs {b.python}")
    elif not same_interpreter(a, b, probe):
        out.append(f"interpreter {a.python} vs {b.python}")
    return out


def equal_parts(a: ArmLaunch, b: ArmLaunch, sources: dict[str, SourceDoc]) -> str:
    """What resolved equal, for the refusal."""
    if a.launch.url:
        return f"one server, already running at {a.launch.base_url}"
    code = "the interpreter's installed code"
    if a.name in sources and b.name in sources:
        sa, sb = sources[a.name], sources[b.name]
        code = (
            f"the same code ({a.code}: ref {sa.ref!r} -> {sa.commit[:12]}, ref {sb.ref!r} -> {sb.commit[:12]}; "
            "uncommitted changes are only in the WORKTREE ref)"
        )
    options = " ".join(f"{k}" + ("" if v is None else f" {v}") for k, v in a.options[0])
    return (
        f"args {list(a.args)} (with server.args: {options or 'none'}), env {dict(a.env)}, interpreter {a.python}, "
        f"{code}"
    )


def check_arms_differ(
    cfg: BenchConfig, launches: list[PlannedLaunch], sources: dict[str, SourceDoc], probe: Probe = probe_server_code
) -> None:
    """ConfigError when two arms resolve to one launch and no A/A is declared, or an A/A's arms differ."""
    exp = cfg.experiment
    firsts: dict[str, PlannedLaunch] = {}
    for launch in launches:
        firsts.setdefault(launch.run.arm, launch)
    arms = [arm_launch(cfg, arm, firsts[arm.name], sources) for arm in exp.arms]
    for a, b in itertools.combinations(arms, 2):
        diff = differences(a, b, probe)
        if exp.aa and diff:
            raise ConfigError(
                f"experiment.aa=true declares an A/A, but arms {a.name} and {b.name} would launch "
                f"differently: {'; '.join(diff)}. Make them equal, or drop experiment.aa for an A/B"
            )
        if not exp.aa and not diff:
            raise ConfigError(
                f"arms {a.name} and {b.name} resolve to the same launch ({equal_parts(a, b, sources)}): the "
                f"comparison would compare a thing with itself, though the experiment declares a difference "
                f"({exp.declared_difference or 'none given'!r}). Give the arms their difference, or declare an A/A "
                "with experiment.aa=true"
            )
