"""Sealed records: each run's manifest (schema 4) holds the SHA-256 and line count of its records.jsonl and
scores.jsonl as the runner left them (harness.contract.FileSeal). This module recomputes them: an edited,
truncated or deleted file fails the audit, naming the file, unless the report was asked for with
`--allow-edited` (then every output carries a banner naming the files). Runs of older schemas carry no seals:
a warning says their records cannot be checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.check import FAIL, OK, WARN, Check
from analysis.load import Loaded
from harness.contract import SEALED_SINCE, seal_file

NAME = "Records sealed (unchanged since their run wrote them)"
FILES = (("records.jsonl", "records_seal"), ("scores.jsonl", "scores_seal"))


@dataclass
class Seals:
    """What the seals found: `changed` files (each a line naming the file and how it changed), runs `unsealed`
    (written before schema 4), and how many files were `verified`."""

    changed: list[str] = field(default_factory=list)
    unsealed: list[str] = field(default_factory=list)
    verified: int = 0


def verify_seals(data: Loaded) -> Seals:
    """Every run folder with a manifest, of every campaign: its files against their seals."""
    out = Seals()
    for camp in data.campaigns:
        for run_id, man in camp.manifests.items():
            run_dir = camp.run_dirs[run_id]
            if camp.schema_version < SEALED_SINCE:
                if any(man.get(key) for _, key in FILES):
                    _verify_run(run_dir, man, out, required=False)
                else:
                    out.unsealed.append(f"{camp.label}/{run_id}")
                continue
            _verify_run(run_dir, man, out, required=man.get("status") == "finished")
    return out


def _verify_run(run_dir: Path, man: dict[str, Any], out: Seals, required: bool) -> None:
    for name, key in FILES:
        path, seal = run_dir / name, man.get(key)
        if not isinstance(seal, dict):  # an unfinished run (a killed runner seals nothing) is failed by 'Runs finished'
            if required:
                out.changed.append(f"{path}: its manifest holds no seal ({key} missing: the manifest was edited)")
            continue
        problem = _problem(path, seal)
        if problem:
            out.changed.append(f"{path}: {problem}")
        else:
            out.verified += 1


def _problem(path: Path, seal: dict[str, Any]) -> str | None:
    """How the file differs from its seal, or None when it does not."""
    now = seal_file(path)
    lines, sha = seal.get("lines"), seal.get("sha256")
    if now is None:
        return f"deleted (sealed with {lines} line(s))"
    if now.sha256 == sha and now.lines == lines:
        return None
    if isinstance(lines, int) and now.lines < lines:
        return f"truncated: {now.lines} of its {lines} sealed line(s)"
    grown = f", {now.lines} line(s) where {lines} were sealed" if now.lines != lines else ""
    return f"edited: SHA-256 {now.sha256[:12]}, sealed as {str(sha)[:12]}{grown}"


def check_seals(seals: Seals, allow_edited: bool) -> Check:
    """FAIL when a sealed file changed (WARN with --allow-edited); WARN when runs carry no seals."""
    if seals.changed:
        how = "reported anyway (--allow-edited)" if allow_edited else "refused: restore the files, or rerun the runs"
        return Check(
            NAME,
            WARN if allow_edited else FAIL,
            f"{len(seals.changed)} file(s) changed after their run sealed them, {how}: "
            + "; ".join(line.split(": ", 1)[0] for line in seals.changed[:3])
            + (f" and {len(seals.changed) - 3} more" if len(seals.changed) > 3 else ""),
            tuple(seals.changed),
        )
    if seals.unsealed:
        return Check(
            NAME,
            WARN,
            f"{len(seals.unsealed)} run(s) written before schema {SEALED_SINCE} carry no seals: edits to their "
            f"records cannot be detected ({seals.verified} sealed file(s) unchanged)",
            tuple(seals.unsealed[:50]),
        )
    return Check(NAME, OK, f"{seals.verified} sealed file(s) unchanged")


def banner(seals: Seals) -> str:
    """The banner of a report over edited records (--allow-edited), one line."""
    files = "; ".join(seals.changed[:5]) + (f"; and {len(seals.changed) - 5} more" if len(seals.changed) > 5 else "")
    return (
        f"EDITED RECORDS (--allow-edited): {len(seals.changed)} file(s) changed after their run sealed them, "
        f"and these figures come from the changed files: {files}"
    )
