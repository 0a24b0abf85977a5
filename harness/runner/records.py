"""Raw records and scores on disk (layout and keys in docs/records.md): one line per request, built from
what the client saw, appended and flushed one by one, so a crash loses at most the line being written."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from harness.client.requests import Outcome, RequestPlan
from harness.contract import SCHEMA_VERSION, FinishReason, Record, ScoreLine, to_json
from harness.runner.storage import writing
from workloads.scoring import Score, Scorer


class RecordWriter:
    """Appends one JSON line per request to records.jsonl, written through at once (a crash loses at most the
    line being written). A write that fails is a StorageError naming the file (the campaign stops), and the
    file is cut back to its last whole line: a full disk leaves no partial record behind."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._size = os.fstat(self._fd).st_size  # where the next line starts (this writer is the file's only one)
        self.count = 0

    def append(self, line: Record | ScoreLine) -> None:
        encoded = (json.dumps(to_json(line), ensure_ascii=False, default=str) + "\n").encode()
        data = memoryview(encoded)
        with writing(self.path):
            try:
                while data:
                    data = data[os.write(self._fd, data) :]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._size)
                raise
        self._size += len(encoded)
        self.count += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def finish_reason(out: Outcome) -> FinishReason:
    """stop | length | abort | error, from the final meta_info."""
    if out.error is not None:
        return "error"
    reason = out.meta_info.get("finish_reason") if isinstance(out.meta_info, dict) else None
    kind = reason.get("type") if isinstance(reason, dict) else reason
    return "stop" if kind == "stop" else "length" if kind == "length" else "abort"


def count(meta: dict[str, Any], key: str) -> int | None:
    """A meta_info count as the record's typed field holds it: the integer, or None when it is absent or
    malformed (the request then carries an error naming it, harness.client.requests.meta_problem; the
    record's meta_info keeps what the server sent)."""
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def chunk_us(out: Outcome) -> list[int]:
    """Arrival of each output-carrying chunk, whole microseconds after t_sent (docs/records.md)."""
    if out.t_sent is None:
        return []
    return [round((t - out.t_sent) * 1e6) for t in out.chunk_times]


def make_record(
    ids: dict[str, Any], request_index: int, request: RequestPlan, out: Outcome, store_text: bool, store_ids: bool
) -> Record:
    """One raw record (docs/records.md), unscored. `ids` holds campaign_id, run_id, arm, base_seed, repeat;
    `request_index` is the request's position in the run (warmup first, from 0)."""
    meta = out.meta_info if isinstance(out.meta_info, dict) else {}
    reason = finish_reason(out)
    completion = count(meta, "completion_tokens")
    return Record(
        schema_version=SCHEMA_VERSION,
        **ids,
        request_index=request_index,
        item_id=request.item.item_id,
        seed_offset=request.item.seed_offset,
        request_seed=request.request_seed,
        category=request.item.category,
        warmup=request.warmup,
        prompt_tokens=count(meta, "prompt_tokens"),
        completion_tokens=completion,
        spec_verify_ct=count(meta, "spec_verify_ct"),
        spec_num_correct_drafts=count(meta, "spec_num_correct_drafts"),
        max_new_tokens=request.max_new_tokens,
        finish_reason=reason,
        hit_cap=reason == "length" and completion is not None and completion >= request.max_new_tokens,
        t_scheduled=out.t_scheduled,
        t_sent=out.t_sent,
        t_first_token=out.t_first_token,
        t_end=out.t_end,
        n_chunks=out.n_chunks,
        chunk_us=chunk_us(out),
        chunk_tokens=out.chunk_tokens,
        error=out.error,
        output_text=out.text if store_text else None,
        output_ids=out.output_ids if store_ids else None,
        reference_answer=request.item.answer,
        meta_info=out.meta_info,
    )


def make_score(request_index: int, request: RequestPlan, text: str, errored: bool, scorer: Scorer) -> ScoreLine:
    """One line of scores.jsonl (docs/records.md): the response scored after the run's measured window.
    An errored request gets no verdict (answer and correct null)."""
    score = Score(answer=None, correct=None, fallback=False) if errored else scorer.score(text, request.item.answer)
    return ScoreLine(
        request_index=request_index,
        item_id=request.item.item_id,
        warmup=request.warmup,
        answer=score.answer,
        correct=score.correct,
        score_fallback=bool(score.fallback),
        scorer=scorer.label,
    )
