"""The `topk_fused` builder: one read of the logits, one write of the output (harness/verify/topk_fused.py).

- Everywhere: the name works on a CPU (the topk_first path, bitwise); the threshold ranks keep both ways
  of missing rare.
- Marker `interpreter` (run by `make test` in .venv-sglang, which has Triton): the kernel itself under
  TRITON_INTERPRET=1 on CPU tensors, on a small vocabulary.
- Marker `gpu` (skipped without CUDA): the seed's sizes and the edge cases against full_vocab on CUDA.

What "equal" means here: the same kept tokens as full_vocab, except rows whose logits tie at the k-th
value (then the same probability values: the kernel keeps the lowest indices); probabilities within
TOLERANCE of full_vocab's (the softmax sums run in another order: not bitwise).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from pathlib import Path

import pytest
import torch

from harness import verify
from harness.micro import bank
from harness.micro.compare import tied_rows, unexplained_rows
from harness.micro.families import FAMILIES, make_family
from harness.verify import sparse, topk_fused

FIXTURE_BANK = Path(__file__).parent / "fixtures" / "logit_bank"

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


def sample_positions(vocab: int, chunk: int = topk_fused.CHUNK) -> torch.Tensor:
    """The logits the threshold reads (as harness.verify.topk_fused._threshold): runs of run_length
    contiguous logits at samples // run evenly spaced places (runs of at most `chunk`: CHUNK, launch_config's)."""
    samples = topk_fused.samples_for(vocab)
    run = topk_fused.run_length(samples, chunk)
    j = torch.arange(samples)
    stride = vocab // (samples // run)
    return (j // run) * stride + (stride - run) // 2 + j % run


def threshold_reference(row: torch.Tensor, rank: int, chunk: int = topk_fused.CHUNK) -> float:
    """The rank-th largest distinct sample value of the row, else its smallest sample value."""
    values = torch.unique(row[sample_positions(row.numel(), chunk)]).flip(0)
    return float(values[min(rank, values.numel()) - 1])


def test_threshold_ranks_keep_failures_and_overflows_rare_on_iid_rows():
    """The first rank of each top_k, by either rule: both ways of missing (fewer than k logits >= t; more
    candidates than the list holds) are rare when the row's large logits are spread evenly (Poisson
    estimates); rule 1 takes the smallest rank that keeps the first at most FAIL_BOUND (at top_k 20: 5, 6 and 6
    at 248,320, 151,936 and 32,000 ids, where rule 0 takes 5, 9 and 10)."""
    for vocab, rule in itertools.product((32_000, 49_152, 128_256, 151_936, 248_320, 262_144), (0, 1)):
        samples = topk_fused.samples_for(vocab)
        for k in range(1, topk_fused.FAST_K + 1):
            r = topk_fused.best_rank(k, vocab, samples, rule)
            fail = 1 - topk_fused._poisson_cdf(r - 1, (k - 1) * samples / vocab)
            overflow = topk_fused._poisson_cdf(r - 1, topk_fused.CANDIDATES * samples / vocab)
            limit = 0.002 if k <= 20 else 0.02  # per row; a missed row is retried in the kernel
            assert fail < limit and overflow < limit, (vocab, rule, k, r, fail, overflow)
            if rule == 1 and r > 1:  # the rank below it fails too often
                assert 1 - topk_fused._poisson_cdf(r - 2, (k - 1) * samples / vocab) > topk_fused.FAIL_BOUND
    ranks = {(v, rule): topk_fused.best_rank(20, v, topk_fused.samples_for(v), rule)
             for v in (248_320, 151_936, 32_000) for rule in (0, 1)}
    assert [ranks[v, 1] for v in (248_320, 151_936, 32_000)] == [5, 6, 6]
    assert [ranks[v, 0] for v in (248_320, 151_936, 32_000)] == [5, 9, 10]
    assert topk_fused.samples_for(248_320) == topk_fused.SAMPLES
    assert topk_fused.samples_for(32_000) * topk_fused.SAMPLE_SHARE <= 32_000


@pytest.mark.parametrize("family", [n for n, f in FAMILIES.items() if f.make is not None])
def test_rank_k_plus_1_always_leaves_k_logits_above_t(family):
    """The rank a row that found too few logits >= t is retried with (at least k + 1) cannot miss that way,
    whatever the family: k + 1 distinct sample values above t are k logits of the row above it (an all-equal
    row has one value: its ties are looked up by index)."""
    x = make_family(family, 16, 248_320, seed=0, device=torch.device("cpu"))
    for row in x:
        for chunk in (8, topk_fused.CHUNK):  # runs of 8 (the tuning scripts' other layout) and of CHUNK
            t = threshold_reference(row, 21, chunk)
            above = int((row > t).sum())
            assert above == 0 if family == "padding" else above >= 20, (family, chunk, above)


def test_samples_stay_inside_the_row_for_every_vocabulary():
    """The threshold reads samples // run runs of `run` contiguous logits, one in the middle of each stretch of
    `vocab // (samples // run)` (as harness.verify.topk_fused._sample_at): all inside the row, for any vocabulary."""
    for vocab, chunk in itertools.product([*range(2, 5000), 32_000, 151_936, 248_320],
                                          (8, topk_fused.CHUNK)):
        samples = topk_fused.samples_for(vocab)
        run = topk_fused.run_length(samples, chunk)
        places = samples // run
        stride = vocab // places
        first, last = (stride - run) // 2, (places - 1) * stride + (stride - run) // 2 + run - 1
        assert samples * run > 0 and 0 <= first and last < vocab, (vocab, chunk)


def test_only_the_sparse_mode_of_a_wide_vocabulary_takes_wide_blocks():
    """launch_config: 2,048-logit blocks appending by repeated minimum for run_sparse from WIDE_VOCAB ids (faster
    there on the H200), 1,024 and the scalar-test append below it and in the dense mode; no loop in the first
    round's pass in either mode."""
    wide = topk_fused.launch_config(248_320, sparse=True)
    assert (wide["PASS_BLOCK"], wide["SPARSE_APPEND"], wide["PASS_LOOP"]) == (2048, 2, 0)
    for vocab, sparse_mode in ((topk_fused.WIDE_VOCAB - 1, True), (32_000, True), (248_320, False)):
        cfg = topk_fused.launch_config(vocab, sparse_mode)
        assert (cfg["PASS_BLOCK"], cfg["SPARSE_APPEND"], cfg["DENSE_APPEND"], cfg["PASS_LOOP"]) == (1024, 1, 0, 0)
    assert topk_fused.launch_config(topk_fused.WIDE_VOCAB, sparse=True)["PASS_BLOCK"] == 2048
    # the dense mode's finish: 4 warps, a missed row's samples at once; both modes' first rank: rule 1
    for vocab in (32_000, 248_320):
        dense, sparse_cfg = topk_fused.launch_config(vocab), topk_fused.launch_config(vocab, sparse=True)
        keys = ("FINISH_WARPS", "PIECE", "CHUNK", "RANK_RULE")
        assert [dense[key] for key in keys] == [4, topk_fused.SAMPLES, 16, 1]
        assert [sparse_cfg[key] for key in keys] == [2, topk_fused.PIECE, 16, 1]


def interpreter_ready() -> bool:
    return importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.interpreter
def test_the_kernel_under_the_triton_interpreter():
    interpreter_or_skip()
    logits, temperature, top_k, top_p = cases(10, 8192, "cpu")
    out, left = topk_fused.run(logits, temperature, top_k, top_p)
    assert left is not None and left.tolist() == [5, 6, 7]  # top_k 65, 4096, the vocabulary: the caller's
    taken = [row for row in range(10) if row not in (5, 6, 7)]  # the kernels missed none of the others
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
    temperature, top_k, top_p = (torch.ones(n, device="cuda"), torch.full((n,), 20, device="cuda"),
                                 torch.full((n,), 0.95, device="cuda"))
    got = verify.topk_fused_probs(logits, temperature, top_k, top_p)
    ref = verify.full_vocab_probs(logits, temperature, top_k, top_p)
    assert torch.equal(got > 0, ref > 0) and float((got - ref).abs().max()) <= TOLERANCE


@pytest.mark.gpu
@needs_cuda
def test_half_the_rows_all_equal_on_cuda():
    logits = torch.randn(512, 248_320, device="cuda")
    logits[:256] = 0.0
    n = logits.shape[0]
    temperature, top_k, top_p = (torch.ones(n, device="cuda"), torch.full((n,), 20, device="cuda"),
                                 torch.full((n,), 0.95, device="cuda"))
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


def top_at_the_first_samples(n: int, vocab: int) -> torch.Tensor:
    """Rows whose 30 largest logits sit where the first 30 samples are read: a threshold with a few samples
    above it lets only those few logits through."""
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(1))
    logits[:, sample_positions(vocab)[:30]] = 10 + torch.arange(30, 0, -1).float()
    return logits


