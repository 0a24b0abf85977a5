"""The `topk_fused` builder: one read of the logits, one write of the output (harness/verify/topk_fused.py).

- Everywhere: the name works on a CPU (the topk_first path, bitwise); the argument the kernels rest on (a row's
  k largest logits lie in its k largest groups), checked in torch on rows full of ties.
- Marker `interpreter` (run by `make test` in .venv-sglang, which has Triton): the kernel itself under
  TRITON_INTERPRET=1 on CPU tensors, on a small vocabulary.
- Marker `gpu` (skipped without CUDA): the seed's sizes and the edge cases against full_vocab on CUDA.

What "equal" means here: the same kept tokens as full_vocab, except rows whose logits tie at the k-th
value (then the same probability values: the kernel keeps the lowest indices); probabilities within
TOLERANCE of full_vocab's (the softmax sums run in another order: not bitwise).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from harness import verify
from harness.micro import bank
from harness.micro.compare import tied_rows, unexplained_rows
from harness.micro.families import FAMILIES, make_family
from harness.verify import sparse, topk_fused

FIXTURE_BANK = Path(__file__).resolve().parents[1] / "fixtures" / "logit_bank"

TOLERANCE = 1e-6  # absolute, on probabilities (measured: at most 4.5e-8 on the seed's sizes)


def cases(n: int, vocab: int, device: str, dtype: torch.dtype = torch.float32) -> tuple:
    """A mixed batch: plain rows, greedy (temperature 0 and top_k 1), temperature 0.7, top_p off, top_k 64
    (the fast path's largest), 65 and 4096 (past it), the whole vocabulary, half the row masked, all-equal."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, vocab, generator=g).to(dtype)
    temperature = torch.ones(n)
    top_k = torch.full((n,), 20, dtype=torch.int64)
    top_p = torch.full((n,), 0.95)
    top_k[0] = 1
    temperature[1] = 0.0
    temperature[2] = 0.7
    top_p[3] = 1.0
    top_k[4], top_k[5], top_k[6], top_k[7] = 64, 65, min(4096, vocab - 1), -1
    logits[8, : vocab // 2] = float("-inf")
    logits[9] = 0.5  # all-equal: ties at every rank
    move = {"device": device}
    return logits.to(**move), temperature.to(**move), top_k.to(**move), top_p.to(**move)


TIED_ROWS = (9,)


def check_against_full_vocab(got: torch.Tensor, logits, temperature, top_k, top_p) -> None:
    """fp32 logits: the same kept tokens but in TIED_ROWS; bf16 logits (8 bits of mantissa: ties at the k-th
    value are common in a 248,320-token row): the same values in every row."""
    ref = verify.full_vocab_probs(logits, temperature, top_k, top_p)
    tied = range(logits.shape[0]) if logits.dtype == torch.bfloat16 else TIED_ROWS
    for row in range(logits.shape[0]):
        if row in tied:  # the same values; which tied tokens hold them may differ
            assert torch.equal((got[row] > 0).sum(), (ref[row] > 0).sum()), row
            assert torch.allclose(got[row].sort().values, ref[row].sort().values, atol=TOLERANCE), row
            continue
        assert torch.equal(got[row] > 0, ref[row] > 0), row
        assert float((got[row] - ref[row]).abs().max()) <= TOLERANCE, row
    assert torch.allclose(got.sum(dim=-1), torch.ones(got.shape[0], device=got.device), atol=1e-5)


def test_on_a_cpu_the_name_takes_the_topk_first_path():
    logits, temperature, top_k, top_p = cases(12, 2048, "cpu")
    got = verify.get_builder("topk_fused")(logits, temperature, top_k, top_p)
    assert torch.equal(got, verify.topk_first_probs(logits, temperature, top_k, top_p))


def lowest_index_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The ids of a row's k largest logits, equal values by lowest id (the kernels' rule): [rows, k]."""
    return torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]


@pytest.mark.parametrize("group", [1, 2, 3, 8])
def test_the_k_largest_groups_hold_the_k_largest_logits(group):
    """The kernels' argument: groups of `group` contiguous ids, ranked by (maximum, lowest group index); the
    row's k largest logits (equal values by lowest id) all lie in its k largest groups. Rows of few distinct
    values (ties within and across groups), sorted rows, all-equal rows, rows not a whole number of groups."""
    g = torch.Generator().manual_seed(group)
    for vocab in (7, 40, 97):
        rows = torch.cat(
            [
                torch.randint(0, 4, (64, vocab), generator=g).float(),
                torch.randn(16, vocab, generator=g).sort(dim=-1).values,
                torch.zeros(2, vocab),
            ]
        )
        groups = -(-vocab // group)
        padded = torch.nn.functional.pad(rows, (0, groups * group - vocab), value=float("-inf"))
        maxima = padded.view(-1, groups, group).amax(-1)
        for k in range(1, min(vocab, 12)):
            best_groups = lowest_index_top_k(maxima, k)
            assert bool(torch.isin(lowest_index_top_k(rows, k) // group, best_groups).all()), (vocab, k)


def test_row_slices_cover_the_rows_once():
    """The slices of rows the pass and the finish take in turn (CHUNKS, HALVING): consecutive, every row once, no
    slice empty; halving: a half, a quarter, ..., the last two equal."""
    assert topk_fused.row_slices(4096, 4, True) == [(0, 2048), (2048, 1024), (3072, 512), (3584, 512)]
    assert topk_fused.row_slices(4096, 4, False) == [(0, 1024), (1024, 1024), (2048, 1024), (3072, 1024)]
    assert topk_fused.row_slices(10, 1, True) == [(0, 10)]
    for n in (1, 2, 3, 7, 100, 4097):
        for chunks in (1, 2, 3, 4, 8):
            for halving in (False, True):
                slices = topk_fused.row_slices(n, chunks, halving)
                assert all(rows > 0 for _, rows in slices) and len(slices) <= chunks, (n, chunks, halving)
                assert [r0 for r0, _ in slices] == [sum(r for _, r in slices[:i]) for i in range(len(slices))]
                assert sum(r for _, r in slices) == n


def test_the_launch_configuration_by_vocabulary():
    """launch_config: the mode's base (below every range: vocabulary -1) with the overrides of the last range whose
    least vocabulary is at most the vocabulary, and only those; each range names only keys the base has, ranges
    ascending from 0."""
    for mode, ranges in ((False, topk_fused.DENSE_RANGES), (True, topk_fused.SPARSE_RANGES)):
        base = topk_fused.launch_config(-1, mode)
        assert ranges[0][0] == 0 and [least for least, _ in ranges] == sorted({least for least, _ in ranges})
        for i, (least, overrides) in enumerate(ranges):
            assert set(overrides) <= set(base), overrides
            upper = ranges[i + 1][0] if i + 1 < len(ranges) else 1 << 21
            for vocab in (least, upper - 1):
                cfg = topk_fused.launch_config(vocab, mode)
                assert cfg == {**topk_fused.launch_config(-1, mode), **overrides}, (mode, vocab)
        assert topk_fused.launch_config(248_320, mode) is not topk_fused.launch_config(248_320, mode)  # a copy


def interpreter_ready() -> bool:
    return importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.interpreter
def test_the_kernel_under_the_triton_interpreter():
    interpreter_or_skip()
    logits, temperature, top_k, top_p = cases(10, 8192, "cpu")
    out, left = topk_fused.run(logits, temperature, top_k, top_p)
    assert left is not None and left.tolist() == [5, 6, 7]  # top_k 65, 4096, the vocabulary: the caller's
    taken = [row for row in range(10) if row not in (5, 6, 7)]  # the kernels wrote every other row
    got = verify.fused_build(logits, temperature, top_k, top_p)
    assert torch.equal(got[taken], out[taken])
    check_against_full_vocab(got, logits, temperature, top_k, top_p)
    assert torch.equal(got, verify.fused_build(logits, temperature, top_k, top_p))  # the same every call


@pytest.mark.interpreter
def test_strided_row_parameters_reach_the_kernels_in_row_order():
    """Every other element of longer tensors: the kernels read a row's parameter at `pointer + row`, so the
    builder must hand them contiguous tensors (row_params passed a strided [rows] view through unchanged)."""
    interpreter_or_skip()
    logits, temperature, top_k, top_p = cases(10, 8192, "cpu")
    spread = [torch.stack([x, torch.zeros_like(x)], dim=1).reshape(-1)[::2] for x in (temperature, top_k, top_p)]
    assert not spread[0].is_contiguous() and torch.equal(spread[1], top_k)
    assert torch.equal(verify.fused_build(logits, *spread), verify.fused_build(logits, temperature, top_k, top_p))


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("vocab", [32_000, 248_320])
def test_against_full_vocab_on_cuda(vocab, dtype):
    logits, temperature, top_k, top_p = cases(64, vocab, "cuda", dtype)
    got = verify.topk_fused_probs(logits, temperature, top_k, top_p)
    check_against_full_vocab(got, logits, temperature, top_k, top_p)
    assert torch.equal(got, verify.topk_fused_probs(logits, temperature, top_k, top_p))


@pytest.mark.gpu
@needs_cuda
def test_strided_rows_and_many_rows_on_cuda():
    base = torch.randn(4096, 248_320 + 64, device="cuda")
    logits = base[:, :248_320]  # rows 248,384 apart
    n = logits.shape[0]
    temperature, top_k, top_p = (
        torch.ones(n, device="cuda"),
        torch.full((n,), 20, device="cuda"),
        torch.full((n,), 0.95, device="cuda"),
    )
    got = verify.topk_fused_probs(logits, temperature, top_k, top_p)
    ref = verify.full_vocab_probs(logits, temperature, top_k, top_p)
    assert torch.equal(got > 0, ref > 0) and float((got - ref).abs().max()) <= TOLERANCE


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_finishes_on_the_side_stream_on_cuda(sparse):
    """The finish kernels in slices of rows on the high-priority stream (CHUNKS), with either merge and either pick
    (SUPER): the same output as one pass and one finish; and work queued after the call on the current stream sees
    every slice."""
    logits = make_family("lm_like", 1000, 151_936, seed=3, device=torch.device("cuda"))
    temperature, top_k, top_p = (
        torch.ones(1000, device="cuda"),
        torch.full((1000,), 20, device="cuda"),
        torch.full((1000,), 0.95, device="cuda"),
    )
    run = topk_fused.run_sparse if sparse else topk_fused.run
    ref = run(logits, temperature, top_k, top_p, {"FUSE": 0})
    for config in (
        {"FUSE": 0, "CHUNKS": 4},
        {"FUSE": 0, "CHUNKS": 7, "REPLACE": 1},
        {"REPLACE": 1},
        {"SUPER": 8},
        {"FUSE": 0, "CHUNKS": 4, "REPLACE": 1, "SUPER": 8},
        {"FUSE": 0, "CHUNKS": 4, "HALVING": 1, "REPLACE": 1, "SUPER": 8},
    ):
        got = run(logits, temperature, top_k, top_p, config)
        assert got[-1] is None and all(torch.equal(a, b) for a, b in zip(ref[:-1], got[:-1], strict=True)), config
    if sparse:  # work queued on the current stream right after queue_sparse (no synchronisation) sees every slice
        for _ in range(3):
            values, _, left = topk_fused.queue_sparse(logits, temperature, top_k, top_p, {"FUSE": 0, "CHUNKS": 8})
            copy = values.clone()
            assert left() is None and torch.equal(copy, ref[0])


@pytest.mark.gpu
@needs_cuda
def test_half_the_rows_all_equal_on_cuda():
    logits = torch.randn(512, 248_320, device="cuda")
    logits[:256] = 0.0
    n = logits.shape[0]
    temperature, top_k, top_p = (
        torch.ones(n, device="cuda"),
        torch.full((n,), 20, device="cuda"),
        torch.full((n,), 0.95, device="cuda"),
    )
    got = verify.topk_fused_probs(logits, temperature, top_k, top_p)
    ref = verify.full_vocab_probs(logits, temperature, top_k, top_p)
    assert torch.equal(got[256:] > 0, ref[256:] > 0)
    assert torch.equal((got[:256] > 0).sum(-1), (ref[:256] > 0).sum(-1))
    assert torch.equal(torch.nonzero(got[:256])[:, 1].reshape(256, -1)[0], torch.arange(20, device="cuda"))


def interpreter_or_skip() -> None:
    if not interpreter_ready():
        message = "needs Triton and TRITON_INTERPRET=1 (make test runs this in .venv-sglang)"
        if os.environ.get("SPECBENCH_REQUIRE_SGLANG") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.interpreter
@pytest.mark.parametrize("vocab", [2048, 2500])
def test_rows_crowded_into_one_group_or_tied_across_groups_under_the_interpreter(vocab):
    """Exactly the lowest-id top k (top-p off): the 64 largest logits in one run of ids at the row's end, a sorted
    row, every group's maximum equal, four distinct values (ties everywhere), an all-equal row; k 1, 20, 64, also
    with 256-logit groups in one-group tiles and with the finish in a kernel of its own."""
    interpreter_or_skip()
    g = torch.Generator().manual_seed(vocab)
    rows = torch.randn(5, vocab, generator=g)
    rows[0, -64:] = 10 + torch.rand(64, generator=g)
    rows[1] = rows[1].sort().values
    rows[2, ::32] = 5.0
    rows[3] = torch.randint(0, 4, (vocab,), generator=g).float()
    rows[4] = -1.5
    n = rows.shape[0]
    ones = torch.ones(n)
    for k, config in ((1, {}), (20, {}), (64, {}), (20, {"GROUPS": 16, "TILE": 64}), (64, {"FUSE": 0, "TILE": 256})):
        top_k = torch.full((n,), k)
        out, left = topk_fused.run(rows, ones, top_k, ones, config)
        assert left is None
        kept = torch.zeros_like(out, dtype=torch.bool).scatter_(1, lowest_index_top_k(rows, k), True)
        assert torch.equal(out > 0, kept), (k, config)
        ref = verify.full_vocab_probs(rows, ones, top_k, ones)
        assert torch.allclose(out.sort(-1).values, ref.sort(-1).values, atol=TOLERANCE), (k, config)


def check_family(family: str, vocab: int, rows: int, logits: torch.Tensor) -> None:
    """The kernels take every row; the kept set is full_vocab's but where the rules leave it open (a tie at the
    k-th value, or two probabilities tied at the top-p cut: compare.tied_rows); values to float32 rounding."""
    n = logits.shape[0]
    temperature, top_k, top_p = torch.ones(n), torch.full((n,), 20), torch.full((n,), 0.95)
    out, left = topk_fused.run(logits, temperature, top_k, top_p)
    assert left is None, (family, vocab, left)
    ref = verify.full_vocab_probs(logits, temperature, top_k, top_p)
    tied = tied_rows(logits, temperature, top_k, top_p)
    differ, unexplained = unexplained_rows(out, ref, tied)
    assert unexplained == 0, (family, vocab, differ)
    for row in range(n):
        a, b = out[row][out[row] > 0].sort().values, ref[row][ref[row] > 0].sort().values
        assert a.shape == b.shape and float((a - b).abs().max()) <= TOLERANCE, (family, row)


@pytest.mark.interpreter
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_logit_family_under_the_interpreter(family):
    """Every family of the microbenchmark (the real ones from the committed logit bank), 8 rows of 16,384 ids,
    top-20, top-p 0.95 (check_family)."""
    interpreter_or_skip()
    model = FAMILIES[family].bank
    rows = bank.load_rows(FIXTURE_BANK, model)[0] if model else None
    check_family(family, 16_384, 8, make_family(family, 8, 16_384, seed=0, device=torch.device("cpu"), bank_rows=rows))


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("family", "vocab", "config"),
    [
        ("iid", 9_000, {"SUPER": 4}),
        ("bf16", 9_000, {"SUPER": 4, "FUSE": 0}),
        ("clustered", 9_000, {"SUPER": 4}),
        ("sorted", 20_000, {"SUPER": 8}),
        ("lm_like", 20_000, {"SUPER": 8, "REPLACE": 1, "FUSE": 0}),
    ],
)
def test_the_two_level_pick_is_the_pick(family, vocab, config):
    """SUPER (the k largest super-groups of SUPER groups, then the k largest groups among theirs, for top_k up to
    32; its scratch in the row's maxima: 512 of them for SUPER 4, 1,024 for 8): bitwise the output of the one
    repeated maximum over every group, sparse and dense, top_k 1 to 64 (33 and 64 take the one-level pick)."""
    interpreter_or_skip()
    n = 8
    logits = make_family(family, n, vocab, seed=4, device=torch.device("cpu"))
    temperature, top_p = torch.ones(n), torch.full((n,), 0.9)
    top_k = torch.tensor([20, 1, 32, 5, 33, 64, 2, 20])
    for run in (topk_fused.run, topk_fused.run_sparse):
        ref, got = run(logits, temperature, top_k, top_p), run(logits, temperature, top_k, top_p, config)
        assert ref[-1] is None and got[-1] is None
        assert all(torch.equal(a, b) for a, b in zip(ref[:-1], got[:-1], strict=True)), (run.__name__, config)


@pytest.mark.interpreter
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_rows_at_their_own_vocabulary_under_the_interpreter(model):
    interpreter_or_skip()
    rows, manifest = bank.load_rows(FIXTURE_BANK, model)
    check_family(model, manifest["vocab"], rows.shape[0], rows.float())


@pytest.mark.interpreter
@pytest.mark.parametrize("vocab", [2, 5, 37, 300, 1000])
def test_small_vocabularies_under_the_interpreter(vocab):
    """A row shorter than a group (one group, partly outside the row) or than k: every row with 1 <= k < vocab
    is the kernels' and matches full_vocab; an empty batch is empty."""
    interpreter_or_skip()
    n = 6
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(vocab))
    temperature, top_p = torch.ones(n), torch.full((n,), 0.9)
    top_k = torch.tensor([1, 2, 3, 20, 64, -1]).clamp(max=vocab)
    out, left = topk_fused.run(logits, temperature, top_k, top_p)
    taken = [row for row in range(n) if 1 <= int(top_k[row]) < vocab]
    assert (left.tolist() if left is not None else []) == [row for row in range(n) if row not in taken]
    ref = verify.full_vocab_probs(logits, temperature, top_k, top_p)
    assert torch.equal(out[taken] > 0, ref[taken] > 0)
    assert float((out[taken] - ref[taken]).abs().max()) <= TOLERANCE
    empty, none = topk_fused.run(logits[:0], temperature[:0], top_k[:0], top_p[:0])
    assert empty.shape == (0, vocab) and none is None


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_logits_on_another_gpu_than_the_current_one():
    """Triton launches on the current device: the kernels run where the logits are."""
    assert torch.cuda.current_device() == 0
    logits, temperature, top_k, top_p = cases(16, 32_000, "cuda:1")
    got = verify.topk_fused_probs(logits, temperature, top_k, top_p)
    assert got.device == logits.device
    check_against_full_vocab(got, logits, temperature, top_k, top_p)


