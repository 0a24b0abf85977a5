"""`topk_fused`, the kernels: a verify-probability builder that reads each row of logits once and writes the
dense output once (Triton, on CUDA). harness.verify.topk_fused_probs is the builder around it.

Three kernels, each spread over the whole GPU (no program ever owns a whole row's pass: a row is 1 MB at the
seed's sizes, and one program streams it at a few GB/s):
1. start, a program per row: the row's parameters as the kernels use them (greedy rows: k 1), and its
   threshold t, the r-th largest distinct value of the row's samples: at most SAMPLES logits and at most
   1 / SAMPLE_SHARE of the row (a small vocabulary samples fewer), in runs of CHUNK contiguous logits, one in
   the middle of each of many evenly spaced stretches (never at the row's ends, where sorted rows and a
   tokenizer's frequent tokens keep their largest logits); r chosen per top_k so that both ways of missing
   are rare on i.i.d. rows (best_rank: the smallest r that keeps the first rare enough, launch_config's RANK_RULE).
2. pass, a program per BLOCK of a row (the copy-like part, near the bandwidth limit): the block of the output
   is written with zeros; a block with at most k logits above t appends the index of each to the row's
   candidate list (an atomic slot each), a crowded block only its own k largest (value, then lowest index),
   since a row's k largest are among its blocks' k largest: a row whose large logits crowd into a few id
   ranges (a script's tokens, a topic's, a sorted row) takes a few blocks' worth of its list, not all of it.
   With few blocks per row (a small vocabulary) the programs that run side by side take other rows, so that
   their atomics hit other counters. The per-lane atomics cost even where no lane is above t: the sparse mode
   (no zeros to write, so the pass is no longer bound by the copy) skips them behind a scalar test of the
   block's count (launch_config's SPARSE_APPEND; measured on an H200: run_sparse 1.71-1.89 -> 1.27-1.58 ms at
   4096 x 248,320, results/published/verify-step-h200-sparse/tune_append.log).
3. finish, a program per row: when the list holds every candidate (at most CANDIDATES) and at least k
   logits are >= t, the row's k largest logits are among the candidates, plus, when fewer than k are above
   t, the first ties with t by index (looked for in the row's first TIE_SPAN logits: an all-equal row finds
   them in its first block). The candidates are ranked (value descending, then index ascending) by
   repeated maximum, divided by the temperature, softmaxed, top-p renormalised with the threshold rule of
   harness.verify.top_p_renorm_sorted, and written over the zeros.
A row whose threshold missed (more candidates than the list holds, or fewer than k logits at or above t, or
ties past TIE_SPAN) gets another rank (halved when too many; when too few, doubled and at least k + 1, which
cannot miss that way: k + 1 distinct samples above t are k logits above it; then bisected between the
ranks already tried) and its new threshold in the finish kernel, and joins the next round's work list
(every row may); rounds 2 to ROUNDS run the pass (reading only) and the finish over that list alone. Rows
still missed, and rows with k above FAST_K or covering the vocabulary, are built by the caller
(harness.verify.fused_build: topk_first); only those. The launches are queued without waiting; one
synchronisation at the end reads the count of rows left.

`run_sparse` runs the same kernels with a sparse output (harness.verify.sparse.fused_sparse_probs): the pass
writes no zeros and the finish writes each row's k probabilities and int32 ids by rank ([rows, FAST_K] each);
`queue_sparse` is run_sparse without the synchronisation (harness.verify.sparse.verify_step queues the verify
kernel behind it first).

Temporary memory: CANDIDATES int32 indices, 36 bytes of fields and ROUNDS retry slots (4 bytes each) per
row: 2,096 bytes a row (8.2 MiB at 4,096 rows).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from harness.verify.rows import GREEDY_TEMPERATURE  # a temperature below it (or top_k 1) is a greedy row

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the name stays usable through the topk_first path
    triton = None

SAMPLES = 8192  # logits sampled per row for the threshold at most: runs of CHUNK contiguous logits
CHUNK = 16  # contiguous logits per sampled place (64 bytes of fp32, two sectors): many places, spread evenly
FAST_K = 64  # the largest top_k the kernels handle; larger rows take the topk_first path
CANDIDATES = 512  # per row: indices of the logits above the threshold
FAIL_BOUND = 0.002  # best_rank's rule 1: the most often a first threshold may leave fewer than k logits >= t
ROUNDS = 3  # thresholds tried per row before it is left to the caller (at most 7: the start kernel zeroes
# ROUNDS + 1 counters with one 8-lane store)
REDO = 1 << 30  # the most rows a retry round takes (every row: a missed row is retried, whatever its batch)
TIE_BLOCK = 1024  # the finish kernel looks for ties with t in blocks of this many logits,
TIE_SPAN = 4 * TIE_BLOCK  # in the row's first TIE_SPAN logits
PIECE = 1024  # a retry's threshold reads the samples in pieces of this many (few registers)

# The workspace (one int32 tensor): these per-row fields, [rows] each (fp32 ones through a float view), then
# CANDIDATES indices per row, then ROUNDS retry lists of REDO rows, then ROUNDS + 1 counters. status: 0 working,
# 1 written, 2 left to the caller (missed), 3 not taken.
FIELDS = ("k", "temperature", "top_p", "t", "count", "status", "rank", "lo", "hi")


def _poisson_cdf(m: int, lam: float) -> float:
    """P(X <= m), X ~ Poisson(lam)."""
    term = total = math.exp(-lam)
    for i in range(1, m + 1):
        term *= lam / i
        total += term
    return total


def best_rank(k: int, vocab: int, samples: int, rule: int) -> int:
    """The rank r (1 = largest) of the sampled logit used as threshold t for a row's top-k. The row fails
    when t is among its k-1 largest logits (r or more samples there: fewer than k logits >= t) and
    overflows when more than CANDIDATES logits exceed t (fewer than r samples among its CANDIDATES largest);
    with samples spread over the row, the samples that land among a row's m largest logits are about
    Poisson(m x samples / vocab). Rule 0 (balance): r balances the two (at the seed's sizes: both under 0.05%
    for k <= 20, under 0.6% up to k = 64), also where both are negligible, at the price of candidates (167 a
    row at 151,936 ids for k 20). Rule 1 (bound): the smallest r whose chance of failing is at most FAIL_BOUND
    (fewer candidates, each costing the pass and the finish kernel), unless it would then overflow more often
    than that (then rule 0)."""
    lam_fail, lam_over = (k - 1) * samples / vocab, CANDIDATES * samples / vocab
    fail = {r: 1 - _poisson_cdf(r - 1, lam_fail) for r in range(1, 64)}
    over = {r: _poisson_cdf(r - 1, lam_over) for r in range(1, 64)}
    if rule == 1:
        bound = next((r for r in fail if fail[r] <= FAIL_BOUND), None)
        if bound is not None and over[bound] <= FAIL_BOUND:
            return bound
    return min(fail, key=lambda r: max(fail[r], over[r]))


@functools.lru_cache(maxsize=64)
def rank_table(vocab: int, samples: int, device: str, rule: int) -> Tensor:
    """best_rank for every k in 0..FAST_K (index k), int32 on `device`: looked up per row without a sync."""
    ranks = [1] + [best_rank(k, vocab, samples, rule) for k in range(1, FAST_K + 1)]
    return torch.tensor(ranks, dtype=torch.int32, device=device)


if triton is not None:
    _K, _TAU, _TOP_P, _T, _COUNT, _STATUS, _RANK, _LO, _HI = (tl.constexpr(i) for i in range(len(FIELDS)))
    _FIELDS = tl.constexpr(len(FIELDS))

    @triton.jit
    def _key(v, idx):
        """(value, index) -> int64, ordered by value, then by index descending (so that, sorted descending,
        equal values come lowest index first)."""
        b = v.to(tl.int32, bitcast=True)
        ordered = tl.where(b >= 0, b, b ^ 0x7FFFFFFF)  # an int32 whose order is the float order
        return (ordered.to(tl.int64) << 32) + (0xFFFFFFFF - idx.to(tl.int64))

    @triton.jit
    def _unkey(key):
        ordered = (key >> 32).to(tl.int32)
        b = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
        idx = (0xFFFFFFFF - (key & 0xFFFFFFFF)).to(tl.int32)
        return b.to(tl.float32, bitcast=True), idx

    @triton.jit
    def _sample_at(j, stride, CHUNK: tl.constexpr):
        """Where sample j is read: runs of CHUNK contiguous logits, one in the middle of each stretch of
        `stride` logits (never at the row's very ends, where sorted rows and a tokenizer's frequent tokens
        keep the largest logits)."""
        return (j // CHUNK) * stride + (stride - CHUNK) // 2 + j % CHUNK

    @triton.jit
    def _threshold(src, vocab, rank, SAMPLES: tl.constexpr, CHUNK: tl.constexpr, PIECE: tl.constexpr):
        """The rank-th largest distinct value of the row's samples (_sample_at), by repeated maximum; a row
        with fewer distinct values keeps its smallest one (an all-equal row: its one value). A rank of SAMPLES
        or more (a tiny row) gives -inf: every logit is a candidate. PIECE == SAMPLES holds the samples in
        registers; less reads them in pieces at each step (few registers, the pieces in cache after the
        first step)."""
        stride = vocab // (SAMPLES // CHUNK)
        t = tl.full([], float("inf"), tl.float32)
        if rank >= SAMPLES:
            t = tl.full([], float("-inf"), tl.float32)
        elif PIECE == SAMPLES:
            j = tl.arange(0, SAMPLES)
            s = tl.load(src + _sample_at(j, stride, CHUNK)).to(tl.float32)
            for _ in range(rank):
                best = tl.max(tl.where(s < t, s, float("-inf")), axis=0)
                t = tl.where(best > float("-inf"), best, t)
        else:
            for _ in range(rank):
                best = tl.full([], float("-inf"), tl.float32)
                for first in range(0, SAMPLES, PIECE):
                    j = first + tl.arange(0, PIECE)
                    s = tl.load(src + _sample_at(j, stride, CHUNK)).to(tl.float32)
                    best = tl.maximum(best, tl.max(tl.where(s < t, s, float("-inf")), axis=0))
                t = tl.where(best > float("-inf"), best, t)
        return t

    @triton.jit
    def _start_kernel(logits_ptr, stride_row, temp_ptr, top_k_ptr, top_p_ptr, table_ptr, ws, wsf, n_rows, vocab,
                      first_rank, redo, GREEDY: tl.constexpr, FAST_K: tl.constexpr, CANDIDATES: tl.constexpr,
                      ROUNDS: tl.constexpr, SAMPLES: tl.constexpr, CHUNK: tl.constexpr):
        """Program `row`: the row's parameters as the kernels use them (greedy rows: k 1, temperature 1; a
        top_k <= 0 or >= the vocabulary: the whole vocabulary), its first threshold and an empty candidate
        list. A row not taken (k above FAST_K, or the whole vocabulary) gets t = +inf (the pass appends
        nothing) and status 3."""
        row = tl.program_id(0)
        if row == 0:  # the counters start at 0 (read by the finish kernels, which run after this one)
            lanes = tl.arange(0, 8)
            tl.store(_counters(ws, n_rows, CANDIDATES, redo, ROUNDS) + lanes, 0, mask=lanes <= ROUNDS)
        temp = tl.load(temp_ptr + row).to(tl.float32)
        top_k = tl.load(top_k_ptr + row).to(tl.int64)
        greedy = (temp < GREEDY) | (top_k == 1)
        k = tl.where(greedy, 1, tl.where((top_k <= 0) | (top_k >= vocab), vocab, top_k))
        taken = (k <= FAST_K) & (k < vocab)
        tl.store(ws + _K * n_rows + row, tl.where(taken, k, 0).to(tl.int32))
        tl.store(wsf + _TAU * n_rows + row, tl.where(greedy, 1.0, temp))
        tl.store(wsf + _TOP_P * n_rows + row, tl.load(top_p_ptr + row).to(tl.float32))
        tl.store(ws + _COUNT * n_rows + row, 0)
        tl.store(ws + _LO * n_rows + row, 0)
        tl.store(ws + _HI * n_rows + row, 0)
        if taken:
            rank = tl.where(first_rank > 0, first_rank, tl.load(table_ptr + k)).to(tl.int32)
            tl.store(ws + _RANK * n_rows + row, rank)
            src = logits_ptr + tl.cast(row, tl.int64) * stride_row
            tl.store(wsf + _T * n_rows + row, _threshold(src, vocab, rank, SAMPLES, CHUNK, SAMPLES))
            tl.store(ws + _STATUS * n_rows + row, 0)
        else:
            tl.store(wsf + _T * n_rows + row, float("inf"))
            tl.store(ws + _STATUS * n_rows + row, 3)

    @triton.jit
    def _lists(ws, n_rows, CANDIDATES: tl.constexpr):
        """The workspace's retry lists (ROUNDS of redo rows), after the fields and the candidates."""
        return ws + (_FIELDS + CANDIDATES) * n_rows

    @triton.jit
    def _counters(ws, n_rows, CANDIDATES: tl.constexpr, redo, ROUNDS: tl.constexpr):
        """The workspace's counters: the length of each round's retry list, then the rows left to the caller."""
        return _lists(ws, n_rows, CANDIDATES) + ROUNDS * redo

    @triton.jit
    def _work(ws, n_rows, slot, ROUND: tl.constexpr, CANDIDATES: tl.constexpr, redo):
        """Row `slot` of round ROUND's work: every row in the first round, the retry list after."""
        if ROUND == 0:
            row = slot
        else:
            row = tl.load(_lists(ws, n_rows, CANDIDATES) + (ROUND - 1) * redo + slot)
        return row

    @triton.jit
    def _work_count(ws, n_rows, ROUND: tl.constexpr, CANDIDATES: tl.constexpr, redo,
                    ROUNDS: tl.constexpr):
        if ROUND == 0:
            n = n_rows
        else:
            n = tl.minimum(tl.load(_counters(ws, n_rows, CANDIDATES, redo, ROUNDS) + ROUND - 1), redo)
        return n

    @triton.jit
    def _scan_block(x, offs, row, ws, wsf, n_rows, lanes, CANDIDATES: tl.constexpr, APPEND: tl.constexpr):
        """The block's logits x (at offs) above the row's t go to its candidate list. A block with at most k
        of them appends each (APPEND, launch_config's DENSE_APPEND / SPARSE_APPEND: 0 an atomic slot each,
        1 the same unless none, 2 one atomic for the block); a block with more appends only its own k largest (value, then lowest index; by repeated maximum), since a row's k
        largest are among its blocks' k largest: a row whose large logits crowd into a few id ranges (a
        script's tokens, a sorted row) fills its list with a few blocks' worth of them, not with all of them."""
        t = tl.load(wsf + _T * n_rows + row)
        k = tl.load(ws + _K * n_rows + row)
        gt = x > t
        cand = ws + _FIELDS * n_rows + tl.cast(row, tl.int64) * CANDIDATES
        count = ws + _COUNT * n_rows + row
        n_gt = tl.sum(gt.to(tl.int32), axis=0)
        if APPEND > 0 and n_gt == 0:  # nothing to append: no per-lane atomics to issue
            pass
        elif (APPEND == 2) & (n_gt <= k):  # one atomic for the block, its n_gt indices by repeated minimum
            base = tl.atomic_add(count, n_gt, sem="relaxed")
            prev = tl.full([], -1, tl.int32)
            for i in range(n_gt):
                prev = tl.min(tl.where(gt & (offs > prev), offs, 2**31 - 1), axis=0)
                if base + i < CANDIDATES:
                    tl.store(cand + base + i, prev)
        elif n_gt <= k:  # an atomic slot per logit above t
            pos = tl.atomic_add(count + lanes * 0, 1, mask=gt, sem="relaxed")
            tl.store(cand + pos, offs, mask=gt & (pos < CANDIDATES))
        else:  # a crowded block: its k largest only
            base = tl.atomic_add(count, k, sem="relaxed")
            keys = tl.where(gt, _key(x, offs), -(2**63))
            prev = tl.full([], 2**63 - 1, tl.int64)
            for i in range(k):
                m = tl.max(tl.where(keys < prev, keys, -(2**63)), axis=0)
                at = base + i
                if at < CANDIDATES:
                    tl.store(cand + at, (0xFFFFFFFF - (m & 0xFFFFFFFF)).to(tl.int32))
                prev = m

    @triton.jit
    def _place(item, n, blocks, INTERLEAVE: tl.constexpr):
        """Work item -> (slot, block): with INTERLEAVE, programs running side by side work on other rows, so
        that their atomics hit other counters (few blocks per row: a small vocabulary)."""
        if INTERLEAVE:
            slot, block = item % n, item // n
        else:
            slot, block = item // blocks, item % blocks
        return slot, block

    @triton.jit
    def _pass_item(logits_ptr, stride_row, out_ptr, ws, wsf, n_rows, vocab, item, n, blocks, lanes,
                   ROUND: tl.constexpr, CANDIDATES: tl.constexpr, redo, BLOCK: tl.constexpr,
                   INTERLEAVE: tl.constexpr, ZEROS: tl.constexpr, APPEND: tl.constexpr):
        """One block of one row: in the first round zeros over the output block (every row: those left to the
        caller are overwritten by it); then _scan_block. The zeros and the logits do not wait for t."""
        slot, block = _place(item, n, blocks, INTERLEAVE)
        row = _work(ws, n_rows, slot, ROUND, CANDIDATES, redo)
        offs = block * BLOCK + lanes
        inside = offs < vocab
        if ROUND == 0:
            if ZEROS:  # the dense output; the sparse one (run_sparse) has no zeros to write
                tl.store(out_ptr + tl.cast(row, tl.int64) * vocab + offs, tl.zeros([BLOCK], tl.float32),
                         mask=inside)
        x = tl.load(logits_ptr + tl.cast(row, tl.int64) * stride_row + offs, mask=inside,
                    other=float("-inf")).to(tl.float32)
        _scan_block(x, offs, row, ws, wsf, n_rows, lanes, CANDIDATES, APPEND)

    @triton.jit
    def _pass_kernel(logits_ptr, stride_row, out_ptr, ws, wsf, n_rows, vocab, ROUND: tl.constexpr,
                     CANDIDATES: tl.constexpr, redo, ROUNDS: tl.constexpr, BLOCK: tl.constexpr,
                     INTERLEAVE: tl.constexpr, ZEROS: tl.constexpr, APPEND: tl.constexpr, LOOP: tl.constexpr):
        """Blocks of rows (_pass_item): in the first round without LOOP, the block of the program's id (a
        program per block: no loop for Triton to pipeline); else one per step of each program."""
        blocks = tl.cdiv(vocab, BLOCK)
        n = _work_count(ws, n_rows, ROUND, CANDIDATES, redo, ROUNDS)
        lanes = tl.arange(0, BLOCK)
        if (ROUND == 0) & (not LOOP):
            _pass_item(logits_ptr, stride_row, out_ptr, ws, wsf, n_rows, vocab, tl.program_id(0), n, blocks, lanes,
                       ROUND, CANDIDATES, redo, BLOCK, INTERLEAVE, ZEROS, APPEND)
        else:
            for item in range(tl.program_id(0), n * blocks, tl.num_programs(0)):
                _pass_item(logits_ptr, stride_row, out_ptr, ws, wsf, n_rows, vocab, item, n, blocks, lanes,
                           ROUND, CANDIDATES, redo, BLOCK, INTERLEAVE, ZEROS, APPEND)

    @triton.jit
    def _write_probs(keys, k, temperature, top_p, dst, dst_ids, vocab, FAST_K: tl.constexpr, SPARSE: tl.constexpr):
        """Candidate keys (distinct: the index is part of each; empty slots the smallest int64) -> the row's
        k probabilities: the k largest by repeated maximum, then temperature, softmax, top-p; stored at their
        ids of the dense row `dst`, or (SPARSE) as FAST_K values at dst and ids at dst_ids, by rank (ranks
        k and above: value 0, id `vocab`)."""
        ranks = tl.arange(0, FAST_K)
        top = tl.full([FAST_K], -(2**63), tl.int64)
        prev = tl.full([], 2**63 - 1, tl.int64)
        for i in range(k):
            m = tl.max(tl.where(keys < prev, keys, -(2**63)), axis=0)
            top = tl.where(ranks == i, m, top)
            prev = m
        vals, idx = _unkey(top)
        kept = ranks < k
        vals = tl.where(kept, vals / temperature, float("-inf"))
        e = tl.where(kept, tl.exp(vals - tl.max(vals, axis=0)), 0.0)
        p = e / tl.sum(e, axis=0)
        if top_p < 1.0:
            below = (tl.cumsum(p, axis=0) - p < top_p) & kept
            cut = tl.min(tl.where(below, p, float("inf")), axis=0)
            p = tl.where(kept & (p >= cut), p, 0.0)
            p = p / tl.sum(p, axis=0)
        if SPARSE:
            tl.store(dst + ranks, tl.where(kept, p, 0.0))
            tl.store(dst_ids + ranks, tl.where(kept, idx, vocab))
        else:
            tl.store(dst + idx, p, mask=kept)

    @triton.jit
    def _select(cand, src, n_cand, k, temperature, top_p, dst, dst_ids, vocab, WIDTH: tl.constexpr,
                FAST_K: tl.constexpr, SPARSE: tl.constexpr):
        """The row's n_cand (<= WIDTH) candidates as keys, read at once; their k largest written as
        probabilities."""
        j = tl.arange(0, WIDTH)
        used = j < n_cand
        idx = tl.load(cand + j, mask=used, other=0)
        x = tl.load(src + idx, mask=used, other=0.0).to(tl.float32)
        _write_probs(tl.where(used, _key(x, idx), -(2**63)), k, temperature, top_p, dst, dst_ids, vocab, FAST_K,
                     SPARSE)

    @triton.jit
    def _finish_kernel(logits_ptr, stride_row, out_ptr, ids_ptr, ws, wsf, n_rows, vocab, ROUND: tl.constexpr,
                       LAST: tl.constexpr, SAMPLES: tl.constexpr, CHUNK: tl.constexpr, PIECE: tl.constexpr,
                       CANDIDATES: tl.constexpr, NARROW: tl.constexpr, FAST_K: tl.constexpr, redo,
                       ROUNDS: tl.constexpr, TIE_BLOCK: tl.constexpr, TIE_SPAN: tl.constexpr,
                       SPARSE: tl.constexpr):
        """Rows of round ROUND, one per step of each program: the row's probabilities from its candidates
        (status 1); or another rank, its threshold and a place on the next round's list (status 0); or, past
        the last round, the list's room or the ranks left to try, status 2 (the caller's). Counts the rows
        left to the caller."""
        counters = _counters(ws, n_rows, CANDIDATES, redo, ROUNDS)
        n = _work_count(ws, n_rows, ROUND, CANDIDATES, redo, ROUNDS)
        for slot in range(tl.program_id(0), n, tl.num_programs(0)):
            row = _work(ws, n_rows, slot, ROUND, CANDIDATES, redo)
            status = tl.load(ws + _STATUS * n_rows + row)
            if ROUND == 0:
                if status == 3:  # not taken: left to the caller
                    tl.atomic_add(counters + ROUNDS, 1)
            if status == 0:
                src = logits_ptr + tl.cast(row, tl.int64) * stride_row
                cand = ws + _FIELDS * n_rows + tl.cast(row, tl.int64) * CANDIDATES
                k = tl.load(ws + _K * n_rows + row)
                t = tl.load(wsf + _T * n_rows + row)
                n_gt = tl.load(ws + _COUNT * n_rows + row)
                need = tl.maximum(k - n_gt, 0)
                found = tl.full([], 0, tl.int32)
                if n_gt <= CANDIDATES:
                    # ties with t, when fewer than k logits are above it: the first ones by index, appended
                    # after the candidates (an all-equal row finds them in its first block)
                    start = 0
                    while (found < need) & (start < TIE_SPAN) & (start < vocab):
                        offs = start + tl.arange(0, TIE_BLOCK)
                        x = tl.load(src + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
                        eq = (x == t) & (offs < vocab)
                        pos = found + tl.cumsum(eq.to(tl.int32), axis=0) - 1
                        tl.store(cand + n_gt + pos, offs, mask=eq & (pos < need))
                        found += tl.sum(eq.to(tl.int32), axis=0)
                        start += TIE_BLOCK
                if (n_gt <= CANDIDATES) & (found >= need):
                    dst = out_ptr + tl.cast(row, tl.int64) * (FAST_K if SPARSE else vocab)
                    dst_ids = ids_ptr + tl.cast(row, tl.int64) * FAST_K
                    temperature = tl.load(wsf + _TAU * n_rows + row)
                    top_p = tl.load(wsf + _TOP_P * n_rows + row)
                    if n_gt + need <= NARROW:  # the usual case
                        _select(cand, src, n_gt + need, k, temperature, top_p, dst, dst_ids, vocab, NARROW, FAST_K,
                                SPARSE)
                    else:
                        _select(cand, src, n_gt + need, k, temperature, top_p, dst, dst_ids, vocab, CANDIDATES,
                                FAST_K, SPARSE)
                    tl.store(ws + _STATUS * n_rows + row, 1)
                else:
                    # missed: a higher rank (lower t) when too few logits were >= t: at least k + 1, since k + 1
                    # distinct samples above t mean k logits above it, whatever the row; a lower one when the
                    # list overflowed; bracketed by the ranks already tried (lo: too few, hi: too many)
                    over = n_gt > CANDIDATES
                    rank = tl.load(ws + _RANK * n_rows + row)
                    lo = tl.load(ws + _LO * n_rows + row)
                    hi = tl.load(ws + _HI * n_rows + row)
                    lo = tl.where(over, lo, rank)
                    hi = tl.where(over, rank, hi)
                    guess = tl.where(over, rank // 2, tl.minimum(tl.maximum(rank * 2, k + 1), SAMPLES))
                    rank = tl.where((lo > 0) & (hi > 0), (lo + hi) // 2, guess)
                    stuck = (rank <= lo) | ((hi > 0) & (rank >= hi)) | (rank < 1) | (~over & (lo >= SAMPLES))
                    place = redo
                    if not LAST:
                        if not stuck:
                            place = tl.atomic_add(counters + ROUND, 1)
                    if place < redo:
                        tl.store(ws + _RANK * n_rows + row, rank)
                        tl.store(ws + _LO * n_rows + row, lo)
                        tl.store(ws + _HI * n_rows + row, hi)
                        tl.store(wsf + _T * n_rows + row, _threshold(src, vocab, rank, SAMPLES, CHUNK, PIECE))
                        tl.store(ws + _COUNT * n_rows + row, 0)
                        tl.store(_lists(ws, n_rows, CANDIDATES) + ROUND * redo + place, row)
                    else:
                        tl.store(ws + _STATUS * n_rows + row, 2)
                        tl.atomic_add(counters + ROUNDS, 1)


def available() -> bool:
    return triton is not None


WIDE_VOCAB = 100_000  # launch_config: the sparse mode's wide blocks from this many ids
SAMPLE_SHARE = 8  # a row's samples are at most 1 / SAMPLE_SHARE of it (a small vocabulary samples fewer)
RUNS = 16  # at least this many places are sampled (runs of up to CHUNK contiguous logits)


def samples_for(vocab: int, share: int = SAMPLE_SHARE, most: int = SAMPLES) -> int:
    """`most` samples (SAMPLES), or fewer for a small vocabulary: a power of two, at most 1 / share of the row
    (one logit for a tiny vocabulary): the fixed per-row work shrinks with the row."""
    s = most
    while s > 1 and s * share > vocab:
        s //= 2
    return s


def run_length(samples: int, chunk: int = CHUNK) -> int:
    """Contiguous logits per sampled place: CHUNK, fewer when that would leave fewer than RUNS places."""
    return max(1, min(chunk, samples // RUNS))


@functools.lru_cache(maxsize=8)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_config(vocab: int = 0, sparse: bool = False) -> dict[str, int]:
    """Block sizes and warps of the kernels, and the sampling layout (measured on an H200): the pass takes
    blocks of PASS_BLOCK logits, the start kernel holds a row's samples (at most 1 / SAMPLE_SHARE of the row,
    runs of up to CHUNK) in registers, the finish kernel ranks NARROW keys (CANDIDATES when more).
    FIRST_RANK > 0 makes the first threshold the sample of that rank instead of rank_table's (tests: a first
    threshold that misses, on purpose). DENSE_APPEND / SPARSE_APPEND, how a block appends its logits above t
    (the dense and the sparse mode): 0 an atomic slot per logit (the per-lane atomics are issued for every
    block), 1 the same behind a scalar test that skips blocks with none, 2 that test, then one atomic per
    block and its indices by repeated minimum. PASS_LOOP 0: the first round's pass has one block per program and
    no loop; 1: the loop of the retry rounds (a program per block all the same). PASS_STAGES: Triton's
    num_stages for the pass (its software pipelining of loads in loops). PIECE: a missed row's next threshold
    reads its samples in pieces of this many in the finish kernel (PIECE = SAMPLES: all at once).
    The sparse mode (run_sparse) of a vocabulary of WIDE_VOCAB ids or more reads 2,048-logit blocks and appends
    by repeated minimum (SPARSE_APPEND 2): on an H200, 4096 rows, 6 synthetic families, that took the builder
    from 1.19-1.55 to 1.17-1.45 ms at 248,320 ids and from 0.81-1.14 to 0.80-1.12 ms at 151,936; at 32,000 it
    was up to 1.9x slower (rows with many candidates), so smaller vocabularies keep 1,024 and SPARSE_APPEND 1
    (results/published/verify-step-h200-sparse, tune_noloop.log). The dense mode's finish runs 4 warps and reads
    a missed row's samples at once: 2%-6% faster at 248,320 and 32,000 ids on iid, bf16, sorted and lm_like rows
    (4096 rows, H200, 20 interleaved rounds); the sparse mode's was mixed there (iid 4% faster, sorted, padding
    and lm_like 4% slower) and keeps 2 warps and pieces of PIECE (results/published/verify-probs-h200-families,
    tune_finish_dense.log, tune_finish_sparse.log). Both modes sample runs of CHUNK = 16 logits (64 bytes; 8 before:
    half as many places, the same count): the dense builder faster in 19 of 24 cells (6 families at 32,000 to
    248,320 ids, 1%-6%; iid rows 2%-3% slower at 32,000 and 49,152; tune_chunk16_dense.log). RANK_RULE, the
    first threshold's rank (best_rank's rule): the sparse mode takes rule 1 (bound); with it and the runs of 16,
    run_sparse's worst family of 6 went from 1.53x to 1.46x the read at 248,320 ids, 1.92x to 1.69x at 151,936,
    2.99x to 2.62x at 32,000 (lm_like rows slower at 248,320: 1.30x -> 1.39x; tune_rank_sweep.log in
    results/published/verify-step-h200-sparse, fixed ranks equal to the rule's for top_k 20). The dense mode
    takes rule 1 too: faster in 20 of 30 cells (6 families at 32,000 to 248,320 ids, 4096 rows, the same
    rounds), its worst family 1.34x -> 1.26x the copy at 151,936, 1.43x -> 1.30x at 128,256, 2.28x -> 2.10x at
    32,000, 1.18x -> 1.20x at 248,320 (the same rank there for top_k 20: noise; tune_rank_rule_dense.log in
    results/published/verify-probs-h200-families)."""
    wide = sparse and vocab >= WIDE_VOCAB
    return {"PASS_BLOCK": 2048 if wide else 1024, "PASS_WARPS": 4, "START_WARPS": 8,
            "FINISH_WARPS": 2 if sparse else 4, "PIECE": PIECE if sparse else SAMPLES, "NARROW": 256,
            "CHUNK": CHUNK, "RANK_RULE": 1, "SAMPLE_SHARE": SAMPLE_SHARE, "SAMPLES": SAMPLES,
            "INTERLEAVE_BLOCKS": 64, "FIRST_RANK": 0, "DENSE_APPEND": 0, "SPARSE_APPEND": 2 if wide else 1,
            "PASS_LOOP": 0, "PASS_STAGES": 3}


def run(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, config: dict[str, int] | None = None
        ) -> tuple[Tensor, Tensor | None]:
    """The kernels over a batch. temperature, top_k, top_p: [rows] each, on the logits' device (any dtype).
    -> (out [rows, V] fp32, the rows left to the caller or None). Rows left to the caller (top_k above
    FAST_K or the whole vocabulary; thresholds missed past the retries) are left unwritten: the caller builds
    them. One synchronisation (the count of rows left); the host work before the first kernel is kept short
    (the GPU waits for it)."""
    n, vocab = logits.shape
    if n == 0:
        return torch.empty(0, vocab, dtype=torch.float32, device=logits.device), None
    with launch_device(logits.device):
        out, _, pending = _launch(logits, temperature, top_k, top_p, config)
    return out, pending()


def run_sparse(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, config: dict[str, int] | None = None
               ) -> tuple[Tensor, Tensor, Tensor | None]:
    """The kernels with a sparse output: no zeros written, each taken row's k probabilities by rank.
    -> (values [rows, FAST_K] fp32, ids [rows, FAST_K] int32: ranks k and above value 0 and id V, the rows left
    to the caller or None; their slots hold nothing). Same arguments and rules as run."""
    values, ids, pending = queue_sparse(logits, temperature, top_k, top_p, config)
    return values, ids, pending()


def queue_sparse(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor,
                 config: dict[str, int] | None = None) -> tuple[Tensor, Tensor, Callable[[], Tensor | None]]:
    """run_sparse without its synchronisation: the kernels are queued and (values, ids, left) come back at
    once, `left()` the synchronisation that reads which rows the caller must build (None: no row). Work
    queued on the outputs before left() runs after the kernels, as any work on the stream."""
    if logits.shape[0] == 0:
        empty = torch.empty(0, FAST_K, device=logits.device)
        return empty, empty.int(), lambda: None
    with launch_device(logits.device):
        return _launch(logits, temperature, top_k, top_p, config, sparse=True)


def launch_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it the tensors' (a CPU, under the interpreter: nothing)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _launch(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, config: dict[str, int] | None,
            sparse: bool = False) -> tuple[Tensor, Tensor, Callable[[], Tensor | None]]:
    """(out, ids, left): the output (dense [rows, V], or the sparse values), the sparse ids (the workspace when
    dense: nothing to read), and the synchronisation that reads the rows left to the caller."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    cfg = {**launch_config(vocab, sparse), **(config or {})}
    device = logits.device
    samples = samples_for(vocab, cfg["SAMPLE_SHARE"], cfg["SAMPLES"])
    if device.type == "cuda":
        pass_block, retry_programs = cfg["PASS_BLOCK"], _multiprocessors(device) * 4
    else:  # the Triton interpreter (TRITON_INTERPRET=1), for tests on a CPU: few, small programs
        pass_block, retry_programs = min(cfg["PASS_BLOCK"], 2048), 4
    redo = min(REDO, n)  # the room of a retry list (REDO caps it only in tests)
    counters_at = (len(FIELDS) + CANDIDATES) * n + ROUNDS * redo  # the layout of _lists and _counters
    ws = torch.empty(counters_at + ROUNDS + 1, dtype=torch.int32, device=device)
    wsf = ws.view(torch.float32)
    common = {"CANDIDATES": CANDIDATES, "redo": redo, "ROUNDS": ROUNDS}
    stride, chunk = logits.stride(0), run_length(samples, cfg["CHUNK"])
    ranks = rank_table(vocab, samples, str(device), cfg["RANK_RULE"])
    _start_kernel[(n,)](logits, stride, temperature, top_k, top_p, ranks, ws, wsf, n, vocab, cfg["FIRST_RANK"], redo,
                        GREEDY=GREEDY_TEMPERATURE, FAST_K=FAST_K, SAMPLES=samples, CHUNK=chunk, CANDIDATES=CANDIDATES,
                        ROUNDS=ROUNDS, num_warps=cfg["START_WARPS"])
    out = torch.empty(n, FAST_K if sparse else vocab, dtype=torch.float32, device=device)
    ids = torch.empty(n, FAST_K, dtype=torch.int32, device=device) if sparse else ws
    blocks = triton.cdiv(vocab, pass_block)
    interleave = int(blocks <= cfg["INTERLEAVE_BLOCKS"])
    for r in range(ROUNDS):
        _pass_kernel[(n * blocks if r == 0 else retry_programs,)](
            logits, stride, out, ws, wsf, n, vocab, ROUND=r, BLOCK=pass_block, INTERLEAVE=interleave,
            ZEROS=not sparse, APPEND=cfg["SPARSE_APPEND" if sparse else "DENSE_APPEND"], LOOP=cfg["PASS_LOOP"],
            num_warps=cfg["PASS_WARPS"], num_stages=cfg["PASS_STAGES"], **common)
        _finish_kernel[(n if r == 0 else min(redo, retry_programs),)](
            logits, stride, out, ids, ws, wsf, n, vocab, ROUND=r, LAST=r == ROUNDS - 1, SAMPLES=samples, CHUNK=chunk,
            PIECE=min(cfg["PIECE"], samples), NARROW=min(cfg["NARROW"], CANDIDATES), FAST_K=FAST_K,
            TIE_BLOCK=TIE_BLOCK, TIE_SPAN=TIE_SPAN, SPARSE=sparse, num_warps=cfg["FINISH_WARPS"], **common)
    counters = ws[counters_at:]  # zeroed by the start kernel

    def left() -> Tensor | None:
        if int(counters[ROUNDS]) == 0:  # the one synchronisation
            return None
        status = FIELDS.index("status")
        return (ws[status * n:(status + 1) * n] >= 2).nonzero().squeeze(-1)

    return out, ids, left
