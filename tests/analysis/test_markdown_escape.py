"""User text in report.md and pr.md (N90): a declared difference or an item id with HTML or markdown in it reads as
text, never as a tag or markup that GitHub would render."""

from __future__ import annotations

import json
import re
from pathlib import Path

from analysis.mdescape import escape_text, no_raw_html
from analysis.pr import portable_paths
from analysis.pr import render as render_pr
from analysis.report import build_report

DECLARED = "x <img src=x onerror=alert(1)> **loud** [link](http://e.example)"
ITEM = "x</table><script>alert(2)</script>"


def plant(camp: Path) -> None:
    """The declared difference, and item q1 renamed to ITEM in every file; q1's measured record in one run made
    invalid, so that the audit's details name the item."""
    for path in camp.rglob("*.json*"):
        path.write_text(path.read_text().replace('"q1"', json.dumps(ITEM)))
    doc = json.loads((camp / "campaign.json").read_text())
    doc["declared_difference"] = DECLARED
    (camp / "campaign.json").write_text(json.dumps(doc))
    records = camp / "runs" / "r1-block-100" / "records.jsonl"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    for rec in lines:
        if rec["item_id"] == ITEM and not rec["warmup"]:
            rec["completion_tokens"] = -40
    records.write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_html_and_markdown_of_the_user_reach_neither_document(clean_campaign):
    plant(clean_campaign)
    report = build_report([clean_campaign])
    assert ITEM in " ".join(d for c in report.audit.checks for d in c.details)  # the item is named
    for doc in (report.markdown, render_pr(report)):
        assert "<img" not in doc and "<script" not in doc and "</table" not in doc, doc
        assert "&lt;img src=x onerror=alert(1)>" in doc and "\\*\\*loud\\*\\* \\[link\\]" in doc
    assert "&lt;/table>&lt;script>" in report.markdown


def test_code_and_fenced_blocks_keep_their_text():
    assert no_raw_html("a <b> `c <d>` & e\n```\n<f>\n```\n<g>") == "a &lt;b> `c <d>` &amp; e\n```\n<f>\n```\n&lt;g>"
    assert escape_text("a*b_c`d|e") == "a\\*b\\_c\\`d\\|e"


def test_pr_md_names_no_absolute_path_of_the_authors_machine(clean_campaign):
    for path in clean_campaign.glob("runs/*/manifest.json"):
        doc = json.loads(path.read_text())
        doc["command"][0] = "/home/alice/work/specbench/.venv/bin/python"
        doc["model_path"] = "/srv/models/target.gguf"
        path.write_text(json.dumps(doc))
    pr = render_pr(build_report([clean_campaign]))
    assert "/home/alice" not in pr and "/srv/models" not in pr
    assert "`.venv/bin/python -m harness.engine" in pr and "<port>" in pr and "model: `target.gguf`" in pr
    assert re.search(r"(?<![\w.~/-])/[\w.+@-]+/", pr) is None, pr
    assert portable_paths("PYTHONPATH=/root/.cache/s/abc:/opt/x/src https://e.example/a/b 3/4 tokens/s") == (
        "PYTHONPATH=~/.cache/s/abc:src https://e.example/a/b 3/4 tokens/s"
    )
