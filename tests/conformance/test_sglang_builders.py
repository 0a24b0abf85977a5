"""Conformance of the verify-probability builders with SGLang 0.5.23's own function, on the CPU.

SGLang side: `sglang.srt.speculative.dflash_utils.build_speculative_verify_target_probs`, called with
a `SamplingBatchInfo` built by SGLang's own `SamplingBatchInfo.from_schedule_batch` from SGLang's own
`SamplingParams` (only the runtime-config lookup `get_exec` is stubbed), and with DFLASH's
`max_top_k` / `uniform_top_k_value`. Project side: `harness.verify`'s three builders on the same
logits, with the per-request parameters repeated `draft_token_num` times per request.

The maths are the same (temperature, `torch.topk`, softmax over the kept logits, scatter), so the
outputs are bitwise equal, except for these differences, each pinned by a named test below:

1. the top-p rule (`test_named_top_p_...`). On the CPU SGLang renormalises with
   `sglang.srt.layers.sampler.top_p_normalize_probs_torch`: it sorts, and drops by position a token
   whose (cumsum - p) > top_p, strictly. The project follows SGLang's CUDA path, FlashInfer's
   `top_p_renorm_probs` (flashinfer 0.7.0: `TopPRenormProbKernel` below 2048 columns,
   `AirTopPRenormProb` from 2048), which keeps the tokens above a probability threshold: a token is
   dropped when the mass of the strictly larger probabilities reaches top_p, so equal probabilities
   go together. The CPU rule differs (a) where the float32 mass before a token equals top_p exactly
   (SGLang keeps one more token), (b) where equal probabilities straddle the cut (SGLang keeps some of
   them, in its sort order; the project all). (b) is common with bf16 logits (about 2 rows in 3
   below). Checked on an H200 with flashinfer 0.7.0: on probabilities from bf16 logits FlashInfer
   kept exactly the project's sets in 256/256 rows at k = 20 and k = 4096 and 64/64 dense 32k rows,
   where a positional rule matched 196/256, 8/256 and 2/64; through the whole builder (top_p 0.5 to
   0.95, k 20 to 32000, fp32 and bf16, 120 rows each) the kept sets were equal except 1-2 dense fp32
   rows (an exact boundary: FlashInfer's parallel sums decide either way) and, in bf16 at k = 20,
   rows where CUDA's and the CPU's torch.topk keep different tied logits. Values are never bitwise
   FlashInfer's (it multiplies by an approximate reciprocal of a parallel sum; |diff| <= 2.7e-7).
2. top_p = 1 rows of a batch that uses top-p (`test_named_top_p_one_rows_...`): SGLang renormalises
   every row once any row has top_p < 1 (a division by the row's own sum: rounding), and on the CPU
   its strict rule also drops the tail tokens whose float32 cumulative sum before them overshoots 1.0
   (many dense rows at vocab 32000). SGLang's CUDA path does not keep them whole either: FlashInfer's
   radix kernel (2048 columns and up) dropped tail tokens of top_p = 1 rows in the H200 check (up to
   1409 of 4096). The project leaves top_p >= 1 rows untouched, so that a row never depends on its
   batch; it equals SGLang for the same request in a batch without top-p.
3. a whole-vocabulary request in the batch (`test_named_whole_vocabulary_request_...`): SGLang picks
   its path per batch: when the largest top_k reaches the vocabulary (top_k -1, or an explicit
   top_k >= vocab), every row takes the dense path, softmax over the vocabulary then a top-k
   renormalisation (a division by the kept mass), which differs by rounding from the softmax over
   the k kept logits. An explicit top_k >= vocab also renormalises the dense row itself. The project
   picks the path per row and equals SGLang for the same request in a batch of sparse rows only.
4. greedy rows whose maximum logit is tied (`test_named_greedy_tie_...`; bf16 logits hit it too):
   SGLang normalises temperature 0 to temperature 1, top_k 1, and keeps the first index of
   `torch.topk(scaled, max_top_k)`, which among tied maxima depends on max_top_k; the project keeps
   `argmax` (the first tied index), as SGLang's own greedy sampler does (`torch.argmax` in
   `Sampler.forward`).
5. ties at a row's top-k boundary (`test_ties_at_each_rows_top_k_boundary`): which tied token is kept
   may differ for the "top-k first" builders (top-k of the raw logits instead of the scaled ones);
   counts and values are the same.

Fixed in the project by this comparison: temperature exactly 1e-6 is not greedy in SGLang
(`0 <= temperature < 1e-6`); the project used `<=` (`test_temperature_of_exactly_1e6_...`). The
top-p rule (1) and the untouched top_p = 1 rows (2) are also new in the project.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
import torch
from sglang_support import import_sglang
from torch import Tensor

from harness import verify
from harness.micro import impls
from harness.micro.inputs import RowParams

pytestmark = pytest.mark.sglang

PROJECT_BUILDERS = tuple(verify.BUILDERS)  # full_vocab, topk_first, topk_first_torch
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Req:
    """One request's sampling parameters, as a client sends them (SGLang's request-level values)."""

    temperature: float
    top_k: int
    top_p: float


class _Batch:
    """The two attributes of a ScheduleBatch that `SamplingBatchInfo.from_schedule_batch` reads here
    (a class, not a SimpleNamespace: SGLang keeps a weak reference to it)."""

    def __init__(self, reqs: list[SimpleNamespace]):
        self.reqs = reqs
        self.device = "cpu"


def _runtime_config_stub() -> SimpleNamespace:
    """What `from_schedule_batch` reads from SGLang's runtime config: no deterministic inference,
    no custom logit processor, no watermark (a server's defaults)."""
    return SimpleNamespace(
        deterministic=SimpleNamespace(enable_deterministic_inference=False),
        features=SimpleNamespace(enable_custom_logit_processor=False, enable_watermark=False),
    )


@pytest.fixture(scope="module")
def sg() -> Iterator[SimpleNamespace]:
    """SGLang's modules; `get_exec` of sampling_batch_info stubbed for the module's tests."""
    dflash = import_sglang("sglang.srt.speculative.dflash_utils")
    params = import_sglang("sglang.srt.sampling.sampling_params")
    batch_info = import_sglang("sglang.srt.sampling.sampling_batch_info")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batch_info, "get_exec", _runtime_config_stub)
        yield SimpleNamespace(dflash=dflash, params=params, batch_info=batch_info)


