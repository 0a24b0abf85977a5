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
            SparseProbs(values, ids.long(), 16), drafts, None, uniforms=u
        )
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
    ids[1] = torch.tensor([-7, -(2**31), 10**6, -(10**9)]).repeat(ids.shape[-1] // 4 + 1)[: ids.shape[-1]]
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


def step_case(bsz: int = 4, gamma: int = 3, vocab: int = 2048, seed: int = 5):
    """verify_step's inputs over `vocab` ids: iid rows, one greedy, rows the kernels leave (top_k 65, the whole
    vocabulary), top_k 5; drafts at the argmax but one; coins; a dense q."""
    rows = bsz * (gamma + 1)
    logits = make_family("iid", rows, vocab, seed=seed, device=torch.device("cpu"))
    t, k, p = torch.ones(rows), torch.full((rows,), 20), torch.full((rows,), 0.95)
    t[2], k[6], k[9], k[13] = 0.0, 65, -1, 5
    drafts = logits.view(bsz, gamma + 1, vocab)[:, :gamma].argmax(dim=-1)
    drafts[1, 1] = 7
    g = torch.Generator().manual_seed(4)
    u = torch.rand(bsz, gamma + 1, generator=g)
    q = torch.softmax(logits.view(bsz, gamma + 1, vocab)[:, :gamma] + torch.randn(bsz, gamma, vocab, generator=g), -1)
    return logits, t, k, p, drafts, u, q


@pytest.mark.interpreter
def test_the_step_verified_inside_the_finish_is_the_verify_kernels():
    """VERIFY: the last finished row of each step verifies the step (no verify kernel), in one kernel (FUSE) or
    after the pass, in slices (CHUNKS, HALVING): the verify kernel's tokens for every step whose rows the kernels
    took (the others have tokens from unwritten entries until verify_step verifies them again), and verify_step's
    tokens for all, both methods, point masses and a dense q."""
    interpreter_or_skip()
    from harness.verify import sparse_kernel, topk_fused  # noqa: PLC0415

    logits, t, k, p, drafts, u, q = step_case()
    taken = torch.tensor([True, False, False, True])  # steps 1 and 2 hold rows 6 and 9 (left to the caller)
    for block, q_arg in ((False, None), (True, None), (True, q)):
        want = sp._fused_step(logits, t, k, p, drafts, q_arg, u, block, config={"VERIFY": 0})
        values, ids, _ = topk_fused.run_sparse(logits, t, k, p)
        kernel = sparse_kernel.verify_entries(values.view(4, 4, -1), ids.view(4, 4, -1), 2048, drafts, q_arg, u, block)
        for config in (
            {"VERIFY": 1},
            {"VERIFY": 1, "FUSE": 1},
            {"VERIFY": 1, "CHUNKS": 3, "HALVING": 1},
            {"VERIFY": 1, "CHUNKS": 2, "REPLACE": 1},
        ):
            step = topk_fused.Step(drafts, q_arg, u, block)
            _, _, inside, left = topk_fused.queue_step(logits, t, k, p, step, config)
            assert left() is not None and left().tolist() == [6, 9]
            assert inside.tokens[taken].tolist() == kernel.tokens[taken].tolist(), (block, config)
            assert inside.num_accepted[taken].tolist() == kernel.num_accepted[taken].tolist(), (block, config)
            got = sp._fused_step(logits, t, k, p, drafts, q_arg, u, block, config=config)
            assert got.tokens.tolist() == want.tokens.tolist(), (block, config)


@pytest.mark.interpreter
def test_a_host_bound_on_top_k_queues_the_step_without_a_synchronisation():
    """max_top_k (SGLang's sampling_info.max_top_k): at most FAST_K, the kernels take every row, so the step
    queues a device-side check instead of reading the rows left (the same tokens); a bound that a row's top_k
    breaks (a row left: top_k 65) fails that check (at once on a CPU; on a GPU the device-side assert stops the
    process); a bound below 1 is refused; one past FAST_K takes the synchronisation as without a bound."""
    interpreter_or_skip()
    logits, t, k, p, drafts, u, _ = step_case()
    k = torch.where((k > 20) | (k < 1), 20, k)  # every row top_k <= 20
    want = sp._fused_step(logits, t, k, p, drafts, None, u, True)
    for config in ({"VERIFY": 0}, {"VERIFY": 1}, {"VERIFY": 1, "FUSE": 1}):
        got = sp._fused_step(logits, t, k, p, drafts, None, u, True, max_top_k=20, config=config)
        assert got.tokens.tolist() == want.tokens.tolist(), config
    broken = k.clone()
    broken[6] = 65
    with pytest.raises(RuntimeError):
        sp._fused_step(logits, t, broken, p, drafts, None, u, True, max_top_k=20)
    assert sp._fused_step(logits, t, broken, p, drafts, None, u, True, max_top_k=65).tokens.shape == (4, 4)
    with pytest.raises(ValueError, match="max_top_k 0"):
        sp.verify_step(logits, t, k, p, drafts, None, block=True, fused=True, uniforms=u, max_top_k=0)


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
        sp.verify_step(logits, t, k, p, drafts, torch.rand(2, 4, 32), block=True, fused=True, uniforms=torch.rand(2, 5))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("family", ["iid", "sorted", "bf16", "padding", "lm_like"])
def test_the_fused_step_on_a_gpu(family):
    """At the seed's vocabulary, 512 steps of gamma 7: verify_step's kernel path gives the tokens of topk_fused's
    entries verified by the torch sparse verifier (but coins within float32 rounding of h_i: none expected), with
    the verify kernel or inside the finish, with the synchronisation or the host's bound on top_k."""
    bsz, gamma, vocab = 512, 7, 248_320
    rows = bsz * (gamma + 1)
    logits = make_family(family, rows, vocab, seed=6, device=torch.device("cuda"))
    t, k, p = (
        torch.ones(rows, device="cuda"),
        torch.full((rows,), 20, device="cuda"),
        torch.full((rows,), 0.95, device="cuda"),
    )
    drafts = logits.view(bsz, gamma + 1, vocab)[:, :gamma].argmax(dim=-1)
    u = torch.rand(bsz, gamma + 1, generator=torch.Generator().manual_seed(4)).cuda()
    entries = sp.fused_sparse_probs(logits, t, k, p)
    target = SparseProbs(entries.values.view(bsz, gamma + 1, -1), entries.ids.view(bsz, gamma + 1, -1), vocab)
    configs = (
        {"VERIFY": 0},
        {"VERIFY": 1},
        {"VERIFY": 1, "FUSE": 1},
        {"VERIFY": 1, "CHUNKS": 4, "HALVING": 1, "REPLACE": 1, "SUPER": 8},
    )
    for block in (False, True):
        want = (sp.verify_block_sparse if block else sp.verify_tokenwise_sparse)(target, drafts, None, uniforms=u)
        got = sp.verify_step(logits, t, k, p, drafts, None, block=block, fused=True, uniforms=u)
        assert int(same_outputs(got, want).sum()) == 0
        for config in configs:  # the verification inside the finish, one kernel or slices; the host's bound
            for bound in (None, 20):
                got = sp.verify_step(
                    logits, t, k, p, drafts, None, block=block, fused=True, uniforms=u, max_top_k=bound, config=config
                )
                assert int(same_outputs(got, want).sum()) == 0, (block, config, bound)


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
