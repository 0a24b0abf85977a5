"""The sparse verifiers as one Triton kernel (on CUDA; the tests run it on a CPU under TRITON_INTERPRET=1).

A program per request (a verify step) reads its G+1 rows of entries (values and ids, in any order: the rank
order of topk_fused.run_sparse needs no sort), its draft tokens, the draft's q (point masses, or dense
[B, G, V]: read only at the draft token and at p's entries) and its G+1 coins, and writes the accepted count
and the emitted tokens. The arithmetic is harness.verify.sparse's (itself the dense verifiers'): p_i =
min((p_{i-1} * p(x_i)) / q(x_i), 1) in float32 with IEEE division, r_i the float32 sum of max(p_i p - q, 0)
over the row's entries, h_i = r_i / (r_i + 1 - p_i), the final token by inverse CDF over the entries in id
order (sorted in the program) cumulated in float64. What may differ from the torch verifiers is only the order
of the float32 additions in r_i and of the float64 ones in the CDF: a coin within rounding of a threshold.

The torch verifiers between a sparse builder and its tokens are some 60 small operations per step; this is
one launch, or none: `verify_request` is the body of a program, and topk_fused's finish calls it for a step as
soon as the step's G+1 rows are written (launch_config's VERIFY; harness.verify.sparse.verify_step), so that a
whole verify step is one launch of topk_fused's kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.verify.launch import launch_device
from harness.verify.verifiers import VerifyOutput

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: harness.verify.sparse keeps its torch verifiers
    triton = None

MAX_WIDTH = 1024  # the widest rows the kernel takes (entries per row, padded to a power of two)


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def verify_request(
        b,
        val_ptr,
        id_ptr,
        row_stride,
        width,
        draft_ptr,
        q_ptr,
        u_ptr,
        tok_ptr,
        acc_ptr,
        vocab,
        GAMMA: tl.constexpr,
        GP: tl.constexpr,
        K: tl.constexpr,
        BLOCK_VERIFY: tl.constexpr,
        DENSE_Q: tl.constexpr,
        WRITTEN_HERE: tl.constexpr,
    ):
        """Verify step (request) b: its G+1 rows of entries at val_ptr / id_ptr (row b * (G+1) + j, row_stride
        apart, `width` used of K lanes) -> the accepted count at acc_ptr + b and the G+1 tokens at tok_ptr. Entries
        written by other programs of the same launch (WRITTEN_HERE 0: topk_fused's finish, after an acquire) are
        read past the SM's L1 (.cg), as the finish reads the group maxima."""
        b = b.to(tl.int64)
        pos = tl.arange(0, GP)  # position j of the step: row b * (G+1) + j, p(. | prefix_j)
        lane = tl.arange(0, K)
        live = pos <= GAMMA
        drafted = pos < GAMMA
        inside = live[:, None] & (lane[None, :] < width)
        at = (b * (GAMMA + 1) + pos)[:, None] * row_stride + lane[None, :]
        if WRITTEN_HERE:
            p = tl.load(val_ptr + at, mask=inside, other=0.0)
            ids = tl.load(id_ptr + at, mask=inside, other=vocab).to(tl.int64)
        else:
            p = tl.load(val_ptr + at, mask=inside, other=0.0, cache_modifier=".cg")
            ids = tl.load(id_ptr + at, mask=inside, other=vocab, cache_modifier=".cg").to(tl.int64)
        d = tl.load(draft_ptr + b * GAMMA + pos, mask=drafted, other=-1).to(tl.int64)
        hit = (ids == d[:, None]) & drafted[:, None]
        p_tok = tl.sum(tl.where(hit, p, 0.0), axis=1)  # p(x_{j+1} | prefix_j); one entry at most matches
        if DENSE_Q:
            q_rows = q_ptr + (b * GAMMA + pos)[:, None] * vocab
            # ids outside [0, V) are never read: padding, and the unwritten slots of rows that run_sparse left
            # to its caller (verify_step queues this kernel before it knows them; their steps are verified again)
            q = tl.load(q_rows + ids, mask=inside & drafted[:, None] & (ids >= 0) & (ids < vocab), other=0.0)
            q_tok = tl.load(q_ptr + (b * GAMMA + pos) * vocab + d, mask=drafted, other=1.0)
        else:  # point masses at the drafts
            q = tl.where(hit, 1.0, 0.0)
            q_tok = tl.full([GP], 1.0, tl.float32)
        u = tl.load(u_ptr + b * (GAMMA + 1) + pos, mask=live, other=1.0)

        if BLOCK_VERIFY:
            p_acc = tl.where(pos == 0, 1.0, 0.0)  # p_0 .. p_G
            pa = tl.full([], 1.0, tl.float32)
            for i in tl.static_range(GAMMA):
                pt = tl.sum(tl.where(pos == i, p_tok, 0.0), axis=0)
                qt = tl.maximum(tl.sum(tl.where(pos == i, q_tok, 0.0), axis=0), 1e-30)
                pa = tl.minimum(tl.math.div_rn(pa * pt, qt), 1.0)
                p_acc = tl.where(pos == i + 1, pa, p_acc)
            r = tl.sum(tl.maximum(p_acc[:, None] * p - q, 0.0), axis=1)
            denom = r + 1.0 - p_acc
            h = tl.where(denom > 0, tl.math.div_rn(r, tl.maximum(denom, 1e-30)), 0.0)
            h = tl.where(pos == GAMMA, p_acc, h)  # h_i at position i = 1..G
            coin = tl.load(u_ptr + b * (GAMMA + 1) + pos - 1, mask=(pos >= 1) & live, other=1.0)
            stop = tl.max(tl.where((pos >= 1) & live & (coin < h), pos, 0), axis=0)
            scale = tl.sum(tl.where(pos == stop, p_acc, 0.0), axis=0)
        else:
            rejected = drafted & ~(u * q_tok < p_tok)
            stop = tl.min(tl.where(rejected, pos, GAMMA), axis=0)
            scale = tl.full([], 1.0, tl.float32)
        bonus = stop >= GAMMA
        scale = tl.where(bonus, 1.0, scale)

        # the final token: the residual max(scale * p - q, 0) at position `stop` (the bonus: p), p if empty
        here = (pos == stop)[:, None]
        p_row = tl.sum(tl.where(here, p, 0.0), axis=0)
        id_row = tl.sum(tl.where(here, ids, 0), axis=0)
        q_row = tl.sum(tl.where(here & ~bonus, q, 0.0), axis=0)
        dist = tl.maximum(scale * p_row - q_row, 0.0)
        dist = tl.where(tl.sum(dist, axis=0) <= 0, p_row, dist)
        # inverse CDF in id order: sort (id, weight) keys; padding (id V, weight 0) goes last
        key = tl.sort((id_row << 32) | (dist.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF))
        w = (key & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
        cdf = tl.cumsum(w.to(tl.float64), axis=0)
        total = tl.max(cdf, axis=0)
        u_last = tl.sum(tl.where(pos == GAMMA, u, 0.0), axis=0)
        first = tl.sum((cdf <= u_last.to(tl.float64) * total).to(tl.int32), axis=0)
        first = tl.where(first >= K, tl.max(tl.where(w > 0, lane, 0), axis=0), first)  # over: the last with mass
        token = tl.sum(tl.where(lane == first, key >> 32, 0), axis=0)

        out = tl.where(pos < stop, d, -1)
        out = tl.where(pos == stop, token, out)
        tl.store(tok_ptr + b * (GAMMA + 1) + pos, out, mask=live)
        tl.store(acc_ptr + b, stop.to(tl.int64))

    @triton.jit
    def _verify_kernel(
        val_ptr,
        id_ptr,
        row_stride,
        width,
        draft_ptr,
        q_ptr,
        u_ptr,
        tok_ptr,
        acc_ptr,
        vocab,
        GAMMA: tl.constexpr,
        GP: tl.constexpr,
        K: tl.constexpr,
        BLOCK_VERIFY: tl.constexpr,
        DENSE_Q: tl.constexpr,
    ):
        """Program b: verify_request of step b."""
        verify_request(
            tl.program_id(0),
            val_ptr,
            id_ptr,
            row_stride,
            width,
            draft_ptr,
            q_ptr,
            u_ptr,
            tok_ptr,
            acc_ptr,
            vocab,
            GAMMA,
            GP,
            K,
            BLOCK_VERIFY,
            DENSE_Q,
            True,
        )


def verify_entries(
    values: Tensor,
    ids: Tensor,
    vocab: int,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    uniforms: Tensor,
    block: bool,
) -> VerifyOutput:
    """Block (or token-wise) verification of steps whose target is given as entries: values [B, G+1, W]
    fp32 and ids [B, G+1, W] (int32 or int64; id `vocab` with value 0 is padding; any order along W; a step
    whose entries hold garbage gets a garbage answer but no read outside q),
    draft_tokens [B, G] int64, draft_probs [B, G, V] fp32 or None (point masses), uniforms [B, G+1] fp32.
    One launch; nothing waits for it."""
    bsz, gamma = draft_tokens.shape
    width = values.shape[-1]
    if width > MAX_WIDTH:
        raise ValueError(f"rows of {width} entries: the kernel takes at most {MAX_WIDTH}")
    values = values.reshape(bsz * (gamma + 1), width).contiguous()
    ids = ids.reshape(bsz * (gamma + 1), width).contiguous()
    tokens = torch.empty(bsz, gamma + 1, dtype=torch.int64, device=values.device)
    accepted = torch.empty(bsz, dtype=torch.int64, device=values.device)
    if bsz == 0:
        return VerifyOutput(num_accepted=accepted, tokens=tokens)
    q = draft_probs.float().contiguous() if draft_probs is not None else values  # values: an unused pointer
    k = max(16, triton.next_power_of_2(width))
    gp = max(2, triton.next_power_of_2(gamma + 1))

    with launch_device(values.device):
        _verify_kernel[(bsz,)](
            values,
            ids,
            width,
            width,
            draft_tokens.contiguous(),
            q,
            uniforms.float().contiguous(),
            tokens,
            accepted,
            vocab,
            GAMMA=gamma,
            GP=gp,
            K=k,
            BLOCK_VERIFY=block,
            DENSE_Q=draft_probs is not None,
            num_warps=4 if k <= 128 else 8,
        )
    return VerifyOutput(num_accepted=accepted, tokens=tokens)