def real_sampling_info(sg: SimpleNamespace, reqs: list[Req], vocab: int):
    """SGLang's own SamplingBatchInfo for these requests (its SamplingParams normalise and verify)."""
    params = [sg.params.SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p) for r in reqs]
    for p in params:
        p.verify(vocab)
    reqs_ns = [
        SimpleNamespace(
            sampling_params=p, custom_logit_processor=None, return_sampling_mask=False, sampling_logprobs_mode=None
        )
        for p in params
    ]
    return sg.batch_info.SamplingBatchInfo.from_schedule_batch(_Batch(reqs_ns), vocab)


def sglang_probs(sg: SimpleNamespace, reqs: list[Req], logits: Tensor, dtn: int = 1) -> Tensor:
    """SGLang's builder. logits: [len(reqs) * dtn, V] -> [len(reqs) * dtn, V] fp32."""
    info = real_sampling_info(sg, reqs, logits.shape[-1])
    max_top_k, uniform = impls.dflash_top_k_hints(info.top_ks)
    out = sg.dflash.build_speculative_verify_target_probs(
        next_token_logits=logits,
        sampling_info=info,
        draft_token_num=dtn,
        bs=len(reqs),
        max_top_k=max_top_k,
        uniform_top_k_value=uniform,
        use_sparse_topk=True,
    )
    assert out.shape == (len(reqs), dtn, logits.shape[-1]), out.shape
    return out.reshape(logits.shape)


def row_params(reqs: list[Req], dtn: int = 1) -> RowParams:
    """Per-row parameters [len(reqs) * dtn], each request repeated dtn times (as SGLang does)."""

    def col(values: list, dtype: torch.dtype) -> Tensor:
        return torch.tensor(values, dtype=dtype).repeat_interleave(dtn)

    return RowParams(
        temperature=col([r.temperature for r in reqs], torch.float32),
        top_k=col([r.top_k for r in reqs], torch.int64),
        top_p=col([r.top_p for r in reqs], torch.float32),
    )


