"""Checks of Hydra command-line overrides against the typed schema, before Hydra composes anything.

Hydra rejects an unknown key but does not say which keys exist; this check does, so that
`client.concurency=8` fails with the valid keys of `client` listed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException
from omegaconf import BooleanNode, FloatNode, IntegerNode
from omegaconf.errors import ValidationError

from harness.hydra_setup import CONFIG_DIR


class OverrideError(ValueError):
    pass


def group_options(group: str, config_dir: Path = CONFIG_DIR, extra_dirs: tuple[Path, ...] = ()) -> list[str]:
    """The options of a config group: its YAML files in the shipped configs and in any --config-dir."""
    return sorted({p.stem for d in (config_dir, *extra_dirs) for p in (d / group).glob("*.yaml")})


def extra_config_dirs(argv: list[str]) -> tuple[Path, ...]:
    """The folders given with Hydra's `--config-dir DIR` / `-cd DIR` (also `--config-dir=DIR`)."""
    dirs = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]))
        elif arg.startswith(("--config-dir=", "-cd=")):
            dirs.append(Path(arg.split("=", 1)[1]))
    return tuple(dirs)


def _group_values(override: Any, options: list[str]) -> list[str]:
    """The option names an override of a config group asks for: one, a list sweep, or a glob's matches."""
    if override.value_type == ValueType.GLOB_CHOICE_SWEEP:
        return override.value().filter(options) or [f"glob({','.join(override.value().include)})"]
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def _unwrap(tp: Any) -> Any:
    """X | None -> X."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def check_key(schema: type, dotted: str) -> Any:
    """The type of `dotted` in the schema (Any inside a free-form mapping); OverrideError naming its first unknown
    segment and the valid keys there."""
    tp: Any = schema
    walked: list[str] = []
    for part in dotted.split("."):
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp)
            if part not in hints:
                where = ".".join(walked) or "the top level"
                raise OverrideError(
                    f"unknown key {dotted!r}: {where} has no key {part!r}; valid keys: {', '.join(hints)}"
                )
            tp = hints[part]
        elif origin in (list, tuple):
            if not part.isdigit():
                raise OverrideError(f"{'.'.join(walked)} is a list: index it with a number, not {part!r}")
            tp = typing.get_args(tp)[0] if typing.get_args(tp) else Any
        elif origin is dict or tp is Any:
            return Any  # free-form mapping: any key
        else:
            raise OverrideError(f"{'.'.join(walked)} is a value, it has no key {part!r}")
        walked.append(part)
    return tp


_NODES = {int: (IntegerNode, "an integer"), float: (FloatNode, "a number"), bool: (BooleanNode, "true or false")}


def check_value(key: str, tp: Any, value: Any) -> None:
    """OverrideError when `value` (as Hydra parsed it) is one the typed config would refuse for a field of type `tp`
    (the same conversions: OmegaConf's nodes); lists are checked element by element."""
    if value is None:
        if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp):
            return
        if tp is not Any:
            raise OverrideError(f"{key}=null: {key} needs a value")
        return
    tp = _unwrap(tp)
    if typing.get_origin(tp) in (list, tuple) and typing.get_args(tp):
        if not isinstance(value, list):
            raise OverrideError(f"{key}={value!r} is not a list; write it as {key}=[...]")
        for element in value:
            check_value(key, typing.get_args(tp)[0], element)
        return
    if tp in _NODES:
        node, kind = _NODES[tp]
        try:
            node(value)
        except ValidationError:
            raise OverrideError(f"{key}={value!r} is not {kind}") from None


def check_global_package(candidates: list[Path]) -> None:
    """OverrideError when the first of `candidates` that exists (an experiment file) lacks Hydra's `# @package
    _global_` in its header: without it, its `experiment:` lands under experiment.experiment and Hydra says only that
    the key is not in ExperimentConfig."""
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        return
    header = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    if not any(h.replace(" ", "") == "#@package_global_" for h in header):
        raise OverrideError(
            f"{path}: an experiment file begins with the line '# @package _global_' (it sets "
            "experiment:, server:, ... at the top level of the config); add it as its first line"
        )


def parse(candidates: list[str]) -> list[Any]:
    """Hydra's parse of the overrides; OverrideError naming the one that does not parse and, where the value
    only needs quoting (git's HEAD~1, HEAD^, a path with spaces), how to quote it."""
    parser = OverridesParser.create()
    try:
        return parser.parse_overrides(candidates)
    except HydraException as exc:
        for text in candidates:
            try:
                parser.parse_overrides([text])
            except HydraException:
                key, sep, value = text.partition("=")
                if not sep or not value or any(q in value for q in "'\""):
                    break
                quoted = f'{key}="{value}"'
                try:
                    parser.parse_overrides([quoted])
                except HydraException:
                    break
                raise OverrideError(
                    f"{text}: Hydra's override grammar needs this value quoted (characters such as "
                    f"~ ^ {{ }} and spaces end an unquoted value); write it as '{quoted}' (the single "
                    "quotes keep the double quotes from the shell)"
                ) from None
        raise OverrideError(str(exc)) from None


def check_overrides(argv: list[str], schema: type, groups: tuple[str, ...], config_dir: Path = CONFIG_DIR) -> None:
    """Validate `key=value` overrides (Hydra syntax) against the schema and the config groups."""
    extra = extra_config_dirs(argv)
    candidates = [
        a
        for i, a in enumerate(argv)
        if ("=" in a or a.startswith("~"))
        and not a.startswith("-")
        and not (i and argv[i - 1] in ("--config-dir", "-cd"))
    ]
    overrides = parse(candidates)
    for o in overrides:
        key = o.key_or_group
        if key.startswith("hydra"):
            continue  # (an added key, +key or ++key, must exist too: the typed config drops one it does not know)
        if key in groups:
            options = group_options(key, config_dir, extra)
            for value in _group_values(o, options):
                if value not in options:
                    where = ", ".join(str(d / key) for d in (config_dir, *extra))
                    raise OverrideError(
                        f"{key}={value!r} does not exist (or matches nothing); valid {key} configs: "
                        f"{', '.join(options)} (files in {where})"
                    )
                if key == "experiment":
                    check_global_package([d / key / f"{value}.yaml" for d in (*extra, config_dir)])
            continue
        tp = check_key(schema, key)
        if o.is_delete():
            if tp is not Any:  # inside a free-form mapping (server.env.NAME) a key may go
                raise OverrideError(f"~{key}: the typed config cannot lose a key; set it instead ({key}=...)")
            continue
        parsed: list[Any]
        if o.value_type in (ValueType.SIMPLE_CHOICE_SWEEP, ValueType.CHOICE_SWEEP, ValueType.RANGE_SWEEP):
            parsed = list(o.sweep_iterator())
        elif o.is_sweep_override():
            continue  # an interval (a sweeper's search space): its sweeper picks the values
        else:
            parsed = [o.value()]
        for one in parsed:
            check_value(key, tp, one)
