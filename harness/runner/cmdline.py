"""What the user asked for on the command line, as Hydra composed it: the overrides as given, the option chosen in
each config group, and the config folders searched (the shipped configs, any --config-dir). The checks that need
it: keys that a chosen file marks required (harness.runner.required), overrides that nothing reads
(harness.runner.unread), and the resume hint, which repeats the overrides."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser


@dataclass(frozen=True)
class CommandLine:
    overrides: tuple[str, ...]  # Hydra's task overrides, as typed
    choices: dict[str, str]  # config group -> the option chosen (defaults included)
    config_dirs: tuple[Path, ...]  # the file config sources, in Hydra's search order

    @classmethod
    def of(cls, hydra: Any) -> CommandLine:
        """From Hydra's own config node (HydraConfig.get(), or `cfg.hydra` of compose(return_hydra_config=True))."""
        choices = {str(k): str(v) for k, v in hydra.runtime.choices.items() if v is not None}
        dirs = tuple(Path(s.path) for s in hydra.runtime.config_sources if s.schema == "file")
        return cls(tuple(hydra.overrides.task), choices, dirs)

    @classmethod
    def current(cls) -> CommandLine | None:
        """The running command's (inside @hydra.main), or None outside it."""
        return cls.of(HydraConfig.get()) if HydraConfig.initialized() else None

    def keys(self) -> list[str]:
        """The dotted key (or config group) of every override, in order."""
        return [o.key_or_group for o in OverridesParser.create().parse_overrides(list(self.overrides))]

    def without(self, *keys: str) -> list[str]:
        """The overrides as typed, less those of `keys` (e.g. campaign, shard), for a hint that repeats them."""
        return [text for text, key in zip(self.overrides, self.keys(), strict=True) if key not in keys]
