"""Overrides that nothing would read. One schema serves every workload kind, server backend and placement, so a
key can be valid and still be ignored by the chosen kind: `workload.path=FILE` with the synthetic workload ran the
synthetic workload, `workload.n_items=5` with AIME still planned its 30 problems. A command-line override of such a
key is refused (exit 2), naming it, what reads it and how to choose that; values the config files set are theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.runner.config import BenchConfig
from harness.validation import ConfigError

DATASETS = ("aime25", "speed_bench", "jsonl")


@dataclass(frozen=True)
class Reader:
    """Who reads a key: the config value (`on`) it depends on, the values that read it, and how to pick one."""

    on: str  # dotted key of the choice, e.g. workload.kind
    values: tuple[str, ...]
    how: str  # what to add to the command line for a reader, e.g. "workload=jsonl"


def _value(cfg: BenchConfig, dotted: str) -> str:
    node: object = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return str(node)


SYNTHETIC = Reader("workload.kind", ("synthetic",), "workload=synthetic")
HUB = Reader("workload.kind", ("aime25", "speed_bench"), "workload=aime25 or workload=speed_bench")
FILES = Reader("workload.kind", DATASETS, "workload=jsonl (or a dataset kind: aime25, speed_bench)")
READERS: dict[str, Reader] = {
    "workload.n_items": SYNTHETIC,
    "workload.seed": SYNTHETIC,
    "workload.level": SYNTHETIC,
    "workload.hf_id": HUB,
    "workload.hf_config": HUB,
    "workload.path": FILES,
    "workload.split": FILES,
    "workload.revision": FILES,
    "workload.cache_dir": FILES,
    "workload.skip_placeholders": Reader("workload.kind", ("speed_bench",), "workload=speed_bench"),
    "server.binary": Reader("server.backend", ("llamacpp",), "server=llamacpp"),
    "server.python": Reader("server.backend", ("embedded", "sglang"), "server=embedded or server=sglang"),
    "server.module": Reader("server.backend", ("embedded", "sglang"), "server=embedded or server=sglang"),
    "experiment.gpus": Reader("experiment.placement", ("parallel",), "experiment.placement=parallel"),
    "client.chat_template_kwargs": Reader("client.route", ("chat",), "client=chat"),
}
# a key some kinds do not read, but whose intent another key serves there
INSTEAD = {
    ("workload.n_items", "aime25"): "take a seeded subset of the fixed set with workload.subsample=N",
    ("workload.n_items", "speed_bench"): "take a seeded subset with workload.subsample=N",
    ("workload.n_items", "jsonl"): "take a seeded subset of the file's items with workload.subsample=N",
}


def unread_overrides(cfg: BenchConfig, keys: list[str]) -> list[str]:
    """For each override key (or one inside it) that the chosen kind does not read: why, and what to do."""
    out = []
    for key in keys:
        for dotted, reader in READERS.items():
            if key != dotted and not dotted.startswith(key + ".") and not key.startswith(dotted + "."):
                continue
            chosen = _value(cfg, reader.on)
            if chosen in reader.values:
                continue
            instead = INSTEAD.get((dotted, chosen))
            fix = instead or f"for a kind that reads it, add {reader.how}"
            out.append(
                f"{dotted} is not read with {reader.on}={chosen} (only with {reader.on}="
                f"{' or '.join(reader.values)}): {fix}, or leave {dotted} out"
            )
    return out


def check_unread(cfg: BenchConfig, keys: list[str]) -> None:
    """ConfigError naming every override that nothing would read."""
    problems = unread_overrides(cfg, keys)
    if problems:
        raise ConfigError("an override that nothing reads would change nothing: " + "; ".join(problems))