@pytest.mark.interpreter
def test_a_threshold_with_too_few_logits_above_it_is_retried_in_the_kernel():
    """10 samples above the first threshold, and so only 10 logits, for a top-20: the row gets another (twice
    the samples above it) and is written by the kernel, not left to the caller."""
    interpreter_or_skip()
    logits = top_at_the_first_samples(4, 8192)
    temperature, top_k, top_p = torch.ones(4), torch.full((4,), 20), torch.full((4,), 0.95)
    out, left = topk_fused.run(logits, temperature, top_k, top_p, config={"FIRST_RANK": 10})
    assert left is None
    check_against_full_vocab(out, logits, temperature, top_k, top_p)


@pytest.mark.interpreter
def test_a_threshold_with_too_many_logits_above_it_is_retried_in_the_kernel(monkeypatch):
    """32 of 2,048 samples above the first threshold: about 512 logits of 32,768, spread over 16 blocks (none
    crowded), for a list of 128; the row gets another (half as many above) and is written by the kernel."""
    interpreter_or_skip()
    monkeypatch.setattr(topk_fused, "CANDIDATES", 128)
    logits, temperature, top_k, top_p = (t[:4] for t in cases(10, 32_768, "cpu"))
    top_k[:] = 20
    temperature[:] = 1.0
    out, left = topk_fused.run(logits, temperature, top_k, top_p, config={"FIRST_RANK": 32})
    assert left is None
    check_against_full_vocab(out, logits, temperature, top_k, top_p)


