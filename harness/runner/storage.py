"""Writing a campaign's files: a write that fails (a full disk, a read-only folder, a quota) is a
StorageError naming the file, and the campaign stops at once: every later run would fail the same way, and
nothing written before is touched (records.jsonl is appended and flushed per line, JSON documents are
replaced atomically)."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.contract import write_json


class StorageError(RuntimeError):
    """A file of the campaign could not be written; the message names it and the system's reason."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(f"cannot write {path}: {exc.strerror or exc}")
        self.path = path


# what a disk says when it cannot take more: full, over quota, read-only
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def disk_error(exc: BaseException, fallback: Path) -> StorageError | None:
    """A StorageError for an OSError that says the disk cannot take a write (a server's log file that cannot
    be opened, say), naming its file or `fallback`; None for any other error."""
    if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
        return StorageError(Path(exc.filename) if exc.filename else fallback, exc)
    return None


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError of the block into a StorageError naming `path`."""
    try:
        yield
    except OSError as exc:
        raise StorageError(path, exc) from exc


def save_json(path: Path, obj: Any) -> None:
    """write_json (atomic replace), a failure as a StorageError."""
    with writing(path):
        write_json(path, obj)
