"""Verify-probability builders: bitwise equality of "before" and "after", semantics against a naive
float64 reference, masked rows, ties, and radix top-k (GPU cases run only where CUDA is present)."""

from __future__ import annotations

import pytest
import torch

from harness import verify
from harness.verify import BUILDERS, full_vocab_probs, get_builder, radix_topk, topk, topk_first_probs

VOCAB = 8192
CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def params(rows: int, top_k, top_p, temperature=1.0, device="cpu"):
    def col(v, dtype):
        return (
            torch.as_tensor(v, dtype=dtype).expand(rows).clone().to(device)
            if not isinstance(v, list)
            else torch.tensor(v, dtype=dtype, device=device)
        )

    return col(temperature, torch.float32), col(top_k, torch.int64), col(top_p, torch.float32)


def naive_probs(logits: torch.Tensor, temperature, top_k, top_p) -> torch.Tensor:
    """Row-by-row float64 reference of the specification (independent of the module's code)."""
    out = torch.zeros(logits.shape, dtype=torch.float64)
    for r, row in enumerate(logits.double().cpu()):
        t, k, p = float(temperature[r]), int(top_k[r]), float(top_p[r])
        if t < 1e-6 or k == 1:
            out[r, int(row.argmax())] = 1.0
            continue
        k = row.numel() if k <= 0 or k >= row.numel() else k
        vals, idx = torch.sort(row / t, descending=True, stable=True)
        probs = torch.softmax(vals[:k], dim=0)
        if p < 1.0:
            before = torch.cumsum(probs, 0) - probs
            probs = torch.where(before >= p, torch.zeros_like(probs), probs)
        out[r, idx[:k]] = probs / probs.sum()
    return out


