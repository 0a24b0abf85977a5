"""The report as data (`Report`): what `analysis.report.build_report` computes and `analysis.markdown`
renders, in a module of its own so that both can import it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.audit import Audit
from analysis.compare import ChangeSet
from analysis.gate import GateResult
from analysis.load import Loaded
from analysis.metrics import Metrics
from analysis.outputs import Identity
from analysis.positions import Acceptance
from analysis.tables import Tables


@dataclass
class Report:
    """Everything the report shows, as data. `markdown` is the rendered report.md."""

    inputs: list[Path]
    data: Loaded
    arms: list[str]
    baseline: str
    audit: Audit
    metrics: Metrics
    comparison: ChangeSet
    tables: Tables
    figures: dict[str, str]  # file name under figures/ -> caption
    n_boot: int
    bootstrap_seed: int  # the seed of the bootstrap and permutation draws
    power: pd.DataFrame  # run pairs needed for a 1%, 2%, 5% change at 80% power (compare.power_table)
    acceptance: Acceptance | None = None  # per draft position (None without correct-drafts histograms)
    outputs: list[Identity] = field(default_factory=list)  # per non-baseline arm: its outputs against the baseline's
    gate: GateResult | None = None  # the regression gate's verdict (--fail-on, experiment.gate); None: no rules
    markdown: str = ""
    edited: str | None = None  # the banner of a report over records changed since sealed (--allow-edited)
    pr: str = ""  # pr.md: the short summary a pull request carries