@pytest.mark.interpreter
@pytest.mark.parametrize("family", ["iid", "sorted", "bf16", "padding"])
def test_the_sparse_output_is_the_dense_output_without_its_zeros(family):
    """run_sparse (through sparse.fused_sparse_probs): greedy rows, top_k 5 / 20 / 64 and rows the kernels leave
    to the caller (top_k 65, the whole vocabulary) densify to fused_build's output, bitwise."""
    interpreter_or_skip()
    n = 8
    logits = make_family(family, n, 4096, seed=2, device=torch.device("cpu"))
    temperature = torch.tensor([1.0, 0.0, 1.0, 0.7, 1.0, 1.0, 1.3, 1.0])
    top_k = torch.tensor([20, 20, 1, 5, 64, 65, 20, -1])
    top_p = torch.tensor([0.95, 1.0, 1.0, 0.5, 1.0, 0.9, 0.95, 0.9])
    got = sparse._fused(logits, temperature, top_k, top_p)  # the CUDA path, run by the interpreter
    assert torch.equal(got.densify(), verify.fused_build(logits, temperature, top_k, top_p))
    assert bool((got.ids[:, 1:] >= got.ids[:, :-1]).all())
    values, ids, left = topk_fused.run_sparse(logits, temperature, top_k, top_p)
    assert left is not None and left.tolist() == [5, 7]
    assert values.shape == ids.shape == (n, topk_fused.FAST_K) and int(ids[0, 20]) == 4096  # ranks >= k: id V
    taken = torch.ones(n, dtype=torch.bool).index_fill_(0, left, False)
    # other block, group and tile sizes (several tiles of groups for a top-20; blocks of one group), the finish
    # inside the pass (the dense mode's way) or apart, in slices of rows (row0), the other merge (REPLACE: each
    # entering key in place of the least): bitwise the same, sparse and dense (a tile's merge is exact: it skips
    # only the running top's ranks that beat every key of the tile)
    dense = topk_fused.run(logits, temperature, top_k, top_p)[0]
    others = (
        {"PASS_BLOCK": 64, "GROUPS": 16},
        {"TILE": 256, "FUSE": 1},
        {"GROUPS": 128, "TILE": 1},
        {"TILE": 64, "FUSE": 0, "CHUNKS": 3},
        {"REPLACE": 1, "TILE": 256},
        {"REPLACE": 1, "FUSE": 1, "TILE": 64},
        {"FUSE": 0, "CHUNKS": 4, "HALVING": 1, "REPLACE": 1},
    )
    for config in others if family in ("iid", "sorted", "bf16") else ():
        v2, i2, left2 = topk_fused.run_sparse(logits, temperature, top_k, top_p, config)
        assert torch.equal(left2, left) and torch.equal(v2[taken], values[taken]) and torch.equal(i2[taken], ids[taken])
        assert torch.equal(topk_fused.run(logits, temperature, top_k, top_p, config)[0][taken], dense[taken]), config
