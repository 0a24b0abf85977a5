"""ConfigError and the value checks every typed config of the harness uses (choices, ranges, safe names,
CPU lists). Standard library only: the embedded server and the microbenchmark raise ConfigError without
loading Hydra."""

from __future__ import annotations

import math
import os
import re
from typing import Any


class ConfigError(ValueError):
    """A configuration value is wrong; the message names it and says how to fix it."""


def check_choice(what: str, value: Any, choices: list | tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{what}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def check_range(
    what: str, value: float, low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False
) -> None:
    """ConfigError unless `value` is a finite number in the interval (NaN and infinities never are)."""
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if not math.isfinite(value) or too_low or too_high:
        interval = ("(" if low_open else "[") + f"{low:g}, {high:g}" + (")" if high_open or high == math.inf else "]")
        raise ConfigError(f"{what}={value!r} must be a finite number in {interval}")


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(what: str, value: str) -> None:
    """Names that become directories under results_dir: no separators, no '..', nothing hidden."""
    if not SAFE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(
            f"{what}={value!r} is not a safe directory name: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, without '..' (it names a folder under results_dir)"
        )


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (every CPU where sched_getaffinity is missing)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return set(range(os.cpu_count() or 1))


def check_cpus(what: str, cpus: list[int]) -> None:
    """ConfigError unless every CPU of a pinning list exists for this process, once each."""
    allowed = allowed_cpus()
    bad = [c for c in cpus if c not in allowed]
    if bad:
        raise ConfigError(
            f"{what}={list(cpus)} names CPU(s) {bad} that this process may not run on (allowed: "
            f"{', '.join(map(str, sorted(allowed)))}); pick from those, or [] for no pinning"
        )
    if len(set(cpus)) != len(cpus):
        raise ConfigError(f"{what}={list(cpus)} lists a CPU twice; list each CPU once")


def new_out_dir(what: str, path: str) -> str:
    """`path` made as an empty folder for a run's output, or ConfigError when it is a file or already holds files
    (a run never writes over results recorded before)."""
    if os.path.isdir(path) and os.listdir(path):
        held = sorted(os.listdir(path))
        raise ConfigError(
            f"{what}={path} already holds {', '.join(held[:3])}{' ...' if len(held) > 3 else ''}: a "
            "run never writes over earlier results; name a new folder, or move that one away first"
        )
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{what}={path} is a file, not a folder; name a new folder")
    os.makedirs(path, exist_ok=True)
    return path
