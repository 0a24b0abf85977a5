"""Code under test: what each run's server imported (manifest `server_code`, read in the server's own
interpreter), checked against what its arm names (campaign.json `arms[].source`), and the installed
packages compared between the arms.

The audit's check "Each arm ran the code it names, and only that differs" fails when
- a source arm's server imported its module from outside its snapshot, or from another commit than the
  campaign resolved for it (a tampered or mixed-up manifest included), or from a snapshot whose files were not
  its commit's when the server started (`checkout.content_sha256` against campaign.json's);
- the runs of one arm imported different code (another origin, commit, diff or package list);
- the arms' interpreters differ in an installed distribution that `experiment.packages_may_differ` does not
  name (e.g. two installs that also differ in torch);
- some runs recorded what their server ran and others did not.
A run from a checkout with uncommitted changes is a warning naming its diff hash, unless the experiment
declares it (`experiment.dirty_declared`). Campaigns written before server_code existed are `info`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.check import FAIL, INFO, OK, WARN, Status
from analysis.load import Loaded

CHECK_NAME = "Each arm ran the code it names, and only that differs"


@dataclass(frozen=True)
class RunCode:
    campaign: str
    run_id: str
    arm: str
    code: dict[str, Any] | None  # the manifest's server_code
    source: dict[str, Any] | None  # the arm's declared source (campaign.json)
    may_differ: frozenset[str]
    dirty_declared: bool
    binary: dict[str, Any] | None = None  # the manifest's server_binary (a native server: llama-server)
    url: str | None = None  # the manifest's server_url (a server the run did not launch)


def run_codes(data: Loaded) -> list[RunCode]:
    """Every planned run with a manifest, in plan order."""
    out = []
    runs = data.runs[data.runs["planned"] & data.runs["found"]]
    for r in runs.itertuples():
        camp = next(c for c in data.campaigns if c.label == r.campaign)
        man = camp.manifests.get(r.run_id)
        if not man:
            continue
        decl = next((a for a in camp.arms if str(a.get("name")) == r.arm), {})
        exp = (camp.meta.get("config") or {}).get("experiment") or {}
        binary = man.get("server_binary")
        out.append(
            RunCode(
                r.campaign,
                r.run_id,
                str(r.arm),
                man.get("server_code"),
                decl.get("source"),
                frozenset(norm(p) for p in exp.get("packages_may_differ") or []),
                bool(exp.get("dirty_declared")),
                binary if isinstance(binary, dict) else None,
                man.get("server_url") if isinstance(man.get("server_url"), str) else None,
            )
        )
    return out


def norm(name: str) -> str:
    """A distribution name as the provenance probe writes it (PEP 503: runs of -_. as one -, lower case; the
    probe keeps its own copy: it runs in the server's interpreter, which may hold no harness)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def fingerprint(code: dict[str, Any]) -> tuple:
    """What must not change between the runs of one arm."""
    where = code.get("checkout") or {}
    return (code.get("module_origin"), where.get("commit"), where.get("diff_sha256"), code.get("packages_sha256"))


def inside(path: str | None, folder: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def source_problems(run: RunCode) -> list[str]:
    """Why a source arm's run did not run its source's code (empty: it did)."""
    src, code = run.source, run.code
    if not src or not code:
        return []
    home = Path(str(src.get("snapshot"))) / str(src.get("package_dir") or ".")
    out = []
    if not inside(code.get("module_origin"), home):
        out.append(
            f"{run.run_id}: the server imported {code.get('module')} from {code.get('module_origin')}, outside "
            f"its arm's source {home}"
        )
    where = code.get("checkout") or {}
    commit = where.get("commit")
    if commit != src.get("commit"):
        out.append(
            f"{run.run_id}: the server's code is at commit {commit}, but arm {run.arm}'s source "
            f"{src.get('ref')!r} resolved to {src.get('commit')}"
        )
    want, got = src.get("content_sha256"), where.get("content_sha256")
    if want and where.get("kind") == "snapshot" and got != want:
        out.append(
            f"{run.run_id}: the snapshot {where.get('root')} held other files than commit {src.get('commit')} "
            f"when its server started (content sha256 {got}, the commit's {want}): it was edited after it "
            "was made"
        )
    return out


def package_differences(first: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    """(package, {arm: version or '(absent)'}) for every distribution whose version is not the same in every
    arm's first run."""
    lists = {arm: code.get("packages") or {} for arm, code in first.items()}
    names = sorted(set().union(*lists.values())) if lists else []
    out = []
    for name in names:
        versions = {arm: pkgs.get(name, "(absent)") for arm, pkgs in lists.items()}
        if len(set(versions.values())) > 1:
            out.append((name, versions))
    return out


def firsts(codes: list[RunCode]) -> dict[str, dict[str, Any]]:
    """Each arm's first recorded server_code."""
    out: dict[str, dict[str, Any]] = {}
    for run in codes:
        if run.code:
            out.setdefault(run.arm, run.code)
    return out


def check_code(data: Loaded) -> tuple[Status, str, tuple[str, ...]]:
    """(status, summary, details) of the check named CHECK_NAME."""
    codes = run_codes(data)
    recorded = [r for r in codes if r.code]
    attached = sorted({str(r.url) for r in codes if r.url})
    if not recorded and attached:
        return (
            WARN,
            (
                f"the servers were already running ({', '.join(attached)}): the campaign did not launch them and "
                "cannot pin their code"
            ),
            (),
        )
    if not recorded and any(r.binary for r in codes):
        return check_binaries(codes)
    if not recorded:
        return INFO, "no manifest records server_code (written before 2026-12-02): the code under test is unknown", ()
    details = [f"{r.run_id}: no server_code in its manifest" for r in codes if not r.code]
    for run in recorded:
        details += source_problems(run)
    details += arm_changes(recorded)
    may_differ = frozenset().union(*(r.may_differ for r in recorded))
    diffs = package_differences(firsts(recorded))
    undeclared = [(n, v) for n, v in diffs if n not in may_differ]
    details += [
        f"package {n} differs between the arms' interpreters: "
        + ", ".join(f"{a} {ver}" for a, ver in v.items())
        + " (not in experiment.packages_may_differ)"
        for n, v in undeclared
    ]
    dirty = [r for r in recorded if ((r.code or {}).get("checkout") or {}).get("dirty")]
    dirty_lines = [
        f"{r.run_id}: ran from a dirty checkout {(r.code or {})['checkout'].get('root')} (diff sha256 "
        f"{(r.code or {})['checkout'].get('diff_sha256')}, {len((r.code or {})['checkout'].get('untracked') or [])} "
        "untracked file(s))"
        for r in dirty
        if not r.dirty_declared
    ]
    sources = sum(1 for r in recorded if r.source)
    summary = (
        f"{len(recorded)} of {len(codes)} runs recorded their server's code; {sources} from an arm's source; "
        f"{len(diffs)} package(s) differ between arms ({len(diffs) - len(undeclared)} declared)"
    )
    if details:
        return FAIL, summary, tuple(details + dirty_lines)
    if dirty_lines:
        return WARN, summary + f"; {len(dirty)} run(s) from a dirty checkout", tuple(dirty_lines)
    return OK, summary, ()


def arm_changes(recorded: list[RunCode]) -> list[str]:
    """Each run whose code differs from its arm's first run (merged campaigns whose interpreter gained packages
    meanwhile, say), naming both runs with their campaigns and what differs."""
    out = []
    first: dict[str, RunCode] = {}
    for run in recorded:
        ref = first.setdefault(run.arm, run)
        if fingerprint(run.code or {}) != fingerprint(ref.code or {}):
            out.append(
                f"{run.campaign}/{run.run_id}: arm {run.arm} ran other code than in {ref.campaign}/"
                f"{ref.run_id}: {code_difference(ref.code or {}, run.code or {})}"
            )
    return out


def code_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    """What differs between two server_code records, in words: origin, commit, diff, and the packages."""
    wa, wb = a.get("checkout") or {}, b.get("checkout") or {}
    parts = [
        f"{what} {x} -> {y}"
        for what, x, y in (
            ("module origin", a.get("module_origin"), b.get("module_origin")),
            ("commit", wa.get("commit"), wb.get("commit")),
            ("diff sha256", wa.get("diff_sha256"), wb.get("diff_sha256")),
        )
        if x != y
    ]
    pa, pb = a.get("packages") or {}, b.get("packages") or {}
    changed = [f"+{n} {pb[n]}" for n in sorted(set(pb) - set(pa))] + [
        f"-{n} {pa[n]}" for n in sorted(set(pa) - set(pb))
    ]
    changed += [f"{n} {pa[n]} -> {pb[n]}" for n in sorted(set(pa) & set(pb)) if pa[n] != pb[n]]
    if changed:
        shown = ", ".join(changed[:12]) + (f", and {len(changed) - 12} more" if len(changed) > 12 else "")
        parts.append(f"packages {len(pa)} -> {len(pb)} ({shown})")
    return "; ".join(parts) or "the package list's hash only"


def check_binaries(codes: list[RunCode]) -> tuple[Status, str, tuple[str, ...]]:
    """Native servers (llama-server): every run recorded its binary, and all ran the same one (its SHA-256; no
    arm declares another binary)."""
    details = [f"{r.run_id}: no server_binary in its manifest" for r in codes if not r.binary]
    shas = {str((r.binary or {}).get("sha256")): r for r in codes if r.binary}
    if len(shas) > 1:
        details += [
            f"{r.run_id} (arm {r.arm}) ran binary {sha[:16]} ({(r.binary or {}).get('path')})"
            for sha, r in shas.items()
        ]
    built = {
        f"{b.get('package')} {b.get('package_version')}" if b.get("package") else "an unknown build"
        for b in (r.binary or {} for r in codes if r.binary)
    }
    summary = (
        f"{sum(1 for r in codes if r.binary)} of {len(codes)} runs recorded their server binary; "
        f"{len(shas)} distinct binary(ies) ({', '.join(sorted(built))})"
    )
    return (FAIL if details else OK), summary, tuple(details)


def describe_binary(binary: dict[str, Any]) -> str:
    """A native server binary (manifest server_binary), in a table cell."""
    built = (
        f"built from {binary.get('package')} {binary.get('package_version')}"
        if binary.get("package")
        else "build unknown"
    )
    return f"`{Path(str(binary.get('path'))).name}` sha256 `{str(binary.get('sha256'))[:12]}` ({built})"


def describe(code: dict[str, Any] | None) -> str:
    """What a server ran, in a table cell."""
    if not code:
        return "(not recorded)"
    where = code.get("checkout")
    if where is None:
        version = code.get("distribution_version") or code.get("sglang") or "?"
        held = f"installed {code.get('distribution') or 'package'} {version}"
    elif where.get("kind") == "snapshot":
        held = f"snapshot of `{str(where.get('commit'))[:12]}`"
    else:
        dirty = f", dirty (diff {str(where.get('diff_sha256') or 'none')[:12]})" if where.get("dirty") else ""
        held = f"git `{str(where.get('commit'))[:12]}` ({where.get('branch') or 'detached'}{dirty})"
    return f"`{code.get('module')}`: {held}"
