"""One schema for the writer and the reader: harness/contract.py declares the files; the runner builds those
objects, the analysis derives its parsing from them, and docs/records.md names every field."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pyarrow as pa
from campaigns import MANIFEST_KEYS, RECORD_KEYS, SCORE_KEYS

from analysis import load, read_records
from harness.contract import CampaignDoc, Manifest, PlannedRun, Record, ScoreLine, json_types, nested

DOCS = (Path(__file__).resolve().parents[1] / "docs" / "records.md").read_text()


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def section(title: str) -> str:
    return DOCS.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_docs_name_every_declared_field():
    for cls, title in (
        (Record, "runs/<run_id>/records.jsonl"),
        (ScoreLine, "runs/<run_id>/scores.jsonl"),
        (Manifest, "runs/<run_id>/manifest.json"),
        (CampaignDoc, "campaign.json"),
    ):
        text = section(title)
        missing = sorted(n for n in names(cls) if f"`{n}`" not in text)
        assert not missing, f"docs/records.md, {title}: {missing}"
    plan_row = next(line for line in section("campaign.json").splitlines() if line.startswith("| `plan`"))
    assert not sorted(n for n in names(PlannedRun) if f'"{n}"' not in plan_row)


def deep_names(cls: type) -> set[str]:
    """The fields of a schema class and of every schema class nested in it."""
    out = names(cls)
    for sub, _ in nested(cls).values():
        out |= deep_names(sub)
    return out


def test_docs_name_every_nested_key():
    """Each nested object's row in docs/records.md names every key of it (at any depth)."""
    for cls, title in ((Manifest, "runs/<run_id>/manifest.json"), (CampaignDoc, "campaign.json")):
        rows = [line for line in section(title).splitlines() if line.startswith("| `")]
        for name, (sub, _) in nested(cls).items():
            row = next(r for r in rows if f"`{name}`" in r.split("|")[1])
            missing = sorted(n for n in deep_names(sub) if f'"{n}"' not in row)
            assert not missing, f"docs/records.md, {title}, {name}: {missing}"


def test_the_end_to_end_contract_is_the_declared_schema():
    assert names(Record) == RECORD_KEYS
    assert names(ScoreLine) == SCORE_KEYS
    assert MANIFEST_KEYS <= names(Manifest)


def test_the_reader_parses_declared_fields_with_their_declared_types():
    assert set(read_records.PARSED) <= names(Record)
    kinds = {pa.string(): str, pa.int64(): int, pa.bool_(): bool}
    for name in read_records.PARSED:
        arrow = read_records.RECORD_SCHEMA.field(name).type
        declared = json_types(Record)[name]
        if name in read_records.AS_FLOAT:  # counts read as float64 (missing = NaN)
            assert arrow == pa.float64() and declared == (int,)
        elif arrow == pa.float64():
            assert declared == (int, float)
        elif pa.types.is_list(arrow):
            assert declared == (list,)
        else:
            assert declared == (kinds[arrow],), name
    assert load.MANIFEST_TYPES == json_types(Manifest) and load.PLAN_TYPES == json_types(PlannedRun)


def test_schema_version_is_declared_once():
    root = Path(__file__).resolve().parents[1]
    sources = [p for package in ("harness", "analysis", "workloads") for p in (root / package).rglob("*.py")]
    defining = [str(p) for p in sources if re.search(r"^SCHEMA_VERSION\s*=", p.read_text(), re.M)]
    assert [Path(p).name for p in defining] == ["contract.py"], defining
