"""The `speed_bench` workload: first turns of NVIDIA's SPEED-Bench (`nvidia/SPEED-Bench`).

Configs `qualitative` (880 rows, 11 categories x 80) and `throughput_1k` ... `throughput_32k`
(1,536 rows each, 3 entropy tiers x 512), split `test`; columns `question_id`, `category`,
`sub_category`, `turns` (list of strings), `source`, `src_id`, `difficulty`, `multiturn`.
Each row becomes one user message, `turns[0]`. Rows whose text comes from third-party datasets ship
as placeholders starting with `FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE`: they are
refused (with how to prepare the data) unless `workload.skip_placeholders=true`.
There are no reference answers; `score` extracts but gives no verdict.
"""

from __future__ import annotations

from typing import Any

from workloads.base import Item, Workload, WorkloadError
from workloads.config import WorkloadConfig
from workloads.pipeline import materialise, require_columns, seed_offsets
from workloads.prompts import user_messages
from workloads.read_split import read_split
from workloads.subset import Candidate

PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE"
REQUIRED = ("question_id", "category", "turns")


def prepare_help(config: str | None) -> str:
    """How to turn the published rows into prompts (NVIDIA's own preparation script)."""
    name = config or "qualitative"
    return (
        "Prepare the data once with NVIDIA's script, which fetches the original texts: in a checkout of "
        "https://github.com/NVIDIA/Model-Optimizer run `cd examples/specdec_bench && "
        "pip install -r requirements_speed.txt && "
        f"python prepare_data.py --dataset speed --config {name} --output_dir data/` "
        "(some sources are gated on the hub and need a token), then run with "
        f"workload.path=examples/specdec_bench/data/speed/{name}/test.parquet and pin the hash the "
        "loader prints (workload.sha256=...). Or run only the rows that ship with their text: "
        "workload.skip_placeholders=true (the count of skipped rows is recorded)."
    )


def load(cfg: WorkloadConfig) -> Workload:
    """SPEED-Bench first turns from the hub / cache / a prepared file (`workload.path`)."""
    src = read_split(cfg)

    def to_candidates(rows: list[dict[str, Any]]) -> list[Candidate]:
        require_columns(rows, REQUIRED, f"workload speed_bench: {src.label}")
        offsets = seed_offsets([row["question_id"] for row in rows])
        return [
            _candidate(row, off, f"workload speed_bench: {src.label} row {n}")
            for n, (row, off) in enumerate(zip(rows, offsets, strict=True), start=1)
        ]

    return materialise(cfg, src, to_candidates, prepare_help(cfg.hf_config))


def is_placeholder(turns: list[str]) -> bool:
    """True when any turn is an unprepared placeholder."""
    return any(t.lstrip().startswith(PLACEHOLDER) for t in turns)


def _candidate(row: dict[str, Any], seed_offset: int, where: str) -> Candidate:
    qid, category, turns = row["question_id"], row["category"], row["turns"]
    if qid is None or str(qid).strip() == "":
        raise WorkloadError(f"{where}: question_id is empty")
    if not isinstance(category, str) or not category:
        raise WorkloadError(f"{where} (question_id {qid}): category={category!r} is not a name")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise WorkloadError(f"{where} (question_id {qid}): turns must be a non-empty list of strings")
    if not turns[0].strip():
        raise WorkloadError(f"{where} (question_id {qid}): the first turn is empty")
    item = Item(
        item_id=str(qid),
        seed_offset=seed_offset,
        prompt=turns[0],
        messages=user_messages(turns[0]),
        answer=None,
        category=category,
    )
    return Candidate(item=item, categories=(category,), placeholder=is_placeholder(turns))
