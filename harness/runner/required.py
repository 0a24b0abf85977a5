"""Required values (`???`) that Hydra's composition can lose, and the values it cannot lose, checked together.

OmegaConf fills a list element (an arm) from its schema before merging the YAML onto it, and a merged `???` keeps
what is already there: an arm's `python: ???` left unset became the schema's default (None, the harness's own
interpreter) without a word. So the chosen config files are read again here, raw, and every key they mark `???`
must hold a value after composition, as `server.model_path: ???` always had to (its schema has no default).
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.runner.cmdline import CommandLine
from harness.validation import ConfigError

_INDEX = re.compile(r"\[(\d+)\]")


def dotted(key: str) -> str:
    """`experiment.arms[0].python` -> `experiment.arms.0.python` (the form an override is written in)."""
    return _INDEX.sub(r".\1", key)


def _package(path: Path, group: str) -> str:
    """The key prefix a group file's keys land under: '' for `# @package _global_`, else the group's name."""
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("#"):
            break
        if line.replace(" ", "") == "#@package_global_":
            return ""
    return f"{group}."


def chosen_files(choices: dict[str, str], config_dirs: list[Path], groups: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(group, file) of each chosen option of `groups`, the first config folder that has it (Hydra's search order)."""
    out = []
    for group in groups:
        choice = choices.get(group)
        if not choice:
            continue
        path = next(
            (d / group / f"{choice}.yaml" for d in config_dirs if (d / group / f"{choice}.yaml").is_file()), None
        )
        if path is not None:
            out.append((group, path))
    return out


def declared_required(files: list[tuple[str, Path]]) -> list[str]:
    """Every key that one of the files marks `???`, dotted, with its package's prefix."""
    keys = []
    for group, path in files:
        prefix = _package(path, group)
        keys += [prefix + dotted(k) for k in OmegaConf.missing_keys(OmegaConf.load(path))]
    return keys


def unset_required(cfg: DictConfig, required: list[str], override_keys: list[str]) -> list[str]:
    """The required keys without a value: missing in the composed config, or a `???` of a file that composition
    turned into a schema default (None) and that no command-line override set (an override of the key itself, or
    of a list or mapping above it, decides)."""
    out = {dotted(k) for k in OmegaConf.missing_keys(cfg)}
    for key in required:
        overridden = any(key == o or key.startswith(o + ".") for o in override_keys)
        if not overridden and OmegaConf.select(cfg, key, default=None, throw_on_missing=False) in (None, "???"):
            out.add(key)
    return sorted(out)


def check_required(cfg: DictConfig, line: CommandLine | None, groups: tuple[str, ...]) -> None:
    """ConfigError naming every required key that has no value, and how to set the first. Without a command line
    (a config composed outside @hydra.main) only what the composition itself marks missing is seen."""
    files = chosen_files(line.choices, list(line.config_dirs), groups) if line else []
    values = [k for k in line.keys() if k not in groups] if line else []  # (a group's override picks a file)
    missing = unset_required(cfg, declared_required(files), values)
    if missing:
        one = len(missing) == 1
        raise ConfigError(
            f"{', '.join(missing)} {'is' if one else 'are'} required and {'has' if one else 'have'} no "
            f"value: set {'it' if one else 'each'} on the command line ({missing[0]}=...) or in the "
            "experiment file"
        )
