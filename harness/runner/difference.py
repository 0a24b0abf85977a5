"""A comparison needs a difference: before any server starts (and in the dry run), the arms' launches are resolved
and compared pairwise. Two arms that would run the same command, environment, interpreter and code compare a
thing with itself; unless the experiment declares an A/A (`experiment.aa=true`) that is refused, naming the
arms and what resolved equal. An A/A whose arms would launch differently is refused too.

What is compared per arm: its own args and env (the server's are shared), its interpreter (the path as given;
two paths count as one interpreter when both answer the provenance probe with the same packages and the same
module origin), and its code (the tree of the commit its source resolved to, with its package_dir; no source:
whatever the interpreter has installed). Seed streams are not a launch difference: arms that differ only there
are an A/A.
"""

from __future__ import annotations

import itertools
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


@dataclass(frozen=True)
class ArmLaunch:
    """What one arm's server would be, as far as the arms can differ."""

    name: str
    args: tuple[str, ...]
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
        tuple(sorted((k, str(v)) for k, v in arm.env.items())),
        arm.python or cfg.server.python or sys.executable,
        tree_of(src) if src else "installed",
        launch.launch,
    )


def same_interpreter(a: ArmLaunch, b: ArmLaunch, probe: Probe) -> bool:
    """One interpreter: the same path, or two paths whose probes say the same packages and module origin."""
    if a.python == b.python:
        return True
    try:
        ca, cb = probe(a.launch), probe(b.launch)
    except ProvenanceError:
        return False  # a real run fails at that probe anyway; the dry run says so
    return (ca.packages_sha256, ca.module_origin, ca.checkout) == (cb.packages_sha256, cb.module_origin, cb.checkout)


def differences(a: ArmLaunch, b: ArmLaunch, probe: Probe) -> list[str]:
    """What differs between two arms' launches, in words; [] when they resolve equal."""
    out = []
    if a.args != b.args:
        out.append(f"args {list(a.args)} vs {list(b.args)}")
    if a.env != b.env:
        out.append(f"env {dict(a.env)} vs {dict(b.env)}")
    if not same_interpreter(a, b, probe):
        out.append(f"interpreter {a.python} vs {b.python}")
    if a.code != b.code:
        out.append(f"code {a.code} vs {b.code}")
    return out


def equal_parts(a: ArmLaunch, b: ArmLaunch, sources: dict[str, SourceDoc]) -> str:
    """What resolved equal, for the refusal."""
    code = "the interpreter's installed code"
    if a.name in sources and b.name in sources:
        sa, sb = sources[a.name], sources[b.name]
        code = (
            f"the same code ({a.code}: ref {sa.ref!r} -> {sa.commit[:12]}, ref {sb.ref!r} -> {sb.commit[:12]}; "
            "uncommitted changes are only in the WORKTREE ref)"
        )
    return f"args {list(a.args)}, env {dict(a.env)}, interpreter {a.python}, {code}"


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
