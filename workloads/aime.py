"""The `aime25` workload: MathArena's AIME 2025 (`MathArena/aime_2025`, split `train`, 30 rows).

Columns: `problem_idx` (int, the item id and the seed offset), `problem`, `answer` (an integer, or a
string holding one; compared as integers), `problem_type` (a list of strings; optional here, the
category filter matches any of them). Prompt: MathArena's (`workloads.prompts`).
"""

from __future__ import annotations

from typing import Any

from workloads.base import Item, Workload, WorkloadError
from workloads.config import WorkloadConfig
from workloads.pipeline import materialise, require_columns
from workloads.prompts import math_prompt, user_messages
from workloads.read_split import read_split
from workloads.scoring import as_integer
from workloads.subset import Candidate

REQUIRED = ("problem_idx", "problem", "answer")


def load(cfg: WorkloadConfig) -> Workload:
    """AIME 2025 from the hub / cache / `workload.path`, frozen by `workload.sha256`."""
    src = read_split(cfg)

    def to_candidates(rows: list[dict[str, Any]]) -> list[Candidate]:
        require_columns(rows, REQUIRED, f"workload aime25: {src.label}")
        return [_candidate(cfg, row, n, src.label) for n, row in enumerate(rows, start=1)]

    return materialise(cfg, src, to_candidates)


def _candidate(cfg: WorkloadConfig, row: dict[str, Any], n: int, label: str) -> Candidate:
    where = f"workload aime25: {label} row {n}"
    idx = row["problem_idx"]
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise WorkloadError(f"{where}: problem_idx={idx!r} is not an integer")
    problem = row["problem"]
    if not isinstance(problem, str) or not problem.strip():
        raise WorkloadError(f"{where} (problem_idx {idx}): problem is empty or not text")
    answer = as_integer(str(row["answer"])) if not isinstance(row["answer"], bool) else None
    if answer is None:
        raise WorkloadError(f"{where} (problem_idx {idx}): answer={row['answer']!r} is not an integer")
    if not 0 <= answer <= 999:  # the prompt tells the model so: another answer could never be matched
        raise WorkloadError(f"{where} (problem_idx {idx}): answer={row['answer']!r} is outside AIME's 0 to 999")
    types = _problem_types(row.get("problem_type"), where)
    prompt = math_prompt(problem, cfg.prompt_template)
    item = Item(
        item_id=str(idx),
        seed_offset=idx,
        prompt=prompt,
        messages=user_messages(prompt),
        answer=str(answer),
        category=", ".join(types) or None,
    )
    return Candidate(item=item, categories=types)


def _problem_types(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise WorkloadError(f"{where}: problem_type={value!r} is not a list of strings")
