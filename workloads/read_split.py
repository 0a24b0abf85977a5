"""Reading a split's rows with Hugging Face `datasets`: from the hub (or its local cache, which is
all `HF_DATASETS_OFFLINE=1` allows), or from a local file or directory in the same format.

`workload.path` wins over `workload.hf_id`:
- a `.parquet`, `.jsonl`/`.ndjson`/`.json` or `.arrow` file: read as the split `workload.split`;
- a directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`;
- any other directory, e.g. a copy of the hub repository (`hf download ID --repo-type dataset
  --local-dir DIR`), read by `load_dataset(DIR, workload.hf_config)` (the config name only when the
  directory has the repository's README.md, which declares the configs).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from workloads.base import WorkloadError
from workloads.config import WorkloadConfig

HUB_TIMEOUT_S = 3.0  # to open a connection to the hub before its libraries are let try
_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".ndjson": "json", ".json": "json", ".arrow": "arrow"}


@dataclass(frozen=True)
class SplitRows:
    """The materialised rows of one split and where they came from."""

    rows: list[dict[str, Any]]
    dataset_id: str
    revision: str | None
    origin: str  # "hub" or "file:<absolute path>"
    label: str  # for messages: what was read


def read_split(cfg: WorkloadConfig) -> SplitRows:
    """All rows of the configured split, from `workload.path` if set, else from the hub (or its cache)."""
    if cfg.path:
        return _read_local(cfg, Path(cfg.path).expanduser())
    if cfg.hf_id:
        return _read_hub(cfg)
    raise WorkloadError(
        f"workload.kind={cfg.kind} needs workload.hf_id (a Hugging Face dataset) or workload.path "
        f"(a local file or directory); select the preset with workload={cfg.kind}"
    )


def dataset_id_of(cfg: WorkloadConfig) -> str:
    """The logical dataset: `hf_id[:hf_config]`, or `file:<name>` for a file with no hub id."""
    if cfg.hf_id:
        return cfg.hf_id + (f":{cfg.hf_config}" if cfg.hf_config else "")
    return f"file:{Path(cfg.path or '').name}"


def hub_address() -> tuple[str, int]:
    """The hub's host and port ($HF_ENDPOINT where set, else huggingface.co:443)."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def offline_by_setting() -> str | None:
    """The variable that makes the hub libraries offline, as `NAME=value`, or None."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{name}={os.environ[name]}"
    return None


def hub_reachable(timeout_s: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub opens within `timeout_s` (a machine without network says so in
    seconds, where the hub libraries retry each request for about 25 s)."""
    try:
        socket.create_connection(hub_address(), timeout=timeout_s).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def cache_only() -> Iterator[None]:
    """The hub libraries offline for the duration (they read their flag at import: set on their modules)."""
    import datasets.config as datasets_config  # noqa: PLC0415  (heavy: where a dataset is read)
    import huggingface_hub.constants as hub_constants  # noqa: PLC0415

    saved = datasets_config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE
    datasets_config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets_config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def _read_hub(cfg: WorkloadConfig) -> SplitRows:
    import datasets  # noqa: PLC0415  (heavy: imported where a dataset is read)

    label = f"{dataset_id_of(cfg)} split {cfg.split} revision {cfg.revision or 'main (unpinned)'}"
    setting = offline_by_setting()
    reachable = setting is None and hub_reachable()
    try:
        with contextlib.nullcontext() if reachable else cache_only():
            ds = datasets.load_dataset(
                cfg.hf_id, cfg.hf_config, split=cfg.split, revision=cfg.revision, cache_dir=cfg.cache_dir
            )
    except (OSError, ValueError, StopIteration, datasets.exceptions.DatasetsError) as e:  # (StopIteration: an
        # empty JSON file)
        host, port = hub_address()
        why = (
            f"offline by your setting ({setting}): only the local cache was read, and it does not hold it"
            if setting
            else f"the hub ({host}:{port}) cannot be reached from this machine (no connection within "
            f"{HUB_TIMEOUT_S:g} s), so only the local cache was read, and it does not hold it"
            if not reachable
            else f"{type(e).__name__}: {e}"
        )
        raise WorkloadError(
            f"workload {cfg.kind}: could not load {label}: {why}. Fetch it once where the hub can be reached "
            f"(`hf download {cfg.hf_id} --repo-type dataset --local-dir DIR`"
            f"{f' --revision {cfg.revision}' if cfg.revision else ''}) and run with workload.path=DIR, "
            "or load it once online so that it lands in the cache."
        ) from e
    return SplitRows(ds.to_list(), dataset_id_of(cfg), cfg.revision, "hub", label)


def _read_local(cfg: WorkloadConfig, path: Path) -> SplitRows:
    if not path.exists():
        raise WorkloadError(f"workload.path={cfg.path} does not exist")
    config = f"config {cfg.hf_config}, " if cfg.hf_config and (path / "README.md").exists() else ""
    label = f"{path} ({config}split {cfg.split})"
    import datasets  # noqa: PLC0415  (heavy: imported where a dataset is read)

    try:
        ds = _load_dir(cfg, path) if path.is_dir() else _load_file(cfg, path)
    except WorkloadError:
        raise
    except StopIteration:  # datasets' JSON reader on an empty file
        raise WorkloadError(f"workload {cfg.kind}: {label} holds no rows") from None
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as e:
        cause = f" (cause: {type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ else ""
        raise WorkloadError(
            f"workload {cfg.kind}: could not read {label}: {type(e).__name__}: {e}{cause}; "
            "check that every row of the file is valid"
        ) from e
    return SplitRows(ds.to_list(), dataset_id_of(cfg), cfg.revision, f"file:{path.resolve()}", label)


# a local file is read again each time: datasets' cache would serve the rows of an earlier file of the same size and
# modification time (cp -p, rsync -t, tar), and the frozen hash would pass over a changed file
_FRESH = "force_redownload"


def _load_file(cfg: WorkloadConfig, path: Path) -> Any:
    import datasets  # noqa: PLC0415  (heavy: imported where a dataset is read)

    builder = _FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise WorkloadError(
            f"workload.path={cfg.path}: unsupported file type {path.suffix!r}; "
            f"use one of {', '.join(_FILE_BUILDERS)} or a dataset directory"
        )
    return datasets.load_dataset(
        builder,
        data_files={cfg.split: str(path)},
        split=cfg.split,
        cache_dir=cfg.cache_dir,
        download_mode=_FRESH,
    )


def _load_dir(cfg: WorkloadConfig, path: Path) -> Any:
    import datasets  # noqa: PLC0415  (heavy: imported where a dataset is read)

    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        return _pick_split(cfg, datasets.load_from_disk(str(path)))
    name = cfg.hf_config if (path / "README.md").exists() else None
    return datasets.load_dataset(str(path), name, split=cfg.split, cache_dir=cfg.cache_dir, download_mode=_FRESH)


def _pick_split(cfg: WorkloadConfig, loaded: Any) -> Any:
    import datasets  # noqa: PLC0415  (heavy: imported where a dataset is read)

    if not isinstance(loaded, datasets.DatasetDict):
        return loaded
    if cfg.split not in loaded:
        raise WorkloadError(f"workload.split={cfg.split} is not in {cfg.path}; its splits: {', '.join(loaded)}")
    return loaded[cfg.split]
