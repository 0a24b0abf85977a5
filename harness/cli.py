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
from hydra.errors import HydraException

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class OverrideError(ValueError):
    pass


def group_options(group: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    return sorted(p.stem for p in (config_dir / group).glob("*.yaml"))


def _unwrap(tp: Any) -> Any:
    """X | None -> X."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def check_key(schema: type, dotted: str) -> None:
    """Raise OverrideError naming the first unknown segment of `dotted` and the valid keys there."""
    tp: Any = schema
    walked: list[str] = []
    for part in dotted.split("."):
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp)
            if part not in hints:
                where = ".".join(walked) or "the top level"
                raise OverrideError(f"unknown key {dotted!r}: {where} has no key {part!r}; "
                                    f"valid keys: {', '.join(hints)}")
            tp = hints[part]
        elif origin in (list, tuple):
            if not part.isdigit():
                raise OverrideError(f"{'.'.join(walked)} is a list: index it with a number, not {part!r}")
            tp = typing.get_args(tp)[0] if typing.get_args(tp) else Any
        elif origin is dict or tp is Any:
            return  # free-form mapping: any key
        else:
            raise OverrideError(f"{'.'.join(walked)} is a value, it has no key {part!r}")
        walked.append(part)


def check_overrides(argv: list[str], schema: type, groups: tuple[str, ...], config_dir: Path = CONFIG_DIR) -> None:
    """Validate `key=value` overrides (Hydra syntax) against the schema and the config groups."""
    candidates = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(candidates)
    except HydraException as exc:
        raise OverrideError(str(exc)) from None
    for o in overrides:
        key = o.key_or_group
        if key.startswith("hydra") or o.is_add() or o.is_delete() or o.is_force_add():
            continue
        if key in groups:
            options = group_options(key, config_dir)
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            for value in values:
                if value not in options:
                    raise OverrideError(f"{key}={value!r} does not exist; valid {key} configs: {', '.join(options)}"
                                        f" (files in {config_dir / key})")
            continue
        check_key(schema, key)
