"""Compare the arms' server commands and environments with the baseline's.

Each arm's manifest `command` (argv) and `env` are compared with the baseline's run of the same
campaign, base seed and repeat (else the baseline's first run). The port number after `--port`, the
run's own id inside a token, and the run's base seed as the value of a seed flag (`--random-seed N`)
are not differences. A difference is *declared* when the campaign's arm declarations (`arms[].args`, `env`,
`python`, `source`: its PYTHONPATH; `url`: a server already running, which counts as the token `<server at URL>`)
account for it; anything else is undeclared and fails the audit. Arms with no difference at all from the baseline
form an A/A comparison.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import CampaignDir, Loaded

_PORT_FLAGS = ("--port",)


@dataclass(frozen=True)
class Hunk:
    """One run of differing tokens: `removed` from the baseline's command, `added` in the arm's."""

    removed: tuple[str, ...]
    added: tuple[str, ...]
    after: str | None = None  # the baseline token just before the hunk, for context

    def __str__(self) -> str:
        old, new = " ".join(self.removed), " ".join(self.added)
        where = f"after `{self.after}`: " if self.after is not None and self.removed else ""
        if not self.removed:
            return f"+ `{new}`"
        if not self.added:
            return f"{where}- `{old}`"
        return f"{where}`{old}` -> `{new}`"


@dataclass(frozen=True)
class EnvDiff:
    key: str
    baseline: str | None
    arm: str | None
    declared: bool

    def __str__(self) -> str:
        return f"`{self.key}`: {_show(self.baseline)} -> {_show(self.arm)}"


@dataclass(frozen=True)
class ArmDiff:
    """How one arm's commands and environments differ from the baseline's."""

    arm: str
    baseline: str
    pairs: int  # run pairs compared
    hunks: tuple[Hunk, ...]
    env: tuple[EnvDiff, ...]
    undeclared_removed: tuple[str, ...]
    undeclared_added: tuple[str, ...]
    note: str = ""

    @property
    def identical(self) -> bool:
        """No difference at all: an A/A pair."""
        return self.pairs > 0 and not self.hunks and not self.env

    @property
    def undeclared_env(self) -> tuple[EnvDiff, ...]:
        return tuple(d for d in self.env if not d.declared)

    @property
    def clean(self) -> bool:
        return not (self.undeclared_removed or self.undeclared_added or self.undeclared_env)


@dataclass(frozen=True)
class RunVariant:
    """Runs of one arm whose normalised commands or environments differ from its first run."""

    arm: str
    run_id: str
    first_run_id: str
    hunks: tuple[Hunk, ...]
    env: tuple[EnvDiff, ...]


def interpreter_only(d: ArmDiff) -> bool:
    """The arm's commands differ from the baseline's only in their first token (the interpreter's path), its
    environment not at all."""
    return (
        not d.env
        and len(d.hunks) == 1
        and d.hunks[0].after is None
        and len(d.hunks[0].removed) == len(d.hunks[0].added) == 1
    )


def _show(value: str | None) -> str:
    return "(unset)" if value is None else f"`{value}`"


def normalise(command: list[Any], run_id: str, base_seed: Any = None) -> list[str]:
    """The argv with the port number, the run's own id and its base seed (as the value of a flag
    naming a seed, e.g. `--random-seed 980406`) masked."""
    out: list[str] = []
    tokens = [str(t) for t in command]
    seed = None if base_seed is None or pd.isna(base_seed) else str(int(base_seed))
    for i, tok in enumerate(tokens):
        prev = tokens[i - 1] if i > 0 else ""
        if prev in _PORT_FLAGS:
            tok = "<port>"
        elif any(tok.startswith(f"{flag}=") for flag in _PORT_FLAGS):
            tok = tok.split("=", 1)[0] + "=<port>"
        elif seed is not None and tok == seed and prev.startswith("--") and "seed" in prev:
            tok = "<base_seed>"
        elif seed is not None and "seed" in tok.split("=", 1)[0] and tok.startswith("--") and tok.endswith(f"={seed}"):
            tok = tok.split("=", 1)[0] + "=<base_seed>"
        if run_id:
            tok = tok.replace(run_id, "<run_id>")
        out.append(tok)
    return out


def attached(man: dict[str, Any]) -> list[str]:
    """A server the run did not launch, as the token that stands for it in the compared commands (its command is
    empty): where it was (`server_url`)."""
    url = man.get("server_url")
    return [f"<server at {url}>"] if isinstance(url, str) else []


def token_hunks(base: list[str], other: list[str]) -> list[Hunk]:
    matcher = difflib.SequenceMatcher(a=base, b=other, autojunk=False)
    return [
        Hunk(tuple(base[i1:i2]), tuple(other[j1:j2]), base[i1 - 1] if i1 > 0 else None)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def env_diffs(base: dict[str, Any], other: dict[str, Any], declared_keys: set[str]) -> list[EnvDiff]:
    keys = sorted(set(base) | set(other))
    return [
        EnvDiff(k, _str_or_none(base.get(k)), _str_or_none(other.get(k)), k in declared_keys)
        for k in keys
        if _str_or_none(base.get(k)) != _str_or_none(other.get(k))
    ]


PLANNED_GPU = "<planned GPU>"


def placed_env(man: dict[str, Any]) -> dict[str, Any]:
    """A run's env overrides with CUDA_VISIBLE_DEVICES masked where it is the GPU the plan gave the run:
    with parallel placement the arms swap GPUs by design (audit.check_placement checks the value); any
    other value is kept, and shows as a difference."""
    env = dict(man.get("env") or {})
    gpu = man.get("gpu")
    if gpu is not None and env.get("CUDA_VISIBLE_DEVICES") == str(gpu):
        env["CUDA_VISIBLE_DEVICES"] = PLANNED_GPU
    return env


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _declarations(campaign: CampaignDir) -> dict[str, dict[str, Any]]:
    return {str(a.get("name")): a for a in campaign.arms}


def _expected(decl: dict[str, dict[str, Any]], arm: str, baseline: str) -> tuple[Counter, Counter, set[str]]:
    """Tokens the declarations remove and add, and env keys they change, from baseline to arm."""
    a, b = decl.get(baseline, {}), decl.get(arm, {})
    removed: Counter = Counter()
    added: Counter = Counter()
    for hunk in token_hunks([str(t) for t in a.get("args") or []], [str(t) for t in b.get("args") or []]):
        removed.update(hunk.removed)
        added.update(hunk.added)
    env_a, env_b = a.get("env") or {}, b.get("env") or {}
    keys = {k for k in set(env_a) | set(env_b) if _str_or_none(env_a.get(k)) != _str_or_none(env_b.get(k))}
    if (a.get("source") or {}).get("snapshot") != (b.get("source") or {}).get("snapshot"):
        keys.add("PYTHONPATH")  # an arm's source goes first on its server's PYTHONPATH
    return removed, added, keys


def _runs_with_manifest(data: Loaded) -> pd.DataFrame:
    runs = data.runs[data.runs["planned"] & data.runs["found"]]
    has = np.array([bool(_manifest(data, r)) for r in runs.itertuples()], dtype=bool)
    return runs[has]


def _manifest(data: Loaded, run: Any) -> dict[str, Any]:
    camp = next(c for c in data.campaigns if c.label == run.campaign)
    return camp.manifests.get(run.run_id) or {}


def compare_arms(data: Loaded, arms: list[str], baseline: str) -> list[ArmDiff]:
    """One ArmDiff per non-baseline arm."""
    runs = _runs_with_manifest(data)
    base_runs = runs[runs["arm"] == baseline]
    return [_compare_arm(data, runs[runs["arm"] == arm], base_runs, arm, baseline) for arm in arms if arm != baseline]


def _compare_arm(data: Loaded, arm_runs: pd.DataFrame, base_runs: pd.DataFrame, arm: str, baseline: str) -> ArmDiff:
    if arm_runs.empty or base_runs.empty:
        return ArmDiff(arm, baseline, 0, (), (), (), (), note="no run manifest to compare")
    hunks: dict[str, Hunk] = {}
    envs: dict[str, EnvDiff] = {}
    und_removed: Counter = Counter()
    und_added: Counter = Counter()
    for run in arm_runs.itertuples():
        base = _partner(base_runs, run)
        camp = next(c for c in data.campaigns if c.label == run.campaign)
        pair = _compare_pair(camp, _manifest(data, base), base.run_id, _manifest(data, run), run.run_id, arm, baseline)
        for h in pair[0]:
            hunks.setdefault(str(h), h)
        for e in pair[1]:
            envs.setdefault(str(e), e)
        und_removed |= pair[2]
        und_added |= pair[3]
    return ArmDiff(
        arm,
        baseline,
        len(arm_runs),
        tuple(hunks.values()),
        tuple(envs.values()),
        tuple(sorted(und_removed.elements())),
        tuple(sorted(und_added.elements())),
    )


def _partner(base_runs: pd.DataFrame, run: Any) -> Any:
    same = base_runs[
        (base_runs["campaign"] == run.campaign)
        & (base_runs["base_seed"] == run.base_seed)
        & (base_runs["repeat"] == run.repeat)
    ]
    return next((same if not same.empty else base_runs).itertuples())


def _compare_pair(
    camp: CampaignDir, base_man: dict, base_id: str, arm_man: dict, arm_id: str, arm: str, baseline: str
) -> tuple[list[Hunk], list[EnvDiff], Counter, Counter]:
    base_cmd = attached(base_man) + normalise(base_man.get("command") or [], base_id, base_man.get("base_seed"))
    arm_cmd = attached(arm_man) + normalise(arm_man.get("command") or [], arm_id, arm_man.get("base_seed"))
    hunks = token_hunks(base_cmd, arm_cmd)
    decl = _declarations(camp)
    exp_removed, exp_added, env_keys = _expected(decl, arm, baseline)
    if decl.get(arm, {}).get("url") != decl.get(baseline, {}).get("url"):  # the arms' own servers, declared
        exp_removed.update(attached(base_man))
        exp_added.update(attached(arm_man))
    if (decl.get(arm, {}).get("python") != decl.get(baseline, {}).get("python")) and base_cmd and arm_cmd:
        exp_removed[base_cmd[0]] += 1
        exp_added[arm_cmd[0]] += 1
    removed: Counter = Counter(t for h in hunks for t in h.removed)
    added: Counter = Counter(t for h in hunks for t in h.added)
    envs = env_diffs(placed_env(base_man), placed_env(arm_man), env_keys)
    return hunks, envs, removed - exp_removed, added - exp_added


def run_variants(data: Loaded) -> list[RunVariant]:
    """Runs whose command or environment differs from the first run of the same arm."""
    runs = _runs_with_manifest(data)
    out: list[RunVariant] = []
    for _, group in runs.groupby("arm", sort=True):
        first = next(group.itertuples())
        first_man = _manifest(data, first)
        first_cmd = normalise(first_man.get("command") or [], first.run_id, first.base_seed)
        for run in list(group.itertuples())[1:]:
            man = _manifest(data, run)
            hunks = token_hunks(first_cmd, normalise(man.get("command") or [], run.run_id, run.base_seed))
            envs = env_diffs(placed_env(first_man), placed_env(man), set())
            if hunks or envs:
                out.append(RunVariant(run.arm, run.run_id, first.run_id, tuple(hunks), tuple(envs)))
    return out