def project_probs(name: str, reqs: list[Req], logits: Tensor, dtn: int = 1) -> Tensor:
    p = row_params(reqs, dtn)
    return verify.get_builder(name)(logits, p.temperature, p.top_k, p.top_p)


def project_top_p_rule(probs: Tensor, top_ps: Tensor) -> Tensor:
    """SGLang's top-p step with the project's rule instead of SGLang's CPU one: sort (as SGLang does),
    `verify.top_p_renorm_sorted`, scatter back. probs: [rows, n]; top_ps: [rows] -> [rows, n]."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    kept = verify.top_p_renorm_sorted(sorted_probs, top_ps.float())
    return torch.zeros_like(kept).scatter_(-1, order, kept)


@pytest.fixture
def sglang_with_project_top_p(sg) -> Callable[..., Tensor]:
    """SGLang's builder with only its CPU top-p function replaced by the project's rule (for the one
    call: plain `sglang_probs` calls stay SGLang's own)."""

    def call(reqs: list[Req], logits: Tensor, dtn: int = 1) -> Tensor:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sg.dflash, "top_p_normalize_probs_torch", project_top_p_rule)
            return sglang_probs(sg, reqs, logits, dtn)

    return call


def make_logits(rows: int, vocab: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """A peaked head and a long tail, distinct values: [rows, vocab] (cast to dtype)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 2.0 + torch.linspace(4, 0, vocab)[torch.randperm(vocab, generator=g)]
    return x.to(dtype)


def assert_bitwise(got: Tensor, want: Tensor, what: str) -> None:
    """torch.equal, else an AssertionError naming the rows that differ and how."""
    if torch.equal(got, want):
        return
    rows = (got != want).any(dim=-1).nonzero().flatten().tolist()
    kept = ((got > 0).sum(-1) - (want > 0).sum(-1))[rows].tolist()
    raise AssertionError(
        f"{what}: {len(rows)} of {got.shape[0]} rows differ, rows {rows[:12]}; kept-count "
        f"differences {kept[:12]}; max |diff| {float((got - want).abs().max()):.3e}"
    )


def differing_rows(a: Tensor, b: Tensor) -> set[int]:
    return set((a != b).any(dim=-1).nonzero().flatten().tolist())


def sglang_cpu_top_p_counts(pre_top_p: Tensor, top_p: Tensor) -> Tensor:
    """How many tokens SGLang's CPU top-p keeps per row: those whose float32 mass before them (in its
    descending sort) is <= top_p. pre_top_p: [rows, V], SGLang's own probabilities with top-p off;
    top_p: [rows], every one < 1. -> [rows] int64."""
    s = pre_top_p.sort(dim=-1, descending=True).values
    return ((torch.cumsum(s, dim=-1) - s <= top_p.unsqueeze(-1)) & (s > 0)).sum(dim=-1)


def without_top_p(reqs: list[Req]) -> list[Req]:
    return [replace(r, top_p=1.0) for r in reqs]


def greedy_tie_rows(got: Tensor, ref: Tensor, logits: Tensor, reqs: list[Req], dtn: int) -> set[int]:
    """The rows where `got` (project) and `ref` (SGLang) differ as difference 4 says: a greedy row
    whose maximum logit is tied, one-hot at argmax in the project and at the first index of
    torch.topk(row, max_top_k) in SGLang. Raises AssertionError for any other differing row.
    got, ref, logits: [rows, V]."""
    rows = differing_rows(got, ref)
    max_top_k = impls.dflash_top_k_hints(impls.sglang_sampling_info(row_params(reqs)).top_ks)[0]
    max_top_k = min(max_top_k, logits.shape[-1])
    greedy = row_params(reqs, dtn).temperature < verify.GREEDY_TEMPERATURE
    for r in sorted(rows):
        row = logits[r].float()
        first = int(torch.topk(row, max_top_k).indices[0])
        assert bool(greedy[r]) and (row == row.max()).sum() > 1, f"row {r} is not a greedy row with a tied maximum"
        assert got[r, int(row.argmax())] == 1.0 and ref[r, first] == 1.0, f"row {r}: not argmax vs topk's first"
    return rows


def check_top_p_rows(sg, with_rule, reqs: list[Req], logits: Tensor, dtn: int, name: str) -> int:
    """Everything about a batch whose requests all use top-p (< 1). The project equals SGLang with the
    project's top-p rule, bitwise. Plain SGLang keeps, in every row, the count its CPU rule gives on
    its own probabilities, and differs from the project exactly in the rows where that count is not
    the project's (difference 1). Returns how many rows differ."""
    assert all(r.top_p < 1.0 for r in reqs)
    got = project_probs(name, reqs, logits, dtn)
    assert_bitwise(got, with_rule(reqs, logits, dtn), f"{name} vs SGLang with the project's top-p rule")
    plain = sglang_probs(sg, reqs, logits, dtn)
    cpu_counts = sglang_cpu_top_p_counts(
        sglang_probs(sg, without_top_p(reqs), logits, dtn), row_params(reqs, dtn).top_p
    )
    assert torch.equal((plain > 0).sum(-1), cpu_counts), f"{name}: SGLang's kept counts are not its CPU rule's"
    counted = set(((got > 0).sum(-1) != cpu_counts).nonzero().flatten().tolist())
    assert differing_rows(got, plain) == counted, f"{name}: rows differing from SGLang are not the named ones"
    return len(counted)


