"""The terminal tells the whole verdict (issue 53): warnings each in a few words, the changes measured under
foreign load marked in summary.json and in the headline table (pr.md, the terminal), on the golden chunks_v2
campaign (r3-token-200 ran under foreign load; schema 2: its records carry no seals)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mdtable import squash
from rich.console import Console

from analysis import summary
from analysis.pr import FOREIGN_MARK, headline
from analysis.report import build_report, main
from analysis.verdict import verdict
from harness.runner.report_step import print_answer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "analysis"
LOADED = FIXTURES / "chunks_v2" / "golden" / "golden-c1"
WARNINGS = "passed with 2 warnings: foreign load (1 of 4 runs); unsealed records (4 run(s))"


@pytest.fixture(scope="module")
def loaded():
    return build_report([LOADED], n_boot=50)


def test_the_verdict_names_each_warning(loaded):
    assert verdict(loaded.audit) == WARNINGS


def test_the_report_cli_prints_the_whole_verdict(tmp_path, capsys):
    assert main([str(LOADED), "--bootstrap", "50", "--out", str(tmp_path)]) == 0
    assert f"audit: {WARNINGS}\n" in capsys.readouterr().out


def test_the_runner_terminal_prints_the_verdict_and_marks_loaded_rows(loaded, tmp_path):
    console = Console(record=True, width=250)
    print_answer(loaded, [tmp_path / "report.md", tmp_path / "pr.md", tmp_path / "summary.json"], console)
    text = console.export_text()
    assert f"audit: {WARNINGS}" in text
    assert f"Output throughput (tokens/s) {FOREIGN_MARK}" in text
    assert f"{FOREIGN_MARK} Foreign load in 1 of 2 block vs token run pairs" in text


def test_the_headline_marks_the_rows_measured_under_foreign_load(loaded):
    rows = headline(loaded)["Metric"].tolist()
    marked = [r for r in rows if r.endswith(FOREIGN_MARK)]
    assert marked == [
        f"Output throughput (tokens/s) {FOREIGN_MARK}",
        f"Decode throughput, measured (tokens/s) {FOREIGN_MARK}",
    ]
    assert f"| Output throughput (tokens/s) {FOREIGN_MARK} | 12.50 |" in squash(loaded.pr)
    assert f"{FOREIGN_MARK} **Foreign load** in 1 of 2" in loaded.pr


def test_summary_marks_each_change_measured_under_foreign_load(loaded):
    doc = json.loads(json.dumps(summary.summary(loaded)))
    assert doc["pooled"]["throughput"]["changes"]["block"]["foreign_load"] is True
    assert doc["pooled"]["throughput"]["changes"]["block"]["foreign_load_pairs"] == 1
    assert doc["pooled"]["acceptance_length"]["changes"]["block"]["foreign_load"] is False  # over items
    by_seed = {r["base_seed"]: r for r in doc["per_seed"] if r["arm"] == "block"}
    assert by_seed[200]["changes"]["throughput"]["foreign_load"] is True  # r3-token-200 is seed 200's
    assert by_seed[100]["changes"]["throughput"]["foreign_load"] is False


def test_a_clean_report_says_passed_with_its_count():
    report = build_report([FIXTURES / "ratio_vs_mean" / "golden" / "golden-c1"], n_boot=50)
    warned = [c for c in report.audit.checks if c.status == "warn"]
    assert verdict(report.audit) == "passed with 1 warning: unsealed records (4 run(s))", warned