@pytest.mark.interpreter
def test_rows_missed_past_the_retry_list_or_the_last_round_go_to_the_caller(monkeypatch):
    """With room for one retried row and two rounds, rows whose first threshold lets too few logits through
    are flagged (not written by the kernel), and fused_build builds them: the result is still full_vocab's."""
    interpreter_or_skip()
    monkeypatch.setattr(topk_fused, "REDO", 1)
    monkeypatch.setattr(topk_fused, "ROUNDS", 2)
    logits = top_at_the_first_samples(4, 8192)
    temperature, top_k, top_p = torch.ones(4), torch.full((4,), 20), torch.full((4,), 0.95)
    _, left = topk_fused.run(logits, temperature, top_k, top_p, config={"FIRST_RANK": 1})
    assert left is not None and len(left) >= 3  # one row at most had a second round
    got = verify.fused_build(logits, temperature, top_k, top_p, config={"FIRST_RANK": 1})
    check_against_full_vocab(got, logits, temperature, top_k, top_p)


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
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_rows_at_their_own_vocabulary_under_the_interpreter(model):
    interpreter_or_skip()
    rows, manifest = bank.load_rows(FIXTURE_BANK, model)
    check_family(model, manifest["vocab"], rows.shape[0], rows.float())


@pytest.mark.interpreter
@pytest.mark.parametrize("vocab", [2, 5, 37, 300, 1000])
def test_small_vocabularies_under_the_interpreter(vocab):
    """The samples stay inside the row however small it is (at most an eighth of it, runs as short as one
    logit); every row with 1 <= k < vocab is the kernels' and matches full_vocab; an empty batch is empty."""
    interpreter_or_skip()
    n = 6
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(vocab))
    temperature, top_p = torch.ones(n), torch.full((n,), 0.9)
    top_k = torch.tensor([1, 2, 3, 20, 64, -1]).clamp(max=vocab)
    assert topk_fused.samples_for(vocab) * topk_fused.SAMPLE_SHARE <= max(vocab, topk_fused.SAMPLE_SHARE)
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
    # the other ways a block appends, the wide vocabularies' blocks, the loop of the first round: the same
    others = ({"SPARSE_APPEND": 0}, {"SPARSE_APPEND": 2, "PASS_BLOCK": 2048}, {"PASS_LOOP": 1})
    for config in (others if family in ("iid", "sorted") else ()):
        v2, i2, left2 = topk_fused.run_sparse(logits, temperature, top_k, top_p, config)
        assert torch.equal(left2, left) and torch.equal(v2[taken], values[taken]) and torch.equal(i2[taken], ids[taken])