# ---------------------------------------------------------------------------------------------
# the adapter of `make micro` fills the fields as SGLang does
# ---------------------------------------------------------------------------------------------

ADAPTER_CASES = {
    "mixed": [
        Req(0.0, -1, 1.0),
        Req(1e-7, 20, 0.9),
        Req(1e-6, -1, 1.0),
        Req(0.7, 20, 0.95),
        Req(1.0, 1, 1.0),
        Req(1.3, 4096, 0.5),
        Req(1.0, 50000, 1.0),
        Req(2.0, 32000, 1.0),
    ],
    "whole vocabulary, no top-p": [Req(1.0, -1, 1.0), Req(0.6, -1, 1.0)],
    "all greedy": [Req(0.0, -1, 1.0), Req(0.0, 20, 0.9), Req(0.5, 1, 1.0)],
    "bounded top_k": [Req(0.8, 20, 0.95), Req(0.8, 2049, 1.0)],
}


@pytest.mark.parametrize("case", list(ADAPTER_CASES))
def test_adapter_fills_sampling_info_as_sglang(sg, case):
    reqs = ADAPTER_CASES[case]
    real = real_sampling_info(sg, reqs, 32000)
    mine = impls.sglang_sampling_info(row_params(reqs))
    for field in ("temperatures", "top_ks", "top_ps"):
        a, b = getattr(mine, field), getattr(real, field)
        assert a.dtype == b.dtype and torch.equal(a, b), f"{case}: {field} {a.tolist()} != SGLang's {b.tolist()}"
    for field in ("need_top_k_sampling", "need_top_p_sampling", "is_all_greedy", "max_top_k"):
        assert getattr(mine, field) == getattr(real, field), f"{case}: {field}"


def test_adapter_call_equals_sglang_with_its_real_sampling_info(sg):
    reqs, dtn = ADAPTER_CASES["mixed"], 2
    logits = make_logits(len(reqs) * dtn, 32000, seed=11)
    fn = sg.dflash.build_speculative_verify_target_probs
    assert_bitwise(
        impls.sglang_call(fn, row_params(reqs), dtn)(logits),
        sglang_probs(sg, reqs, logits, dtn),
        "adapter vs real SamplingBatchInfo",
    )


# ---------------------------------------------------------------------------------------------
# bitwise where the maths are the same
# ---------------------------------------------------------------------------------------------

UNIFORM = [(1000, 20), (1000, 999), (32000, 20), (32000, 2048), (32000, 2049), (32000, 4096)]


