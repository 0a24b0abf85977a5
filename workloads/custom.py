"""The `jsonl` workload: your own items in a local JSONL file (or Parquet, or a dataset directory).

One object per line (blank lines are skipped), validated line by line; an error names the line:
- `id` (string or integer, unique, required): the item id. When every id is an integer (or a string
  of digits) it is also the seed offset; otherwise the seed offset is the row's 0-based position.
- `prompt` (string) and/or `messages` (list of `{"role": system|user|assistant, "content": str}`
  ending with a user message), at least one. Without `messages`, the prompt is one user message;
  without `prompt`, the plain-text prompt joins the message contents with blank lines (use the chat
  route for real multi-message items).
- optional: `answer` (string or integer; scored like AIME's, boxed), `category` (string),
  `meta` (anything; hashed, otherwise ignored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workloads.base import Item, Workload, WorkloadError
from workloads.config import WorkloadConfig
from workloads.pipeline import materialise, seed_offsets
from workloads.read_split import SplitRows, dataset_id_of, read_split
from workloads.subset import Candidate

ALLOWED_KEYS = ("id", "prompt", "messages", "answer", "category", "meta")
ROLES = ("system", "user", "assistant")
_LINE_SUFFIXES = (".jsonl", ".ndjson", ".json")


def load(cfg: WorkloadConfig) -> Workload:
    """Items from `workload.path`: JSONL parsed here line by line, anything else through `datasets`."""
    if not cfg.path:
        raise WorkloadError("workload.kind=jsonl needs workload.path (a .jsonl or .parquet file)")
    path = Path(cfg.path).expanduser()
    if path.is_file() and path.suffix.lower() in _LINE_SUFFIXES:
        src, lines = read_jsonl(cfg, path)
        wheres = [f"{src.label}: line {n}" for n in lines]
    else:
        src = read_split(cfg)
        wheres = [f"{src.label}: row {n}" for n in range(1, len(src.rows) + 1)]
    return materialise(cfg, src, lambda rows: to_candidates(rows, wheres))


def read_jsonl(cfg: WorkloadConfig, path: Path) -> tuple[SplitRows, list[int]]:
    """The objects of a JSONL file and the line number of each (blank lines are skipped)."""
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            where = f"{path}: line {n}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise WorkloadError(
                    f"{where}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); save the file as UTF-8"
                ) from None
            if line.strip():
                rows.append(_parse_line(line, where))
                lines.append(n)
    if not rows:
        raise WorkloadError(f"workload.path={cfg.path}: no items (the file is empty)")
    return SplitRows(rows, dataset_id_of(cfg), cfg.revision, f"file:{path.resolve()}", str(path)), lines


def _parse_line(line: str, where: str) -> dict[str, Any]:
    try:
        obj = json.loads(line, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); one object per line") from e
    except ValueError as e:  # NaN or Infinity (not JSON), or an integer too long for Python to read
        what = str(e) if isinstance(e, _NotJson) else "an integer of more than 4,300 digits"
        raise WorkloadError(f"{where}: {what}; write the value as text, or drop it") from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    try:  # a lone surrogate ("\ud800") parses, but no file or request can carry it
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise WorkloadError(
            f"{where}: holds text that is not valid Unicode (a lone surrogate such as \\ud800)"
        ) from None
    return obj


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON number")


def to_candidates(rows: list[dict[str, Any]], wheres: list[str]) -> list[Candidate]:
    """Validate every row (`wheres[i]` names row i's line or row in errors) and build the candidates."""
    first_seen: dict[str, str] = {}
    for row, where in zip(rows, wheres, strict=True):
        validate_row(row, where)
        key = str(row["id"])
        if key in first_seen:
            raise WorkloadError(f"{where}: id {key!r} is already used ({first_seen[key]}); ids must be unique")
        first_seen[key] = where
    offsets = seed_offsets([row["id"] for row in rows])
    return [_candidate(row, off) for row, off in zip(rows, offsets, strict=True)]


def validate_row(row: dict[str, Any], where: str) -> None:
    """Refuse a row that does not follow the format in the module docstring."""
    unknown = sorted(k for k in row if k not in ALLOWED_KEYS)
    if unknown:
        raise WorkloadError(f"{where}: unknown keys {unknown}; allowed: {', '.join(ALLOWED_KEYS)}")
    _check_id(row.get("id"), where)
    prompt, messages = row.get("prompt"), row.get("messages")
    if prompt is None and messages is None:
        raise WorkloadError(f"{where}: needs 'prompt' (text) or 'messages' (chat)")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise WorkloadError(f"{where}: 'prompt' must be a non-empty string")
    if messages is not None:
        _check_messages(messages, where)
    answer = row.get("answer")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, str | int)):
        raise WorkloadError(f"{where}: 'answer' must be a string or an integer, got {answer!r}")
    if isinstance(answer, str) and not answer.strip():
        raise WorkloadError(
            f"{where}: 'answer' is empty (no response could match it); leave the key out for an "
            "item without a reference answer"
        )
    category = row.get("category")
    if category is not None and not isinstance(category, str):
        raise WorkloadError(f"{where}: 'category' must be a string, got {category!r}")


def _check_id(value: Any, where: str) -> None:
    if value is None:
        raise WorkloadError(f"{where}: missing 'id'")
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value).strip() == "":
        raise WorkloadError(f"{where}: 'id' must be a non-empty string or an integer, got {value!r}")


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise WorkloadError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise WorkloadError(f"{where}: messages[{k}] must be an object with exactly 'role' and 'content'")
        if m["role"] not in ROLES:
            raise WorkloadError(f"{where}: messages[{k}].role={m['role']!r}; use one of {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise WorkloadError(f"{where}: messages[{k}].content must be a string")
    if messages[-1]["role"] != "user":
        raise WorkloadError(f"{where}: the last message must be the user's (the model answers it)")
    if not messages[-1]["content"].strip():
        raise WorkloadError(f"{where}: the last message (the user's, which the model answers) has no text")


def _candidate(row: dict[str, Any], seed_offset: int) -> Candidate:
    messages = row.get("messages")
    prompt = row.get("prompt")
    if prompt is None:
        assert messages is not None  # validate_row: prompt or messages (or both)
        prompt = "\n\n".join(m["content"] for m in messages)
    if messages is None:
        messages = [{"role": "user", "content": prompt}]
    answer = row.get("answer")
    category = row.get("category")
    item = Item(
        item_id=str(row["id"]),
        seed_offset=seed_offset,
        prompt=prompt,
        messages=[dict(m) for m in messages],
        answer=None if answer is None else str(answer),
        category=category,
    )
    return Candidate(item=item, categories=(category,) if category else ())
