"""The verify kernel (harness/verify/sparse_kernel.py) and the whole sparse verify step
(harness.verify.sparse.verify_step): the kernel makes the torch sparse verifiers' decisions row for row with the
same coins, whatever the order of a row's entries; the fused step (topk_fused's kernels + the verify kernel)
equals topk_fused's entries verified by the torch verifiers, rows the kernels leave included.

- Marker `interpreter` (make test runs these in .venv-sglang, under TRITON_INTERPRET=1): the kernels on a CPU.
- Marker `gpu` (skipped without CUDA): the same on a GPU at the seed's vocabulary, and the chi-square of the
  target distribution through the kernel (60,000 steps: too many programs for the interpreter).
- Unmarked: verify_step's CPU path and its argument checks.
"""

from __future__ import annotations

import pytest
import torch
from test_topk_fused import interpreter_or_skip
from test_verify_sparse import SPARSE, chi_square, first_two_tokens, random_case

from harness.micro.families import make_family
from harness.verify import sparse as sp
from harness.verify import topk_first_probs, verify_block, verify_tokenwise
from harness.verify.sparse import SparseProbs

CUDA = torch.cuda.is_available()


def kernel_verifier(name: str):
    """The kernel behind the sparse verifiers' signature: the target's entries reversed (not in id order)."""
    from harness.verify import sparse_kernel  # noqa: PLC0415  (imports Triton)

    def verifier(target: SparseProbs, drafts, q, *, uniforms):
        values, ids = target.values.flip(-1), target.ids.flip(-1).int()
        return sparse_kernel.verify_entries(values, ids, target.vocab, drafts, q, uniforms, name == "block")
    return verifier


def same_outputs(a, b) -> torch.Tensor:
    """Steps whose accepted count or tokens differ."""
    return (a.num_accepted != b.num_accepted) | (a.tokens != b.tokens).any(dim=-1)


@pytest.mark.interpreter
@pytest.mark.parametrize("name", ["token", "block"])
@pytest.mark.parametrize("draft", ["greedy", "dense-q"])
def test_the_kernel_makes_the_sparse_verifiers_decisions(name, draft):
    """40 steps of gamma 5 over 256 ids: the same accepted counts and tokens as verify_*_sparse with the same
    coins, row for row."""
    interpreter_or_skip()
    target, drafts, q, u = random_case(40, 256, 5, draft, seed=23, near=0.3)
    entries = SparseProbs.from_dense(target)
    want = SPARSE[name](entries, drafts, q, uniforms=u)
    got = kernel_verifier(name)(entries, drafts, q, uniforms=u)
    assert int(same_outputs(got, want).sum()) == 0
    assert {0, 5} < set(want.num_accepted.tolist())  # none, all and some accepted


@pytest.mark.interpreter
def test_the_kernel_on_padding_and_top_p_zeros():
    """Rows with entries of value 0 (top-p cut inside the k kept: run_sparse's output keeps their ids) and
    padding ids, a draft outside the target's support, and a coin at the end of the CDF (u -> 1)."""
    interpreter_or_skip()
    from harness.verify import sparse_kernel  # noqa: PLC0415

    values = torch.tensor([[[0.0, 0.7, 0.3, 0.0], [0.5, 0.0, 0.5, 0.0], [0.2, 0.8, 0.0, 0.0]]])
    ids = torch.tensor([[[9, 3, 5, 16], [2, 11, 7, 16], [4, 1, 16, 16]]], dtype=torch.int32)
    drafts = torch.tensor([[3, 8]])  # 8 is not among position 1's entries: rejected there
    u = torch.tensor([[0.5, 0.1, 1.0 - 2**-24]])
    for block in (False, True):
        got = sparse_kernel.verify_entries(values, ids, 16, drafts, None, u, block)
        want = (sp.verify_block_sparse if block else sp.verify_tokenwise_sparse)(
            SparseProbs(values, ids.long(), 16), drafts, None, uniforms=u)
        assert got.tokens.tolist() == want.tokens.tolist() and got.num_accepted.tolist() == [1]
        assert got.tokens[0, 1] in (2, 7)  # the correction has p's support at position 1, the top coin: id 7