@pytest.mark.parametrize("vocab,top_k", UNIFORM)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("dtn", [1, 3])
def test_uniform_batch_without_top_p_bitwise(sg, vocab, top_k, dtype, dtn):
    reqs = [Req(0.8, top_k, 1.0)] * 4
    logits = make_logits(4 * dtn, vocab, seed=top_k + dtn, dtype=DTYPES[dtype])
    want = sglang_probs(sg, reqs, logits, dtn)
    for name in PROJECT_BUILDERS:
        assert_bitwise(project_probs(name, reqs, logits, dtn), want, f"{name} k={top_k} {dtype} dtn={dtn}")
    assert torch.all((want > 0).sum(-1) == top_k)


@pytest.mark.parametrize("vocab,top_k", UNIFORM)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("dtn", [1, 3])
def test_uniform_batch_with_top_p(sg, sglang_with_project_top_p, vocab, top_k, dtype, dtn):
    reqs = [Req(0.8, top_k, 0.95), Req(1.1, top_k, 0.9), Req(0.8, top_k, 0.95), Req(0.5, top_k, 0.7)]
    logits = make_logits(4 * dtn, vocab, seed=top_k + dtn + 1, dtype=DTYPES[dtype])
    for name in PROJECT_BUILDERS:
        check_top_p_rows(sg, sglang_with_project_top_p, reqs, logits, dtn, name)


MIXED_T = [1.0, 0.0, 0.7, 1.3, 1.0, 1e-7, 1.0, 2.0]  # rows 1 and 5 greedy by temperature
MIXED_K = [20, 20, 2048, 1, 2049, 4096, 20, 2049]  # row 3 greedy by top_k; every k below the vocabulary


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("dtn", [1, 2])
def test_mixed_batch_with_greedy_rows_bitwise(sg, dtype, dtn):
    """Bitwise, except (bf16) greedy rows whose maximum logit is tied: difference 4."""
    reqs = [Req(t, k, 1.0) for t, k in zip(MIXED_T, MIXED_K, strict=True)]
    logits = make_logits(8 * dtn, 32000, seed=5 + dtn, dtype=DTYPES[dtype])
    want = sglang_probs(sg, reqs, logits, dtn)
    for name in PROJECT_BUILDERS:
        ties = greedy_tie_rows(project_probs(name, reqs, logits, dtn), want, logits, reqs, dtn)
        assert dtype == "bf16" or not ties, f"{name}: fp32 logits are distinct, no greedy tie expected"
    greedy_rows = [r * dtn + j for r in (1, 3, 5) for j in range(dtn)]
    assert all(want[r].max() == 1.0 and want[r].sum() == 1.0 for r in greedy_rows)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("dtn", [1, 2])
def test_mixed_batch_with_top_p(sg, sglang_with_project_top_p, dtype, dtn):
    """Mixed top_p (rows at 1.0 included): equal to SGLang with the project's top-p rule, except (bf16)
    greedy rows with a tied maximum (difference 4); plain SGLang's top_p = 1 rows are
    test_named_top_p_one_rows_in_a_top_p_batch's subject."""
    top_p = [0.95, 1.0, 0.5, 0.99, 1.0, 0.9, 0.7, 1.0]
    reqs = [Req(t, k, p) for t, k, p in zip(MIXED_T, MIXED_K, top_p, strict=True)]
    logits = make_logits(8 * dtn, 32000, seed=7 + dtn, dtype=DTYPES[dtype])
    want = sglang_with_project_top_p(reqs, logits, dtn)
    for name in PROJECT_BUILDERS:
        ties = greedy_tie_rows(project_probs(name, reqs, logits, dtn), want, logits, reqs, dtn)
        assert dtype == "bf16" or not ties, f"{name}: fp32 logits are distinct, no greedy tie expected"


@pytest.mark.parametrize("vocab", [1000, 32000])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_whole_vocabulary_dense_path(sg, sglang_with_project_top_p, vocab, dtype):
    """top_k -1 on every request: softmax over the vocabulary on both sides (SGLang: need_top_k off)."""
    logits = make_logits(6, vocab, seed=vocab, dtype=DTYPES[dtype])
    reqs = [Req(t, -1, 1.0) for t in (1.0, 0.7, 1.5)]
    for name in PROJECT_BUILDERS:
        assert_bitwise(project_probs(name, reqs, logits, 2), sglang_probs(sg, reqs, logits, 2), f"{name} dense")
    reqs = [Req(t, -1, p) for t, p in ((1.0, 0.95), (0.7, 0.9), (1.5, 0.8))]
    for name in PROJECT_BUILDERS:
        check_top_p_rows(sg, sglang_with_project_top_p, reqs, logits, 2, name)


