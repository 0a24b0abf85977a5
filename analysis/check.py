"""One check of the audit: its name, its status and what it found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Status = Literal["fail", "warn", "ok", "info"]  # fail: the tables should not be trusted
FAIL: Final = "fail"
WARN: Final = "warn"
OK: Final = "ok"
INFO: Final = "info"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    summary: str
    details: tuple[str, ...] = ()