@pytest.mark.interpreter
def test_garbage_entries_are_never_looked_up_in_q():
    """verify_step queues the kernel before it knows which rows run_sparse left unwritten: their ids are
    whatever the memory held. The kernel reads a dense q only at ids in [0, V) (an illegal address on a GPU
    otherwise, seen on an H200), and the other steps' answers do not depend on them."""
    interpreter_or_skip()
    from harness.verify import sparse_kernel  # noqa: PLC0415

    target, drafts, q, u = random_case(2, 64, 3, "dense-q", seed=3, near=0.3)
    entries = SparseProbs.from_dense(target)
    ids = entries.ids.clone()
    ids[1] = torch.tensor([-7, -2**31, 10**6, -10**9]).repeat(ids.shape[-1] // 4 + 1)[: ids.shape[-1]]
    got = sparse_kernel.verify_entries(entries.values, ids, 64, drafts, q, u, True)
    want = sp.verify_block_sparse(entries, drafts, q, uniforms=u)
    assert got.tokens[0].tolist() == want.tokens[0].tolist()


@pytest.mark.interpreter
def test_the_fused_step_equals_topk_fused_entries_through_the_torch_verifiers():
    """verify_step's kernel path (queued kernels, one synchronisation) on 4 steps of gamma 3 over 2,048 ids,
    with greedy rows and rows the kernels leave (top_k 65, the whole vocabulary) mixed in: the tokens of
    topk_fused's entries verified by the torch sparse verifier, both methods, point masses and a dense q."""
    interpreter_or_skip()
    bsz, gamma, vocab = 4, 3, 2048
    rows = bsz * (gamma + 1)
    logits = make_family("iid", rows, vocab, seed=5, device=torch.device("cpu"))
    t, k, p = torch.ones(rows), torch.full((rows,), 20), torch.full((rows,), 0.95)
    t[2], k[6], k[9], k[13] = 0.0, 65, -1, 5
    drafts = logits.view(bsz, gamma + 1, vocab)[:, :gamma].argmax(dim=-1)
    drafts[1, 1] = 7
    g = torch.Generator().manual_seed(4)
    u = torch.rand(bsz, gamma + 1, generator=g)
    q = torch.softmax(logits.view(bsz, gamma + 1, vocab)[:, :gamma] + torch.randn(bsz, gamma, vocab, generator=g), -1)
    entries = sp._fused(logits, t, k, p)  # topk_fused's entries (the CUDA path, run by the interpreter)
    target = SparseProbs(entries.values.view(bsz, gamma + 1, -1), entries.ids.view(bsz, gamma + 1, -1), vocab)
    for block, q_arg in ((False, None), (True, None), (True, q)):
        want = (sp.verify_block_sparse if block else sp.verify_tokenwise_sparse)(target, drafts, q_arg, uniforms=u)
        got = sp._fused_step(logits, t, k, p, drafts, q_arg, u, block)
        assert got.tokens.tolist() == want.tokens.tolist()


def test_verify_step_on_a_cpu_is_topk_first_and_the_dense_verifiers():
    """On a CPU both settings of `fused` build topk_first's entries and verify them with the torch sparse
    verifiers: the dense path's tokens (topk_first + verify_block / verify_tokenwise), step for step."""
    bsz, gamma, vocab = 32, 4, 1024
    rows = bsz * (gamma + 1)
    logits = make_family("lm_like", rows, vocab, seed=3, device=torch.device("cpu"))
    t, k, p = torch.ones(rows), torch.full((rows,), 20), torch.full((rows,), 0.95)
    drafts = logits.view(bsz, gamma + 1, vocab)[:, :gamma].argmax(dim=-1)
    u = torch.rand(bsz, gamma + 1, generator=torch.Generator().manual_seed(8))
    dense = topk_first_probs(logits, t, k, p).view(bsz, gamma + 1, vocab)
    for block, verifier in ((True, verify_block), (False, verify_tokenwise)):
        want = verifier(dense, drafts, None, uniforms=u)
        for fused in (False, True):
            got = sp.verify_step(logits, t, k, p, drafts, None, block=block, fused=fused, uniforms=u)
            assert int(same_outputs(got, want).sum()) == 0


def test_verify_step_names_bad_shapes():
    logits = torch.randn(10, 64)
    t, k, p = torch.ones(10), torch.full((10,), 5), torch.ones(10)
    drafts = torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"10 rows of logits for 2 steps of 3 drafts: need B \* \(G\+1\)"):
        sp.verify_step(logits, t, k, p, drafts[:, :3], None, block=True, fused=False, uniforms=torch.rand(2, 4))
    with pytest.raises(ValueError, match=r"draft_probs \(2, 4, 32\) must be \[B, G, V\] = \[2, 4, 64\]"):
        sp.verify_step(logits, t, k, p, drafts, torch.rand(2, 4, 32), block=True, fused=True,
                       uniforms=torch.rand(2, 5))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("family", ["iid", "sorted", "bf16", "padding", "lm_like"])
def test_the_fused_step_on_a_gpu(family):
    """At the seed's vocabulary, 512 steps of gamma 7: verify_step's kernel path gives the tokens of topk_fused's
    entries verified by the torch sparse verifier (but coins within float32 rounding of h_i: none expected)."""
    bsz, gamma, vocab = 512, 7, 248_320
    rows = bsz * (gamma + 1)
    logits = make_family(family, rows, vocab, seed=6, device=torch.device("cuda"))
    t, k, p = (torch.ones(rows, device="cuda"), torch.full((rows,), 20, device="cuda"),
               torch.full((rows,), 0.95, device="cuda"))
    drafts = logits.view(bsz, gamma + 1, vocab)[:, :gamma].argmax(dim=-1)
    u = torch.rand(bsz, gamma + 1, generator=torch.Generator().manual_seed(4)).cuda()
    entries = sp.fused_sparse_probs(logits, t, k, p)
    target = SparseProbs(entries.values.view(bsz, gamma + 1, -1), entries.ids.view(bsz, gamma + 1, -1), vocab)
    for block in (False, True):
        want = (sp.verify_block_sparse if block else sp.verify_tokenwise_sparse)(target, drafts, None, uniforms=u)
        got = sp.verify_step(logits, t, k, p, drafts, None, block=block, fused=True, uniforms=u)
        assert int(same_outputs(got, want).sum()) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", ["token", "block"])
def test_the_kernel_keeps_the_target_distribution_on_a_gpu(name):
    """The chi-square of test_verify_sparse, through the kernel (dense q on the GPU)."""
    kernel = kernel_verifier(name)

    def on_gpu(target: SparseProbs, drafts, q, *, uniforms):
        t = SparseProbs(target.values.cuda(), target.ids.cuda(), target.vocab)
        out = kernel(t, drafts.cuda(), q.cuda(), uniforms=uniforms.cuda())
        return type(out)(num_accepted=out.num_accepted.cpu(), tokens=out.tokens.cpu())

    excluded, pvalue = chi_square(first_two_tokens(on_gpu, 60_000, gamma=3, seed=11, sparse_q=False))
    assert excluded == 0 and pvalue > 1e-3