def test_rows_with_fewer_finite_logits_than_k(sg):
    logits = make_logits(4, 8192, seed=3)
    logits[0, 10:] = float("-inf")  # 10 finite, top_k 20
    logits[1, :-3] = float("-inf")  # 3 finite, top_k 2049
    reqs = [Req(1.0, 20, 1.0), Req(0.9, 2049, 1.0), Req(1.0, 20, 1.0), Req(1.2, 4096, 1.0)]
    want = sglang_probs(sg, reqs, logits)
    for name in PROJECT_BUILDERS:
        assert_bitwise(project_probs(name, reqs, logits), want, name)
    assert (want > 0).sum(-1).tolist() == [10, 3, 20, 4096]


def test_temperature_of_exactly_1e6_samples_as_in_sglang(sg):
    """SGLang: `0 <= temperature < 1e-6` is greedy, so 1e-6 samples at T = 1e-6. Two logits one float32
    step apart (0.5 and 0.5 - 2**-24) give two tokens of mass at that temperature; the project's former
    `<=` made the row greedy (one token)."""
    assert sg.params.SamplingParams(temperature=1e-6).top_k == sg.params.TOP_K_ALL  # not greedy in SGLang
    logits = torch.full((2, 64), -5.0)
    logits[:, 3], logits[:, 9] = 0.5, 0.5 - 2.0**-24
    reqs = [Req(1e-6, 20, 1.0), Req(1e-6, -1, 1.0)]
    want = sglang_probs(sg, reqs, logits)
    assert (want > 0).sum(-1).tolist() == [2, 2], want[:, [3, 9]]
    for name in PROJECT_BUILDERS:
        assert_bitwise(project_probs(name, reqs, logits), want, name)


# ---------------------------------------------------------------------------------------------
# the named differences
# ---------------------------------------------------------------------------------------------


def test_named_top_p_boundary_is_strict_in_sglang_cpu(sg, sglang_with_project_top_p):
    """Difference 1, hit on purpose: top_p set to the float32 mass before rank 10 of row 0 (SGLang's own
    probabilities). SGLang's CPU rule keeps rank 10 ((cumsum - p) > top_p is false), the project drops
    it (mass before >= top_p), as FlashInfer's kernels on SGLang's CUDA path do."""
    logits = make_logits(3, 32000, seed=21)
    base = [Req(0.9, 20, 1.0)] * 3
    pre = sglang_probs(sg, base, logits)
    s = pre[0].sort(descending=True).values
    boundary = float((torch.cumsum(s, 0) - s)[10])
    reqs = [Req(0.9, 20, boundary), Req(0.9, 20, 0.95), Req(0.9, 20, boundary)]
    got, plain = project_probs("full_vocab", reqs, logits), sglang_probs(sg, reqs, logits)
    assert (got[0] > 0).sum() == 10 and (plain[0] > 0).sum() == 11, "row 0: project 10 tokens, SGLang 11"
    assert differing_rows(got, plain) == {0}
    assert check_top_p_rows(sg, sglang_with_project_top_p, reqs, logits, 1, "full_vocab") == 1