def random_logits(rows: int, vocab: int = VOCAB, seed: int = 0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    # a peaked head and a long tail, all values distinct with probability one
    x = torch.randn(rows, vocab, generator=g) * 2.0 + torch.linspace(4, 0, vocab)[torch.randperm(vocab, generator=g)]
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("top_k", [20, 2048, 2049, 4096])
@pytest.mark.parametrize("top_p", [1.0, 0.95])
def test_uniform_batch_bitwise_equal(device, top_k, top_p):
    logits = random_logits(12, device=device)
    args = params(12, top_k, top_p, temperature=0.8, device=device)
    before = full_vocab_probs(logits, *args)
    for name in ("topk_first", "topk_first_torch"):
        assert torch.equal(BUILDERS[name](logits, *args), before), name
    kept = (before > 0).sum(dim=1)
    assert int(kept.max()) <= top_k
    if top_p == 1.0:
        assert torch.all(kept == top_k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("top_p", [[1.0] * 8, [0.95, 1.0, 0.5, 0.99, 1.0, 0.9, 0.7, 1.0]])
def test_mixed_batch_with_greedy_rows_bitwise_equal(device, top_p):
    logits = random_logits(8, seed=1, device=device)
    temperature = [1.0, 0.0, 0.7, 1.3, 1.0, 1e-7, 1.0, 2.0]  # rows 1 and 5 are greedy by temperature
    top_k = [20, 20, 2048, 1, 2049, 4096, -1, VOCAB]  # row 3 greedy by top_k; rows 6, 7 dense
    args = params(8, top_k, top_p, temperature, device)
    before = full_vocab_probs(logits, *args)
    after = topk_first_probs(logits, *args)
    assert torch.equal(after, before)
    argmax = logits.argmax(dim=1)
    for r in (1, 3, 5):
        assert before[r, argmax[r]] == 1.0 and before[r].sum() == 1.0


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_matches_naive_reference(top_p):
    logits = random_logits(6, vocab=3000, seed=2)
    args = params(6, [5, 20, 2049, -1, 1, 300], top_p, [1.0, 0.5, 1.7, 0.9, 1.0, 0.0])
    ref = naive_probs(logits, *args)
    for name, fn in BUILDERS.items():
        got = fn(logits, *args).double()
        assert torch.allclose(got, ref, atol=1e-6, rtol=1e-5), name
        assert torch.equal(got > 0, ref > 0), name  # the same kept sets


def test_rows_with_fewer_finite_logits_than_k():
    logits = random_logits(4, seed=3)
    logits[0, 10:] = float("-inf")  # 10 finite, top_k 20
    logits[1, :-3] = float("-inf")  # 3 finite, top_k 2049
    args = params(4, [20, 2049, 20, 4096], [1.0, 1.0, 0.9, 1.0])
    before = full_vocab_probs(logits, *args)
    assert torch.equal(topk_first_probs(logits, *args), before)
    kept = (before > 0).sum(dim=1)
    assert kept[0] == 10 and kept[1] == 3 and kept[3] == 4096
    assert torch.allclose(before.sum(dim=1), torch.ones(4))
    assert torch.isfinite(before).all()


def tied_rows(top_ks: list[int], vocab: int = VOCAB, seed: int = 4) -> torch.Tensor:
    """Each row r has a block of equal logits straddling rank top_ks[r] (its own top-k boundary)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for k in top_ks:
        row = torch.randn(vocab, generator=g) - 10.0  # the tail
        head = torch.sort(torch.rand(k - 3, generator=g) + 5.0, descending=True).values  # distinct, above
        tie = torch.full((7,), 2.0)  # ranks k-3 .. k+3 tie at the boundary
        perm = torch.randperm(vocab, generator=g)
        row[perm[: k - 3]] = head
        row[perm[k - 3 : k + 4]] = tie
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_at_each_rows_boundary(device):
    top_ks = [20, 2048, 2049, 4096, 20]
    logits = tied_rows(top_ks).to(device)
    args = params(len(top_ks), top_ks, 1.0, 1.0, device)
    results = {name: fn(logits, *args) for name, fn in BUILDERS.items()}
    before = results["full_vocab"]
    for name, probs in results.items():
        kept = probs > 0
        assert torch.equal(kept.sum(dim=1).cpu(), torch.tensor(top_ks)), name  # exact kept count
        for r, k in enumerate(top_ks):
            row = logits[r]
            boundary = torch.sort(row, descending=True).values[k - 1]
            assert bool((row[kept[r]] >= boundary).all()), name  # a valid top-k set
            assert bool(kept[r][row > boundary].all()), name  # everything above the boundary kept
            assert torch.equal(torch.sort(probs[r]).values, torch.sort(before[r]).values), name  # same values
        assert torch.equal(BUILDERS[name](logits, *args), probs), f"{name} differs between calls"


@pytest.mark.parametrize("device", DEVICES)
def test_top_p_keeps_or_drops_equal_probabilities_together(device):
    """A token is dropped when the mass of the strictly LARGER probabilities reaches top_p (FlashInfer's
    threshold rule, SGLang's CUDA path): equal probabilities straddling the cut all stay."""
    logits = torch.full((3, 64), -30.0)
    logits[0, [5, 17, 40, 41]] = 3.0  # four times 0.25: top_p 0.5 keeps all four (none is larger)
    logits[1, :20] = 0.0  # twenty times 0.05 (a padded slot): top_p 0.95 keeps all twenty
    logits[2, [1, 2]], logits[2, [3, 4, 5]] = 2.0, 1.0  # two large, then three equal smaller ones
    probs = torch.softmax(logits[2], dim=0)
    top_p = float(probs[1] + probs[2]) + 1e-4  # reached inside the run of three: all three stay
    args = params(3, 20, [0.5, 0.95, top_p], 1.0, device)
    for name, fn in BUILDERS.items():
        kept = (fn(logits.to(device), *args) > 0).cpu()
        assert kept.sum(dim=1).tolist() == [4, 20, 5], name
    exact = params(1, 20, float(probs[1] + probs[2]), 1.0, device)  # reached exactly before the run: dropped
    assert (full_vocab_probs(logits[2:].to(device), *exact) > 0).sum().item() == 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("top_k", [20, -1])
def test_top_p_one_rows_do_not_depend_on_the_batch(device, top_k):
    """A top_p = 1 row is the same bitwise alone and next to rows that use top-p (no renormalisation by
    its own sum), on the sparse and the dense path."""
    logits = random_logits(3, seed=8, device=device)
    mixed = params(3, top_k, [1.0, 0.9, 0.5], 0.8, device)
    for name, fn in BUILDERS.items():
        alone = fn(logits[:1], *params(1, top_k, 1.0, 0.8, device))
        assert torch.equal(fn(logits, *mixed)[:1], alone), name


def temperature_tie_pair(start: float, temperature: float) -> tuple[float, float]:
    """Two adjacent fp32 values lo < hi whose quotients by the temperature are equal."""
    x = torch.tensor(start)
    while True:
        nxt = torch.nextafter(x, torch.tensor(float("inf")))
        if x / temperature == nxt / temperature:
            return float(x), float(nxt)
        x = nxt


def test_ties_created_by_the_temperature():
    k, temperature = 20, 3.0
    g = torch.Generator().manual_seed(5)
    rows = []
    for r in range(4):
        lo, hi = temperature_tie_pair(3.0e4 + 100 * r, temperature)
        row = torch.randn(VOCAB, generator=g)  # far below
        perm = torch.randperm(VOCAB, generator=g)
        row = row + hi - 10.0  # the tail, well below but with mass
        row[perm[: k - 1]] = hi + 1.0 + 0.01 * torch.arange(k - 1, dtype=torch.float32)  # distinct, above
        row[perm[k - 1]], row[perm[k]] = hi, lo  # distinct raw values at ranks k-1, k; tied once scaled
        rows.append(row)
    logits = torch.stack(rows)
    scaled = logits / temperature
    top_raw = torch.topk(logits, k + 1).values
    assert torch.all(top_raw[:, :-1] > top_raw[:, 1:])  # no ties among the raw top k+1
    top_scaled = torch.topk(scaled, k + 1).values
    assert torch.all(top_scaled[:, k - 1] == top_scaled[:, k])  # a tie at the boundary once scaled
    args = params(4, k, 1.0, temperature)
    before, after = full_vocab_probs(logits, *args), topk_first_probs(logits, *args)
    for probs in (before, after):
        kept = probs > 0
        assert torch.equal(kept.sum(dim=1), torch.full((4,), k))
        for r in range(4):
            boundary = torch.sort(scaled[r], descending=True).values[k - 1]
            assert bool((scaled[r][kept[r]] >= boundary).all())
    # the same probability values, whichever tied token holds the last one
    assert torch.equal(torch.sort(before, dim=1).values, torch.sort(after, dim=1).values)


def test_torch_fallback_on_cpu_even_when_flashinfer_would_import(monkeypatch):
    calls = []

    def fake_top_k(x, k, sorted=True, deterministic=True):  # noqa: A002
        calls.append(k)
        raise AssertionError("flashinfer must not be called for CPU tensors")

    monkeypatch.setattr(topk, "_flashinfer_top_k", lambda: fake_top_k)
    assert verify.radix_topk_backend("cpu") == "torch"
    assert verify.radix_topk_backend("cuda") == "flashinfer"
    x = random_logits(3, vocab=500)
    vals, idx = radix_topk(x, 50)
    ref_vals, ref_idx = torch.topk(x, 50)
    assert torch.equal(vals, ref_vals) and torch.equal(idx, ref_idx) and not calls
    monkeypatch.setattr(topk, "_flashinfer_top_k", lambda: None)
    assert verify.radix_topk_backend("cuda") == "torch"


def test_radix_topk_rejects_bad_k():
    x = random_logits(2, vocab=100)
    with pytest.raises(ValueError, match="k=101"):
        radix_topk(x, 101)
    vals, _ = radix_topk(x, 100)  # k up to the vocabulary
    assert vals.shape == (2, 100)


def test_unknown_builder_lists_valid_names():
    with pytest.raises(ValueError, match="full_vocab, topk_first, topk_first_torch"):
        get_builder("fast")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("k", [1, 20, 2048, 2049, 4096])
def test_radix_topk_matches_torch_topk(device, dtype, strided, k):
    x = random_logits(16, seed=6, device=device, dtype=dtype)
    if strided:
        x = random_logits(16, vocab=2 * VOCAB, seed=6, device=device, dtype=dtype)[:, ::2]
        assert not x.is_contiguous()
    vals, idx = radix_topk(x, k)
    ref_vals, _ = torch.topk(x, k)
    assert vals.dtype == x.dtype and idx.dtype == torch.int64
    assert torch.equal(vals, ref_vals)  # sorted values are unique even where indices tie
    assert torch.equal(x.gather(1, idx), vals)  # the indices point at those values
    assert all(len(set(r.tolist())) == k for r in idx.cpu())  # distinct indices per row


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_uses_flashinfer_when_installed():
    pytest.importorskip("flashinfer")
    assert verify.radix_topk_backend("cuda") == "flashinfer"
    logits = random_logits(64, vocab=248320, device="cuda")
    args = params(64, 20, 0.95, 1.0, "cuda")
    assert torch.equal(topk_first_probs(logits, *args), full_vocab_probs(logits, *args))


def test_sampling_parameters_may_be_numbers_and_a_wrong_count_is_named():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    rows = full_vocab_probs(logits, torch.full((3,), 0.7), torch.full((3,), 5), torch.full((3,), 0.9))
    assert torch.equal(full_vocab_probs(logits, 0.7, 5, 0.9), rows)  # a number is every row's
    with pytest.raises(ValueError, match="top_k has 2 value"):
        full_vocab_probs(logits, 0.7, torch.tensor([5, 5]), 0.9)
