"""`topk_fused`, the kernel: a verify-probability builder that reads each row of logits once and writes the
dense output once (Triton, on CUDA). harness.verify.topk_fused_probs is the builder around it.

Per row, one program of a persistent grid (as many programs as fit on the GPU at once):
1. Threshold t: the r-th largest of SAMPLES logits of the row (CHUNK contiguous ones at evenly spaced
   places), r chosen per top_k so that both ways of missing are rare (best_rank).
2. One pass over the row in blocks: each block of the output row is written with zeros, and the index
   of each logit above t is appended to the program's scratch (an atomic slot each: they are few).
3. When fewer than k logits are above t, the first ties with t by index (a second pass that stops as
   soon as it has enough: an all-equal row reads one block of it).
4. Exact top-k of the candidates: when the scratch holds every logit above t and at least k logits are
   >= t, the row's k largest logits are among the candidates. They are ranked (value descending, then
   index ascending) by repeated maximum, divided by the temperature, softmaxed, top-p renormalised with
   the threshold rule of harness.verify.top_p_renorm_sorted, and written over the zeros.
5. A missed threshold (too many logits above t for the scratch, or fewer than k at or above it) is
   replaced in the kernel (rank halved or doubled) and the pass redone, up to MAX_ATTEMPTS times.
Rows still missed are flagged; they, and rows with k above FAST_K or covering the vocabulary, are built
by the caller (harness.verify.fused_build, the top-k-first path); only those rows.

Scratch: per program, CANDIDATES + TIES int32 indices and as many int64 keys (12 KiB).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the name stays usable through the topk_first path
    triton = None

SAMPLES = 4096  # logits sampled per row for the threshold: CHUNK contiguous logits at SAMPLES // CHUNK places
CHUNK = 64
FAST_K = 64  # the largest top_k the kernel handles; larger rows take the topk_first path
CANDIDATES = 768  # per program: logits above the threshold
TIES = 256  # per program: logits equal to the threshold (>= FAST_K)
SCRATCH = CANDIDATES + TIES  # scratch slots per program
PIECE = 256  # the samples and the candidates are read in pieces of this many (few registers)
MAX_ATTEMPTS = 4  # thresholds tried per row before it is left to the caller


def _poisson_cdf(m: int, lam: float) -> float:
    """P(X <= m), X ~ Poisson(lam)."""
    term = total = math.exp(-lam)
    for i in range(1, m + 1):
        term *= lam / i
        total += term
    return total


def best_rank(k: int, vocab: int, samples: int) -> int:
    """The rank r (1 = largest) of the sampled logit used as threshold t for a row's top-k. The row fails
    when t is among its k-1 largest logits (r or more samples there: fewer than k logits >= t) and
    overflows when more than CANDIDATES logits exceed t (fewer than r samples among its CANDIDATES largest);
    with samples spread over the row, the samples that land among a row's m largest logits are about
    Poisson(m x samples / vocab). r balances the two (both under 1% for k <= 64 at the seed's sizes)."""
    lam_fail, lam_over = (k - 1) * samples / vocab, CANDIDATES * samples / vocab
    cost = {r: max(1 - _poisson_cdf(r - 1, lam_fail), _poisson_cdf(r - 1, lam_over)) for r in range(1, 64)}
    return min(cost, key=cost.__getitem__)


@functools.lru_cache(maxsize=64)
def rank_table(vocab: int, samples: int, device: str) -> Tensor:
    """best_rank for every k in 0..FAST_K (index k), int32 on `device`: looked up per row without a sync."""
    return torch.tensor([1] + [best_rank(k, vocab, samples) for k in range(1, FAST_K + 1)], dtype=torch.int32,
                        device=device)


if triton is not None:

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
    def _finish(keys_ptr, n, k, temperature, top_p, dst, PIECE: tl.constexpr, FAST_K: tl.constexpr):
        """n candidate keys at keys_ptr (distinct: the index is part of each) -> the row's k probabilities:
        the k largest by repeated maximum (read in pieces of PIECE), then temperature, softmax, top-p;
        stored."""
        ranks = tl.arange(0, FAST_K)
        top = tl.full([FAST_K], -(2**63), tl.int64)
        prev = tl.full([], 2**63 - 1, tl.int64)
        if n <= PIECE:  # the usual case: one piece, kept in registers
            j = tl.arange(0, PIECE)
            held = tl.load(keys_ptr + j, mask=j < n, other=-(2**63))
            for i in range(k):
                m = tl.max(tl.where(held < prev, held, -(2**63)), axis=0)
                top = tl.where(ranks == i, m, top)
                prev = m
        else:
            for i in range(k):
                m = tl.full([], -(2**63), tl.int64)
                for first in range(0, n, PIECE):
                    jj = first + tl.arange(0, PIECE)
                    keys = tl.load(keys_ptr + jj, mask=jj < n, other=-(2**63))
                    m = tl.maximum(m, tl.max(tl.where(keys < prev, keys, -(2**63)), axis=0))
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
        tl.store(dst + idx, p, mask=kept)

    @triton.jit
    def _fused_kernel(logits_ptr, stride_row, out_ptr, k_ptr, rank_ptr, temp_ptr, top_p_ptr, flag_ptr,
                      scratch_ptr, keys_ptr, count_ptr, n_rows, vocab,
                      SAMPLES: tl.constexpr, CHUNK: tl.constexpr, CANDIDATES: tl.constexpr, TIES: tl.constexpr,
                      PIECE: tl.constexpr, FAST_K: tl.constexpr, MAX_ATTEMPTS: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        scratch = scratch_ptr + pid * (CANDIDATES + TIES)
        keys_scratch = keys_ptr + pid * (CANDIDATES + TIES)
        counter = count_ptr + pid
        lanes = tl.arange(0, BLOCK)
        for row in range(pid, n_rows, tl.num_programs(0)):
            k = tl.load(k_ptr + row)
            if k > 0:
                src = logits_ptr + tl.cast(row, tl.int64) * stride_row
                dst = out_ptr + tl.cast(row, tl.int64) * vocab
                rank = tl.load(rank_ptr + row)
                attempt = tl.full([], 0, tl.int32)
                status = tl.full([], 0, tl.int32)  # 0: working on it, 1: written, 2: left to the caller
                while status == 0:
                    # 1. threshold: the rank-th largest distinct value of SAMPLES logits (CHUNK contiguous ones at
                    # evenly spaced places), by repeated maximum over them in pieces of PIECE (few registers)
                    t = tl.full([], float("inf"), tl.float32)
                    for _ in range(rank):
                        best = tl.full([], float("-inf"), tl.float32)
                        for first in range(0, SAMPLES, PIECE):
                            j = first + tl.arange(0, PIECE)
                            at = (j // CHUNK) * (vocab // (SAMPLES // CHUNK)) + j % CHUNK
                            s = tl.load(src + at).to(tl.float32)
                            best = tl.maximum(best, tl.max(tl.where(s < t, s, float("-inf")), axis=0))
                        t = tl.where(best > float("-inf"), best, t)  # an all-equal row keeps its one value
                    # 2. one pass: zeros out; the index of each logit above t appended to the scratch (an atomic
                    # slot each: they are few). Nothing block-wide inside the loop.
                    tl.store(counter, 0)
                    tl.debug_barrier()
                    for start in range(0, vocab, BLOCK):
                        offs = start + lanes
                        inside = offs < vocab
                        x = tl.load(src + offs, mask=inside, other=float("-inf"))
                        tl.store(dst + offs, tl.zeros([BLOCK], tl.float32), mask=inside)
                        gt = x > t
                        pos = tl.atomic_add(counter + lanes * 0, 1, mask=gt, sem="relaxed")
                        tl.store(scratch + pos, offs, mask=gt & (pos < CANDIDATES))
                    tl.debug_barrier()  # the scratch, the counter and the zeros, before they are read
                    n_gt = tl.load(counter)
                    # 3. ties with t, when fewer than k logits are above it: the first ones by index, in a
                    # second pass that stops as soon as it has enough (an all-equal row reads one block)
                    need = tl.maximum(k - n_gt, 0)
                    found = 0
                    start = 0
                    while (found < need) & (start < vocab) & (n_gt <= CANDIDATES):
                        offs = start + lanes
                        x = tl.load(src + offs, mask=offs < vocab, other=float("-inf"))
                        eq = (x == t) & (offs < vocab)
                        pos = found + tl.cumsum(eq.to(tl.int32), axis=0) - 1
                        tl.store(scratch + CANDIDATES + pos, offs, mask=eq & (pos < TIES))
                        found += tl.sum(eq.to(tl.int32), axis=0)
                        start += BLOCK
                    tl.debug_barrier()
                    n_tie = tl.minimum(tl.minimum(found, need), TIES)
                    if (n_gt <= CANDIDATES) & (n_gt + n_tie >= k):
                        temperature = tl.load(temp_ptr + row)
                        top_p = tl.load(top_p_ptr + row)
                        # 4. the candidates (above t, then the ties) as keys (their logits read again: few, in
                        # cache), written after the index scratch, then the k largest of them
                        n_cand = n_gt + n_tie
                        for first in range(0, n_cand, PIECE):
                            j = first + tl.arange(0, PIECE)
                            used = j < n_cand
                            slot = tl.where(j < n_gt, j, CANDIDATES + j - n_gt)
                            idx = tl.load(scratch + slot, mask=used, other=0)
                            x = tl.load(src + idx, mask=used, other=0.0).to(tl.float32)
                            tl.store(keys_scratch + j, _key(x, idx), mask=used)
                        tl.debug_barrier()
                        _finish(keys_scratch, n_cand, k, temperature, top_p, dst, PIECE, FAST_K)
                        status = tl.full([], 1, tl.int32)
                    else:
                        # 5. missed: another threshold (a lower rank when too many logits were above t, a
                        # higher one when too few) and another pass; after MAX_ATTEMPTS, the caller's
                        over = n_gt > CANDIDATES
                        attempt += 1
                        stuck = (over & (rank == 1)) | (~over & (rank >= SAMPLES)) | (attempt >= MAX_ATTEMPTS)
                        rank = tl.where(over, tl.maximum(rank // 2, 1), tl.minimum(rank * 2, SAMPLES))
                        if stuck:
                            tl.store(flag_ptr + row, 1)
                            status = tl.full([], 2, tl.int32)
                    tl.debug_barrier()  # the next attempt, or row, reuses the scratch and the counter


def available() -> bool:
    return triton is not None


def samples_for(vocab: int) -> int:
    """SAMPLES, or fewer (a power of two, at most a quarter of the row) for a small vocabulary."""
    s = SAMPLES
    while s > CHUNK and s * 4 > vocab:
        s //= 2
    return s


def resident_per_sm(kernel, num_warps: int, device: torch.device) -> int:
    """How many programs of a compiled kernel fit on one multiprocessor at once (registers, warps, shared
    memory): the persistent grid is that many per multiprocessor, so that every program runs from the start."""
    props = torch.cuda.get_device_properties(device)
    regs_per_warp = -(-kernel.n_regs * 32 // 256) * 256  # allocated per warp in units of 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * num_warps)
    by_warps = props.max_threads_per_multi_processor // (32 * num_warps)
    shared = getattr(kernel.metadata, "shared", 0) or 0
    by_smem = props.shared_memory_per_multiprocessor // shared if shared else by_warps
    return max(1, min(by_regs, by_warps, by_smem))


_RESIDENT: dict[tuple[str, torch.dtype, int, int], int] = {}  # learnt at the first launch of each variant


def launch_config(rows: int) -> tuple[int, int]:
    """(BLOCK, num_warps): wide programs when there are few rows (each program's own speed counts), narrow
    ones that fit more to a multiprocessor when there are many (measured on an H200)."""
    return (4096, 8) if rows <= 128 else (2048, 4)


def run(logits: Tensor, k: Tensor, temperature: Tensor, top_p: Tensor, block: int | None = None,
        num_warps: int | None = None) -> tuple[Tensor, Tensor]:
    """The kernel over every row with k > 0 (k <= FAST_K, below the vocabulary; temperature 1 for greedy
    rows, which have k 1). -> (out [rows, V] fp32, flagged [rows] bool). Rows with k == 0 and flagged rows
    are left unwritten: the caller builds them."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    default_block, default_warps = launch_config(n)
    block, num_warps = block or default_block, num_warps or default_warps
    samples = samples_for(vocab)
    out = torch.empty(n, vocab, dtype=torch.float32, device=logits.device)
    flags = torch.zeros(n, dtype=torch.int8, device=logits.device)
    variant = (str(logits.device), logits.dtype, block, num_warps)
    if logits.device.type == "cuda":
        sms = torch.cuda.get_device_properties(logits.device).multi_processor_count
        programs = max(1, min(n, _RESIDENT.get(variant, 1) * sms))
    else:  # the Triton interpreter (TRITON_INTERPRET=1), for tests on a CPU
        programs = max(1, min(n, 4))
    scratch = torch.empty(programs * SCRATCH, dtype=torch.int32, device=logits.device)
    keys = torch.empty(programs * SCRATCH, dtype=torch.int64, device=logits.device)
    counters = torch.empty(programs, dtype=torch.int32, device=logits.device)
    rank = rank_table(vocab, samples, str(logits.device))[k.long().clamp(0, FAST_K)]
    compiled = _fused_kernel[(programs,)](
        logits, logits.stride(0), out, k.to(torch.int32), rank, temperature.float(), top_p.float(), flags,
        scratch, keys, counters, n, vocab,
        SAMPLES=samples, CHUNK=min(CHUNK, samples), CANDIDATES=CANDIDATES, TIES=TIES, PIECE=PIECE, FAST_K=FAST_K, MAX_ATTEMPTS=MAX_ATTEMPTS,
        BLOCK=block, num_warps=num_warps)
    if logits.device.type == "cuda" and variant not in _RESIDENT:
        _RESIDENT[variant] = resident_per_sm(compiled, num_warps, logits.device)
    return out, flags.bool()