def test_named_top_p_equal_probabilities_at_the_cut(sg, sglang_with_project_top_p):
    """Difference 1 (b), hit on purpose: 4 equal largest logits (probabilities 0.25 each), top_p 0.5. The
    project keeps all four (no larger probability, so none of them is dropped), as FlashInfer's threshold
    does; SGLang's CPU rule keeps 3 (the 4th has 0.75 > 0.5 before it in its sort). With 20 equal
    probabilities (a padded slot) and top_p 0.95 both keep all 20: 0.95 before the 20th is not > 0.95."""
    logits = torch.full((2, 64), -30.0)
    logits[0, [5, 17, 40, 41]] = 3.0
    logits[1, :20] = 0.0
    reqs = [Req(1.0, 20, 0.5), Req(1.0, 20, 0.95)]
    got, plain = project_probs("full_vocab", reqs, logits), sglang_probs(sg, reqs, logits)
    assert (got > 0).sum(-1).tolist() == [4, 20] and (plain > 0).sum(-1).tolist() == [3, 20]
    assert torch.equal(got[0, [5, 17, 40, 41]], torch.full((4,), 0.25))
    assert check_top_p_rows(sg, sglang_with_project_top_p, reqs, logits, 1, "full_vocab") == 1


def test_named_top_p_one_rows_in_a_top_p_batch(sg):
    """Difference 2. Sparse rows (k = 2049): SGLang divides a top_p = 1 row by its own sum once another
    row uses top-p (rounding only, same kept set). Dense rows (top_k -1, vocab 32000): its strict CPU rule
    also drops the tokens whose float32 cumulative mass before them exceeds 1.0. The project's row is
    SGLang's row for the same request in a batch without top-p, bitwise, in both cases."""
    logits = make_logits(6, 32000, seed=31)
    for top_k in (2049, -1):
        reqs = [Req(1.0, top_k, 1.0), Req(0.8, top_k, 1.0), Req(1.0, top_k, 0.9)] * 2
        got, mixed = project_probs("full_vocab", reqs, logits), sglang_probs(sg, reqs, logits)
        alone = sglang_probs(sg, without_top_p(reqs), logits)
        ones = [r for r, q in enumerate(reqs) if q.top_p == 1.0]
        assert_bitwise(got[ones], alone[ones], f"top_k={top_k}: project vs SGLang without top-p in the batch")
        assert differing_rows(got[ones], mixed[ones]), f"top_k={top_k}: SGLang did not renormalise top_p=1 rows"
        s = alone[ones].sort(dim=-1, descending=True).values
        overshoot = ((torch.cumsum(s, -1) - s > 1.0) & (s > 0)).sum(-1)
        lost = (got[ones] > 0).sum(-1) - (mixed[ones] > 0).sum(-1)
        assert torch.equal(lost, overshoot), f"top_k={top_k}: tokens lost {lost.tolist()} vs overshoot {overshoot}"
        if top_k == 2049:
            assert not lost.any()
            assert torch.allclose(mixed[ones], got[ones], rtol=1e-6, atol=0.0)
        else:
            assert lost.any(), "the seed was chosen so that a dense row overshoots 1.0"
            assert torch.all((got[ones] > 0).sum(-1) == 32000)


@pytest.mark.parametrize("wide_k", [-1, 32000, 50000])
def test_named_whole_vocabulary_request_sends_the_batch_dense(sg, wide_k):
    """Difference 3: one request with top_k -1 (or an explicit top_k >= vocab) in a batch of k = 20 and
    k = 2049 requests sends every row to SGLang's dense path: softmax over 32000 then the top-k renorm
    (a division by the kept mass; need_top_k_sampling is on, so the wide row is divided by its sum
    too). Same kept sets, values within float32 rounding, not bitwise. The project's sparse rows equal
    SGLang's for a batch of the sparse requests only; its wide row equals SGLang's top_k -1 row in a
    batch of its own (need_top_k_sampling off), while an explicit top_k >= vocab is renormalised even
    there."""
    logits = make_logits(4, 32000, seed=41)
    reqs = [Req(1.0, 20, 1.0), Req(0.7, 2049, 1.0), Req(1.0, wide_k, 1.0), Req(1.3, 20, 1.0)]
    got, mixed = project_probs("full_vocab", reqs, logits), sglang_probs(sg, reqs, logits)
    sparse = [0, 1, 3]
    assert_bitwise(got[sparse], sglang_probs(sg, [reqs[r] for r in sparse], logits[sparse]), "sparse rows alone")
    assert_bitwise(got[[2]], sglang_probs(sg, [Req(1.0, -1, 1.0)], logits[[2]]), "wide row as top_k -1 alone")
    assert torch.equal(got > 0, mixed > 0), "kept sets"
    assert differing_rows(got, mixed) == {0, 1, 2, 3}, "SGLang's dense path: every row renormalised"
    assert torch.allclose(mixed, got, rtol=2e-6, atol=1e-12)
    wide_alone = sglang_probs(sg, [reqs[2]], logits[[2]])
    assert (wide_k == -1) == torch.equal(wide_alone, got[[2]]), "explicit top_k >= vocab renormalised alone"


