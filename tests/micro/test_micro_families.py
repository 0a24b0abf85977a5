"""The microbenchmark's logit families (harness.micro.families): shape, dtype, seeding, and the property
each one claims in its one-line description; the real families' rows from the logit bank, fitted to other
vocabularies and tiled to the row count."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.micro import bank
from harness.micro.families import (
    FAMILIES,
    PLAUSIBLE,
    REGION,
    FamilyError,
    check_families,
    fit_vocab,
    make_family,
    tile,
)

CPU = torch.device("cpu")
SYNTHETIC = [n for n, f in FAMILIES.items() if f.make is not None]
REAL = [n for n, f in FAMILIES.items() if f.make is None]
FIXTURE_BANK = Path(__file__).resolve().parents[1] / "fixtures" / "logit_bank"


def make(name: str, rows: int = 8, vocab: int = 40_000, seed: int = 0):
    return make_family(name, rows, vocab, seed=seed, device=CPU)


def test_every_family_is_documented_and_the_real_ones_name_their_bank():
    assert len(FAMILIES) >= 10 and all(f.doc and f.name == n for n, f in FAMILIES.items())
    assert {f.bank for f in FAMILIES.values() if f.make is None} == {"smollm2", "gemma3"}
    with pytest.raises(FamilyError, match="valid: iid"):
        check_families(["iid", "gaussian"])


@pytest.mark.parametrize("name", SYNTHETIC)
def test_a_family_is_seeded_fp32_and_of_the_asked_shape(name):
    x = make(name)
    assert x.shape == (8, 40_000) and x.dtype == torch.float32 and torch.isfinite(x).all()
    assert torch.equal(x, make(name))
    if name != "padding":
        assert not torch.equal(x, make(name, seed=1))
        assert not torch.equal(make(name, rows=8), make(name, rows=9)[:8])  # the row count is in the seed


def test_iid_is_standard_normal():
    x = make("iid", rows=4)
    assert abs(float(x.mean())) < 0.02 and abs(float(x.std()) - 1) < 0.02


def covered(ids: torch.Tensor, width: int, windows: int) -> int:
    """How many of the sorted `ids` the best `windows` disjoint windows of `width` ids hold (chosen greedily)."""
    left, total = ids.clone(), 0
    for _ in range(windows):
        if left.numel() == 0:
            break
        ends = torch.searchsorted(left, left + width)
        best = int(torch.argmax(ends - torch.arange(left.numel())))
        total += int(ends[best]) - best
        left = torch.cat([left[:best], left[int(ends[best]) :]])
    return total


def test_clustered_rows_hold_their_large_logits_in_contiguous_regions():
    """Row r by r % 4: one region of REGION ids (anywhere, at the start, at the end) or four of REGION // 4
    hold all but a few strays of the logits above 3.5 (the regions are N(4, 1): 69% of them; the bulk
    N(0, 1): 0.02%)."""
    x = make("clustered")
    for r in range(8):
        ids = (x[r] > 3.5).nonzero().squeeze(-1)
        four = r % 4 == 1
        assert covered(ids, REGION // 4 if four else REGION, 4 if four else 1) > 0.99 * ids.numel()
        assert ids.numel() > 0.6 * REGION
        if r % 4 in (2, 3):
            first = 0 if r % 4 == 2 else 40_000 - REGION
            assert int(((ids >= first) & (ids < first + REGION)).sum()) > 0.99 * ids.numel()


def test_sorted_rows_are_monotone_both_ways():
    x = make("sorted")
    assert bool((torch.diff(x[0::2], dim=1) >= 0).all()) and bool((torch.diff(x[1::2], dim=1) <= 0).all())
    assert int(x[0].argmax()) == 40_000 - 1 and int(x[1].argmax()) == 0


def test_heavy_tail_reaches_far_beyond_a_gaussian():
    x, g = make("heavy_tail", rows=4), make("iid", rows=4)
    assert float(x.abs().max()) > 10 * float(g.abs().max())


def test_peaked_rows_have_one_logit_far_above_the_rest():
    top2 = torch.topk(make("peaked"), 2, dim=1).values
    assert bool((top2[:, 0] - top2[:, 1] > 20).all())


def test_bf16_logits_are_bfloat16_values_with_ties_at_the_top():
    x = make("bf16")
    assert torch.equal(x, x.to(torch.bfloat16).float())
    top = torch.topk(x, 40, dim=1).values
    assert bool((torch.diff(top, dim=1) == 0).any(dim=1).all())  # every row ties among its 40 largest


def test_padding_rows_are_all_equal():
    x = make("padding")
    assert bool((x == x[:, :1]).all())


def test_lm_like_rows_have_a_few_hundred_plausible_ids_in_three_ranges():
    x = make("lm_like")
    for r in range(8):
        ids = (x[r] >= 6).nonzero().squeeze(-1)
        assert PLAUSIBLE * 0.9 <= ids.numel() <= PLAUSIBLE + 10
        assert int((torch.diff(ids) > 2 * (PLAUSIBLE // 3)).sum()) <= 2 + 3  # three ranges (bulk strays aside)


def test_fit_vocab_truncates_or_pads_with_the_row_minimum():
    rows = torch.tensor([[3.0, 1.0, 2.0], [0.0, -1.0, 5.0]])
    assert torch.equal(fit_vocab(rows, 2), rows[:, :2])
    assert torch.equal(fit_vocab(rows, 5), torch.tensor([[3.0, 1, 2, 1, 1], [0.0, -1, 5, -1, -1]]))
    assert torch.equal(tile(rows, 5)[:, 0], torch.tensor([3.0, 0, 3, 0, 3]))


@pytest.mark.parametrize("name", REAL)
def test_real_families_tile_the_banks_rows(name):
    model = FAMILIES[name].bank
    rows, manifest = bank.load_rows(FIXTURE_BANK, model)
    assert rows.dtype == torch.bfloat16 and rows.shape == (manifest["rows"], manifest["vocab"])
    assert manifest["model"] == model and len(manifest["file_sha256"]) == 64 and manifest["prompts_sha256"]
    assert len({tuple(r.tolist()[:64]) for r in rows.float()}) == rows.shape[0]  # distinct rows
    x = make_family(name, 2 * rows.shape[0] + 1, 32_000, seed=0, device=CPU, bank_rows=rows)
    assert x.shape == (2 * rows.shape[0] + 1, 32_000) and x.dtype == torch.float32
    assert torch.equal(x[0], rows[0, :32_000].float()) and torch.equal(x[rows.shape[0]], x[0])
    wide = make_family(name, 1, manifest["vocab"] + 7, seed=0, device=CPU, bank_rows=rows)
    assert bool((wide[0, manifest["vocab"] :] == rows[0].float().min()).all())
    with pytest.raises(FamilyError, match="logit bank"):
        make_family(name, 1, 100, seed=0, device=CPU)


def test_a_missing_bank_is_a_message_naming_how_to_make_one(tmp_path):
    with pytest.raises(bank.BankError, match="make logit-bank"):
        bank.load_rows(tmp_path, "smollm2")


def test_a_bank_of_another_model_or_with_damaged_rows_is_refused(tmp_path):
    shutil.copytree(FIXTURE_BANK / "smollm2", tmp_path / "gemma3")  # SmolLM2's rows filed as Gemma's
    with pytest.raises(bank.BankError, match="holds rows of the model 'smollm2', not 'gemma3'"):
        bank.load_rows(tmp_path, "gemma3")
    shutil.copytree(FIXTURE_BANK / "smollm2", tmp_path / "smollm2")
    bits = np.load(tmp_path / "smollm2" / "logits.npy")
    bits[1, 7] = 0x7FC0  # a bfloat16 NaN
    np.save(tmp_path / "smollm2" / "logits.npy", bits)
    with pytest.raises(bank.BankError, match="not finite"):
        bank.load_rows(tmp_path, "smollm2")
    (tmp_path / "smollm2" / "manifest.json").write_text(json.dumps([1, 2]))
    with pytest.raises(bank.BankError, match="is not a bank manifest"):
        bank.load_rows(tmp_path, "smollm2")


def test_a_bank_whose_manifest_names_another_model_is_refused(tmp_path):
    """Gemma 3's rows and manifest filed as SmolLM2's, the manifest's model edited: its vocabulary (262,144, not
    49,152) and its file's SHA-256 are not SmolLM2's."""
    shutil.copytree(FIXTURE_BANK / "gemma3", tmp_path / "smollm2")
    manifest = tmp_path / "smollm2" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "model": "smollm2"}))
    with pytest.raises(bank.BankError, match="names the model 'smollm2', but its rows are not that model's") as err:
        bank.load_rows(tmp_path, "smollm2")
    assert "vocab 262144 (the model's: 49152)" in str(err.value)
    assert "file_sha256 'a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818'" in str(err.value)
    doc = json.loads((FIXTURE_BANK / "smollm2" / "manifest.json").read_text())
    shutil.copytree(FIXTURE_BANK / "smollm2", tmp_path / "b" / "smollm2")
    (tmp_path / "b" / "smollm2" / "manifest.json").write_text(json.dumps({**doc, "file_sha256": "0" * 64}))
    with pytest.raises(bank.BankError, match="file_sha256 '0000"):
        bank.load_rows(tmp_path / "b", "smollm2")


@pytest.mark.parametrize(
    ("array", "said"),
    [
        (lambda a: a.astype(np.float32), "holds a float32 array of shape (8, 49152)"),
        (lambda a: a[:, :-1].astype(np.uint8), "holds a uint8 array of shape (8, 49151)"),
        (lambda a: a[:, :-1] > 5, "holds a bool array of shape (8, 49151)"),
        (lambda a: np.array(3, dtype=np.uint8), "holds a uint8 array of shape ()"),
        (lambda a: a.ravel(), "holds a uint16 array of shape (393216,)"),
        (lambda a: a[:3], "logits.npy is (3, 49152), the manifest says (8, 49152)"),
    ],
)
def test_a_bank_whose_rows_have_another_dtype_or_size_is_a_message(tmp_path, array, said):
    shutil.copytree(FIXTURE_BANK / "smollm2", tmp_path / "smollm2")
    path = tmp_path / "smollm2" / "logits.npy"
    np.save(path, array(np.load(path)))
    with pytest.raises(bank.BankError, match="make logit-bank") as err:
        bank.load_rows(tmp_path, "smollm2")
    assert said in str(err.value)
