"""Freezing a dataset by the SHA256 of the canonical serialisation of its materialised rows.

Canonical serialisation: each row as JSON with sorted keys, no insignificant whitespace, UTF-8
text kept as is (`ensure_ascii=False`), one row per line in the source's order, each line ending in
`\\n`. The same rows give the same hash whichever way they were read (hub, cache, Parquet, JSONL,
a saved dataset directory), since the hash sees values, never files.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from workloads.config import WorkloadConfig
from workloads.errors import WorkloadError

log = logging.getLogger(__name__)


def canonical_line(row: Mapping[str, Any]) -> str:
    """One row's canonical JSON line (without the newline)."""
    return json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def rows_sha256(rows: Iterable[Mapping[str, Any]], what: str = "the rows") -> str:
    """SHA256 (hex) of the canonical serialisation of `rows`; WorkloadError naming the row (0-based, of `what`) that
    has no canonical form: NaN or infinite numbers (JSON has none), text that is not valid Unicode."""
    digest = hashlib.sha256()
    for i, row in enumerate(rows):
        try:
            digest.update(canonical_line(row).encode("utf-8"))
        except (ValueError, UnicodeEncodeError) as exc:  # (ValueError: NaN, infinities, an int past 4,300 digits)
            reason = "text that is not valid Unicode" if isinstance(exc, UnicodeEncodeError) else str(exc)
            raise WorkloadError(
                f"{what}: row {i} holds a value with no JSON form ({reason}); fix or drop that row"
            ) from None
        digest.update(b"\n")
    return digest.hexdigest()


def check_frozen(cfg: WorkloadConfig, actual: str, what: str, warn_unpinned: bool = True) -> None:
    """Compare the computed hash with `workload.sha256`; refuse a mismatch unless told not to.

    Logs the computed hash in every case (a warning when nothing is pinned and `warn_unpinned`), so
    that a first real load tells the user what to pin.
    """
    if cfg.sha256 is None:
        log.log(
            logging.WARNING if warn_unpinned else logging.INFO,
            "workload %s: %s is not frozen; its rows hash to sha256=%s. Pin it with workload.sha256=%s",
            cfg.kind,
            what,
            actual,
            actual,
        )
        return
    if cfg.sha256 == actual:
        log.info("workload %s: %s matches the frozen sha256=%s", cfg.kind, what, actual)
        return
    message = (
        f"workload {cfg.kind}: the rows of {what} do not match the frozen hash: "
        f"expected workload.sha256={cfg.sha256}, actual sha256={actual}. The data changed (another "
        "revision, a re-prepared file, edited rows). Check it, then pin the new hash with "
        f"workload.sha256={actual}, or run on it anyway with workload.allow_hash_mismatch=true."
    )
    if not cfg.allow_hash_mismatch:
        raise WorkloadError(message)
    log.warning("%s Going on because workload.allow_hash_mismatch=true.", message)