def test_named_greedy_tie_at_the_maximum(sg):
    """Difference 4: rows whose logits are all equal (padded batch slots), greedy (temperature 0), in a
    batch whose max_top_k is 20. SGLang keeps the first index of torch.topk(row, 20); the project keeps
    argmax, index 0, like SGLang's all-greedy sampler. Both are one-hot on a tied maximum."""
    logits = make_logits(3, 4096, seed=51)
    logits[1:] = 0.0
    reqs = [Req(1.0, 20, 1.0), Req(0.0, -1, 1.0), Req(0.0, 20, 1.0)]
    got, want = project_probs("full_vocab", reqs, logits), sglang_probs(sg, reqs, logits)
    assert_bitwise(got[[0]], want[[0]], "sampled row")
    topk_first_index = torch.topk(logits[1:], 20, dim=-1).indices[:, 0]
    for row, first in zip((1, 2), topk_first_index.tolist(), strict=True):
        assert got[row, 0] == 1.0 and got[row].sum() == 1.0, "project: one-hot at argmax (index 0)"
        assert want[row, first] == 1.0 and want[row].sum() == 1.0, "SGLang: one-hot at topk's first index"
        assert first != 0, "the tie must pick a different index for this test to pin anything"


def tied_rows(top_ks: list[int], vocab: int, seed: int) -> Tensor:
    """Each row has 7 equal logits at ranks k-3 .. k+3 (its own top-k boundary). -> [len(top_ks), vocab]."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for k in top_ks:
        row = torch.randn(vocab, generator=g) - 10.0
        perm = torch.randperm(vocab, generator=g)
        row[perm[: k - 3]] = torch.rand(k - 3, generator=g) + 5.0
        row[perm[k - 3 : k + 4]] = 2.0
        rows.append(row)
    return torch.stack(rows)


def test_ties_at_each_rows_top_k_boundary(sg):
    """Difference 5: full_vocab runs the very torch.topk call SGLang runs (bitwise). The top-k-first
    builders select on the raw logits: any kept index that differs from SGLang's is one of the tied
    logits, and each row keeps the same number of tokens with the same sorted values."""
    top_ks = [20, 2048, 2049, 4096, 20]
    logits = tied_rows(top_ks, 8192, seed=4)
    reqs = [Req(0.8, k, 1.0) for k in top_ks]
    want = sglang_probs(sg, reqs, logits)
    assert_bitwise(project_probs("full_vocab", reqs, logits), want, "full_vocab")
    for name in ("topk_first", "topk_first_torch"):
        got = project_probs(name, reqs, logits)
        assert torch.equal((got > 0).sum(-1), (want > 0).sum(-1)), name
        assert torch.equal(got.sort(-1).values, want.sort(-1).values), name
        moved = (got > 0) != (want > 0)
        assert torch.all(logits[moved] == 2.0), f"{name}: a kept index moved off the tied logits"


# ---------------------------------------------------------------------------------------------
# the comparison can fail
# ---------------------------------------------------------------------------------------------


def test_a_one_ulp_temperature_change_is_caught(sg):
    reqs = [Req(0.8, 20, 1.0), Req(0.8, 2049, 1.0)]
    logits = make_logits(2, 32000, seed=61)
    p = row_params(reqs)
    wrong_t = p.temperature.clone()
    wrong_t[1] = torch.nextafter(wrong_t[1], torch.tensor(1.0))
    got = verify.full_vocab_probs(logits, wrong_t, p.top_k, p.top_p)
    with pytest.raises(AssertionError, match=r"1 of 2 rows differ, rows \[1\]"):
        assert_bitwise(got, sglang_probs(sg, reqs, logits), "corrupted temperature")
