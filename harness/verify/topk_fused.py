"""`topk_fused`, the kernels: a verify-probability builder that reads each row of logits once and writes the
dense output once (Triton, on CUDA). harness.verify.topk_fused_probs is the builder around it.

No estimate and no retry; one kernel (launch_config's FUSE), or two:
1. pass, a program per BLOCK of a row (the copy-like part, near the bandwidth limit): zeros over the block of the
   output, and the maximum of each GROUP contiguous logits of the block into a small buffer (a row has at most
   GROUPS groups: GROUP grows with the vocabulary). Nothing in it depends on the row's parameters or on another
   program. With FUSE, the row's last program to arrive (an atomic counter per row: the other programs' maxima
   released before it, acquired by it) goes on to finish the row, while the other rows' passes stream;
2. finish, once per row (in that last program, or in a kernel of its own after the pass): the row's parameters
   (greedy rows: k 1; top_k <= 0 or >= the vocabulary: the whole vocabulary, left to the caller, as top_k above
   FAST_K), then the row's k largest logits, found among few:
   - the k largest groups, ranked by (maximum descending, group index ascending; SUPER > 1: found in two rounds,
     the k largest super-groups of SUPER groups, then the k largest groups among theirs), hold the row's k largest
     logits ranked by (value descending, index ascending): a logit of any other group is beaten by the first largest
     logit of each of those k groups (larger, or equal and at a lower index: groups are contiguous id ranges in
     id order). Exact on every row (sorted, clustered, all equal): nothing to estimate, nothing to retry;
   - those k groups are read in tiles of TILE logits and merged into a running top k by repeated maximum of
     int64 keys (value, then lowest index), from the first rank the tile can change; only keys at or above the
     k-th group's maximum can be among them (REPLACE 1: an unordered top k where each of the tile's keys above
     its least, largest first and at most k, takes the least's slot; sorted once at the end);
   - divided by the temperature, softmaxed, top-p renormalised with the threshold rule of
     harness.verify.top_p_renorm_sorted, and written over the zeros (or, sparse, by rank).
Without FUSE the rows go in CHUNKS slices (HALVING: a half, a quarter, ... of the rows): each slice's finish kernel
runs on a high-priority side stream as soon as the slice's pass is done, beside the next slices' passes
(_pass_then_finish). launch_config picks the configuration by vocabulary (a table; docs/kernels.md says which runs
where and why).
Rows left to the caller (top_k above FAST_K or covering the vocabulary) are counted; the caller builds them
(harness.verify.fused_build: topk_first), and only them. The launches are queued without waiting; one
synchronisation at the end reads the count of rows left.

`run_sparse` runs the same kernels with a sparse output (harness.verify.sparse.fused_sparse_probs): the pass
writes no zeros and the finish writes each row's k probabilities and int32 ids by rank ([rows, FAST_K] each);
`queue_sparse` is run_sparse without the synchronisation (harness.verify.sparse.verify_step queues the verify
kernel behind it first); `queue_step` also verifies a speculative step inside the finish (VERIFY: the step's last
finished row runs harness.verify.sparse_kernel.verify_request), so that the whole step is one launch with FUSE. With
the host's bound on top_k (max_top_k <= FAST_K: `bounded`) no row can be left: no synchronisation, and a
device-side check instead.

Temporary memory: a row's group maxima (4 bytes each, at most GROUPS: the next power of two of vocab / GROUP)
and two int32 words per row (a status, an arrival count): 4,104 bytes a row at most with GROUPS 1,024 (16 MiB
at 4,096 rows).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.verify.launch import launch_device
from harness.verify.rows import GREEDY_TEMPERATURE  # a temperature below it (or top_k 1) is a greedy row
from harness.verify.verifiers import VerifyOutput

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the name stays usable through the topk_first path
    triton = None
if triton is not None:
    from harness.verify.sparse_kernel import verify_request  # the verify step's body (VERIFY)

FAST_K = 64  # the largest top_k the kernels handle; larger rows take the topk_first path
MIN_GROUP = 32  # the fewest logits a group holds (a power of two)


def group_size(vocab: int, groups: int, least: int = MIN_GROUP) -> int:
    """Logits per group: the smallest power of two from `least` that leaves at most `groups` groups in a row."""
    g = least
    while g * groups < vocab:
        g *= 2
    return g


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


if triton is not None:
    _LOWEST = tl.constexpr(-(2**63))  # below every key: an empty slot
    _HIGHEST = tl.constexpr(2**63 - 1)
    _TWO_K = tl.constexpr(32)  # the largest top_k that the two-level pick takes (SUPER)
    _FAST_K = tl.constexpr(FAST_K)
    _GREEDY = tl.constexpr(GREEDY_TEMPERATURE)

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
    def _pass_kernel(
        logits_ptr,
        stride_row,
        out_ptr,
        ids_ptr,
        maxes_ptr,
        status_ptr,
        temp_ptr,
        top_k_ptr,
        top_p_ptr,
        n_rows,
        vocab,
        draft_ptr,
        q_ptr,
        u_ptr,
        tok_ptr,
        acc_ptr,
        row0,
        BLOCK: tl.constexpr,
        GROUP: tl.constexpr,
        FUSE: tl.constexpr,
        SLOTS: tl.constexpr,
        TILE_GROUPS: tl.constexpr,
        SPARSE: tl.constexpr,
        REPLACE: tl.constexpr,
        SUPER: tl.constexpr,
        VERIFY: tl.constexpr,
        GAMMA: tl.constexpr,
        GP: tl.constexpr,
        BLOCK_VERIFY: tl.constexpr,
        DENSE_Q: tl.constexpr,
    ):
        """Program (row, block), rows from row0: zeros over the block of the dense output (not SPARSE), and the
        maximum of each of its GROUP-logit groups into the row's maxima (SLOTS a row; past the vocabulary:
        nothing). FUSE: the row's last program to arrive (a counter per row, after the statuses) finishes the row
        (_finish_row). draft_ptr .. DENSE_Q: the verify step (VERIFY; _finish_row)."""
        blocks = tl.cdiv(vocab, BLOCK)
        row = row0 + tl.program_id(0) // blocks
        block = tl.program_id(0) % blocks
        groups = block * (BLOCK // GROUP) + tl.arange(0, BLOCK // GROUP)
        offs = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        inside = offs < vocab
        if not SPARSE:
            tl.store(
                out_ptr + tl.cast(row, tl.int64) * vocab + offs,
                tl.zeros([BLOCK // GROUP, GROUP], tl.float32),
                mask=inside,
            )
        x = tl.load(logits_ptr + tl.cast(row, tl.int64) * stride_row + offs, mask=inside, other=float("-inf")).to(
            tl.float32
        )
        tl.store(maxes_ptr + tl.cast(row, tl.int64) * SLOTS + groups, tl.max(x, axis=1), mask=groups * GROUP < vocab)
        if FUSE:
            tl.debug_barrier()  # every thread's zeros and maxima stored before the release below: the finishing
            # program, which acquires them all, reads the maxima and writes over the zeros
            if tl.atomic_add(status_ptr + n_rows + 1 + row, 1, sem="acq_rel", scope="gpu") == blocks - 1:
                _finish_row(
                    row,
                    logits_ptr,
                    stride_row,
                    out_ptr,
                    ids_ptr,
                    maxes_ptr,
                    status_ptr,
                    temp_ptr,
                    top_k_ptr,
                    top_p_ptr,
                    n_rows,
                    vocab,
                    draft_ptr,
                    q_ptr,
                    u_ptr,
                    tok_ptr,
                    acc_ptr,
                    SLOTS,
                    GROUP,
                    TILE_GROUPS,
                    SPARSE,
                    REPLACE,
                    SUPER,
                    VERIFY,
                    GAMMA,
                    GP,
                    BLOCK_VERIFY,
                    DENSE_Q,
                )

    @triton.jit
    def _write_probs(top, k, temperature, top_p, dst, dst_ids, vocab, SPARSE: tl.constexpr):
        """The row's k largest keys by rank -> temperature, softmax, top-p; stored at their ids of the dense row
        `dst`, or (SPARSE) as FAST_K values at dst and ids at dst_ids, by rank (ranks k and above: value 0, id
        `vocab`)."""
        ranks = tl.arange(0, _FAST_K)
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
    def _pick(gkeys, picks):
        """(the `picks` largest of the keys gkeys, their group ids by rank in FAST_K slots; the last one's key), by
        repeated maximum."""
        ranks = tl.arange(0, _FAST_K)
        picked = tl.full([_FAST_K], 0, tl.int32)
        prev = tl.full([], _HIGHEST, tl.int64)
        for i in range(picks):
            m = tl.max(tl.where(gkeys < prev, gkeys, _LOWEST), axis=0)
            picked = tl.where(ranks == i, _unkey(m)[1], picked)
            prev = m
        return picked, prev

    @triton.jit
    def _pick_two_level(gkeys, picks, n_groups, scratch, SLOTS: tl.constexpr, SUPER: tl.constexpr):
        """_pick (picks at most _TWO_K) in two smaller rounds: the `picks` largest super-groups of SUPER groups, by
        their best group key, hold the `picks` largest groups (a group outside them is beaten by each of their
        best groups); then those among the picked super-groups' groups. scratch: _TWO_K * SUPER + SLOTS // SUPER
        int64 words of this program's own (the row's group maxima, read already)."""
        # through memory, as the keys below: each super-group's key comes out of the reduction in a layout of 32 a
        # lane (sm_90 SASS, Triton 3.6); read back contiguously, as few as SLOTS // SUPER allow. The barrier: every
        # thread has read its maxima before any overwrites them
        tl.debug_barrier()
        tl.store(
            scratch + _TWO_K * SUPER + tl.arange(0, SLOTS // SUPER),
            tl.max(tl.reshape(gkeys, [SLOTS // SUPER, SUPER]), axis=1),
        )
        tl.debug_barrier()
        skeys = tl.load(scratch + _TWO_K * SUPER + tl.arange(0, SLOTS // SUPER))
        slots = tl.arange(0, _TWO_K)
        supers = tl.full([_TWO_K], 0, tl.int32)
        prev = tl.full([], _HIGHEST, tl.int64)
        for i in range(tl.minimum(picks, tl.cdiv(n_groups, SUPER))):
            m = tl.max(tl.where(skeys < prev, skeys, _LOWEST), axis=0)
            supers = tl.where(slots == i, _unkey(m)[1] // SUPER, supers)
            prev = m
        at = tl.arange(0, _TWO_K * SUPER)
        group = tl.gather(supers, at // SUPER, 0) * SUPER + at % SUPER
        ok = at // SUPER < tl.minimum(picks, tl.cdiv(n_groups, SUPER))
        # through memory: the gathered keys come in a layout of 32 a lane (sm_90 SASS, Triton 3.6), read back
        # contiguously they are 8 a lane, and each round of the pick scans 8
        tl.store(scratch + at, tl.where(ok, tl.gather(gkeys, group, 0), _LOWEST))
        tl.debug_barrier()
        return _pick(tl.load(scratch + at), picks)

    @triton.jit
    def _finish_kernel(
        logits_ptr,
        stride_row,
        out_ptr,
        ids_ptr,
        maxes_ptr,
        status_ptr,
        temp_ptr,
        top_k_ptr,
        top_p_ptr,
        n_rows,
        vocab,
        draft_ptr,
        q_ptr,
        u_ptr,
        tok_ptr,
        acc_ptr,
        row0,
        SLOTS: tl.constexpr,
        GROUP: tl.constexpr,
        TILE_GROUPS: tl.constexpr,
        SPARSE: tl.constexpr,
        REPLACE: tl.constexpr,
        SUPER: tl.constexpr,
        VERIFY: tl.constexpr,
        GAMMA: tl.constexpr,
        GP: tl.constexpr,
        BLOCK_VERIFY: tl.constexpr,
        DENSE_Q: tl.constexpr,
    ):
        """Program i: _finish_row of row row0 + i."""
        _finish_row(
            row0 + tl.program_id(0),
            logits_ptr,
            stride_row,
            out_ptr,
            ids_ptr,
            maxes_ptr,
            status_ptr,
            temp_ptr,
            top_k_ptr,
            top_p_ptr,
            n_rows,
            vocab,
            draft_ptr,
            q_ptr,
            u_ptr,
            tok_ptr,
            acc_ptr,
            SLOTS,
            GROUP,
            TILE_GROUPS,
            SPARSE,
            REPLACE,
            SUPER,
            VERIFY,
            GAMMA,
            GP,
            BLOCK_VERIFY,
            DENSE_Q,
        )

    @triton.jit
    def _finish_row(
        row,
        logits_ptr,
        stride_row,
        out_ptr,
        ids_ptr,
        maxes_ptr,
        status_ptr,
        temp_ptr,
        top_k_ptr,
        top_p_ptr,
        n_rows,
        vocab,
        draft_ptr,
        q_ptr,
        u_ptr,
        tok_ptr,
        acc_ptr,
        SLOTS: tl.constexpr,
        GROUP: tl.constexpr,
        TILE_GROUPS: tl.constexpr,
        SPARSE: tl.constexpr,
        REPLACE: tl.constexpr,
        SUPER: tl.constexpr,
        VERIFY: tl.constexpr,
        GAMMA: tl.constexpr,
        GP: tl.constexpr,
        BLOCK_VERIFY: tl.constexpr,
        DENSE_Q: tl.constexpr,
    ):
        """A row's parameters; a row the kernels take gets its k largest logits from its k largest groups (module
        docstring) and its probabilities written (status 1); another is counted for the caller (status 2, and the
        count after the rows' statuses). VERIFY (SPARSE): the row counts itself into its step's G+1 rows (a counter
        per step after the arrivals, release/acquire as the pass's), and the step's last row to be finished verifies
        the step (sparse_kernel.verify_request: a step with a row left to the caller gets an answer from unwritten
        entries, which the caller replaces)."""
        temp = tl.load(temp_ptr + row).to(tl.float32)
        top_k = tl.load(top_k_ptr + row).to(tl.int64)
        greedy = (temp < _GREEDY) | (top_k == 1)
        k = tl.where(greedy, 1, tl.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)).to(tl.int32)
        if (k <= _FAST_K) & (k < vocab):
            # the k largest groups (every group of a row of fewer), by repeated maximum of (maximum, index) keys
            g = tl.arange(0, SLOTS)
            used = g * GROUP < vocab
            mx = tl.load(maxes_ptr + tl.cast(row, tl.int64) * SLOTS + g, mask=used, other=0.0, cache_modifier=".cg")
            gkeys = tl.where(used, _key(mx, g), _LOWEST)
            picks = tl.minimum(k, tl.cdiv(vocab, GROUP))
            ranks = tl.arange(0, _FAST_K)
            if (SUPER > 1) and ((_TWO_K * SUPER + SLOTS // SUPER) * 2 <= SLOTS):  # the scratch (int64 words) fits
                # in the row's maxima
                if k <= _TWO_K:
                    scratch = (maxes_ptr + tl.cast(row, tl.int64) * SLOTS).to(tl.pointer_type(tl.int64), bitcast=True)
                    picked, prev = _pick_two_level(gkeys, picks, tl.cdiv(vocab, GROUP), scratch, SLOTS, SUPER)
                else:
                    picked, prev = _pick(gkeys, picks)
            else:
                picked, prev = _pick(gkeys, picks)
            # every logit among the row's k largest has a key at least that of the k-th group's first maximum,
            # and so at least this floor (the same value at the group's last index)
            kth_max, kth_group = _unkey(prev)
            floor = tl.where(picks == k, _key(kth_max, (kth_group + 1) * GROUP - 1), _LOWEST)
            src = logits_ptr + tl.cast(row, tl.int64) * stride_row
            lane = tl.arange(0, GROUP)
            # the groups, TILE_GROUPS at a time, merged into a running top k (its first `have` ranks used); only
            # keys at or above the floor count
            top = tl.full([_FAST_K], _LOWEST, tl.int64)
            if REPLACE:  # an unordered top k: its empty slots distinct and below every key (a key's low word is
                # 2^32 - 1 - id > 2^31 > the rank), slots past k never the minimum
                top = tl.where(ranks < k, ranks.to(tl.int64) + _LOWEST, _HIGHEST)
            have = tl.full([], 0, tl.int32)
            # (unrolled: on an H200, Triton 3.6 miscompiled the running top carried through a loop of dynamic length)
            for start in tl.static_range(0, _FAST_K, TILE_GROUPS):
                if start < picks:  # tiles past the k groups: nothing to merge
                    tile = start + tl.arange(0, TILE_GROUPS)
                    gid = tl.sum(tl.where(ranks[None, :] == tile[:, None], picked[None, :], 0), axis=1)
                    offs = gid[:, None] * GROUP + lane[None, :]
                    ok = (tile < picks)[:, None] & (offs < vocab)
                    x = tl.load(src + offs, mask=ok, other=0.0).to(tl.float32)
                    keys = _key(x, offs)
                    keys = tl.reshape(tl.where(ok & (keys >= floor), keys, _LOWEST), [TILE_GROUPS * GROUP])
                    if REPLACE:  # the tile's keys above the top's least, largest first, each in place of the least
                        # (at most k of them can stay)
                        enter = tl.minimum(tl.sum((keys > tl.min(top, axis=0)).to(tl.int32), axis=0), k)
                        prev = tl.full([], _HIGHEST, tl.int64)
                        for _ in range(enter):
                            m = tl.max(tl.where(keys < prev, keys, _LOWEST), axis=0)
                            least = tl.min(top, axis=0)  # in one slot: the slots are distinct
                            top = tl.where((top == least) & (m > least), m, top)
                            prev = m
                    else:
                        total = tl.minimum(have + tl.sum((keys > _LOWEST).to(tl.int32), axis=0), k)
                        merged = tl.full([_FAST_K], _LOWEST, tl.int64)
                        prev = tl.full([], _HIGHEST, tl.int64)
                        placed = tl.full([], 0, tl.int32)
                        if start > 0:  # the running top's ranks above every key of the tile keep their place (all of
                            # them when the tile adds nothing): the repeated maximum starts after them
                            placed = tl.minimum(tl.sum((top > tl.max(keys, axis=0)).to(tl.int32), axis=0), total)
                            merged = tl.where(ranks < placed, top, _LOWEST)
                            prev = tl.min(tl.where(ranks < placed, top, _HIGHEST), axis=0)
                        for i in range(placed, total):
                            m = tl.maximum(
                                tl.max(tl.where(keys < prev, keys, _LOWEST), axis=0),
                                tl.max(tl.where(top < prev, top, _LOWEST), axis=0),
                            )
                            merged = tl.where(ranks == i, m, merged)
                            prev = m
                        top = merged
                        have = total
            if REPLACE:
                top = tl.sort(tl.where(ranks < k, top, _LOWEST), descending=True)
            dst = out_ptr + tl.cast(row, tl.int64) * (_FAST_K if SPARSE else vocab)
            dst_ids = ids_ptr + tl.cast(row, tl.int64) * _FAST_K
            _write_probs(
                top,
                k,
                tl.where(greedy, 1.0, temp),
                tl.load(top_p_ptr + row).to(tl.float32),
                dst,
                dst_ids,
                vocab,
                SPARSE,
            )
            tl.store(status_ptr + row, 1)
        else:
            tl.store(status_ptr + row, 2)
            tl.atomic_add(status_ptr + n_rows, 1)
        if VERIFY:
            tl.debug_barrier()  # every thread's entries stored before the release below
            step = row // (GAMMA + 1)
            if tl.atomic_add(status_ptr + 2 * n_rows + 1 + step, 1, sem="acq_rel", scope="gpu") == GAMMA:
                verify_request(
                    step,
                    out_ptr,
                    ids_ptr,
                    _FAST_K,
                    _FAST_K,
                    draft_ptr,
                    q_ptr,
                    u_ptr,
                    tok_ptr,
                    acc_ptr,
                    vocab,
                    GAMMA,
                    GP,
                    _FAST_K,
                    BLOCK_VERIFY,
                    DENSE_Q,
                    False,
                )


def available() -> bool:
    return triton is not None


# The launch configuration by vocabulary: each mode's base, and per range of vocabularies (the least vocabulary of
# the range, ascending) the keys that differ from it. Measured on one H200 (docs/kernels.md, "Launch configurations":
# the variants timed in the same rounds at 4096 rows, top_k 20, every vocabulary of the microbenchmark); every
# key is exact (the interpreter tests: bitwise the same output whatever the launch), so the table changes speed only.
_DENSE = {
    "PASS_BLOCK": 2048,
    "PASS_WARPS": 4,
    "GROUPS": 1024,
    "TILE": 1024,
    "FUSE": 1,
    "FINISH_WARPS": 4,
    "CHUNKS": 1,
    "HALVING": 0,
    "REPLACE": 0,
    "SUPER": 0,
    "VERIFY": 0,
}
_SPARSE = {
    "PASS_BLOCK": 2048,
    "PASS_WARPS": 4,
    "GROUPS": 1024,
    "TILE": 512,
    "FUSE": 0,
    "FINISH_WARPS": 1,
    "CHUNKS": 1,
    "HALVING": 0,
    "REPLACE": 0,
    "SUPER": 0,
    "VERIFY": 0,
}
DENSE_RANGES: tuple[tuple[int, dict[str, int]], ...] = (
    (0, {}),
    (65_536, {"FUSE": 0, "CHUNKS": 4, "FINISH_WARPS": 1, "REPLACE": 1, "SUPER": 8}),
)
SPARSE_RANGES: tuple[tuple[int, dict[str, int]], ...] = (
    (0, {"SUPER": 8}),
    (65_536, {"CHUNKS": 4, "REPLACE": 1, "SUPER": 8}),
)


def launch_config(vocab: int = 0, sparse: bool = False) -> dict[str, int]:
    """The kernels' launch configuration for rows of `vocab` logits (a new dict): the mode's base with the overrides
    of the last range of DENSE_RANGES / SPARSE_RANGES whose least vocabulary is at most `vocab`. The keys:
    - PASS_BLOCK logits a pass program (at least a group), PASS_WARPS warps; GROUPS group maxima a row at most;
      TILE logits merged at a time by the finish (at least a group);
    - FUSE 1: a row's last pass program to arrive finishes the row (one kernel; its finish overlaps the other rows'
      passes); 0: a finish kernel of FINISH_WARPS warps after the pass, with CHUNKS > 1 in slices of rows, each
      slice's finish on a high-priority side stream beside the next slices' passes (HALVING 1: slices of a half, a
      quarter, ... of the rows, the last two equal, so that the finish left after the last pass is a small slice's);
    - REPLACE 1: the merge that puts each entering key in place of the running top's least; SUPER 8: the group pick
      in two rounds (super-groups of 8 groups) for top_k up to 32, where a row has room for its scratch;
    - VERIFY 1 (the sparse mode, read by harness.verify.sparse.verify_step): the step's verification inside the
      finish (its last row to be finished verifies it), no verify kernel of its own.
    Why each range has what it has, with the measurements: docs/kernels.md."""
    base, ranges = (_SPARSE, SPARSE_RANGES) if sparse else (_DENSE, DENSE_RANGES)
    chosen: dict[str, int] = {}
    for least, overrides in ranges:
        if vocab >= least:
            chosen = overrides
    return {**base, **chosen}


@dataclass(frozen=True)
class Step:
    """A verify step for the finish to run (queue_step): the batch's rows are B steps of G+1 rows each (row
    b * (G+1) + j: p(. | prefix_j) of step b). drafts [B, G] (any integer dtype), q [B, G, V] fp32 or None (point
    masses at the drafts), uniforms [B, G+1] fp32, each contiguous on the logits' device; block: block verification,
    else token-wise (harness.verify.sparse_kernel's arithmetic)."""

    drafts: Tensor
    q: Tensor | None
    uniforms: Tensor
    block: bool


@dataclass
class Queued:
    """What the kernels were queued to write: `out` (dense [rows, V], or the sparse values [rows, FAST_K]), `ids`
    (the sparse ids; the output itself when dense), a step's `tokens` [B, G+1] and `accepted` [B] (None without a
    step), and `left`: the synchronisation that reads which rows the caller must build (None: no row)."""

    out: Tensor
    ids: Tensor
    tokens: Tensor | None
    accepted: Tensor | None
    left: Callable[[], Tensor | None]


def run(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, config: dict[str, int] | None = None
) -> tuple[Tensor, Tensor | None]:
    """The kernels over a batch. temperature, top_k, top_p: [rows] each, on the logits' device (any dtype).
    -> (out [rows, V] fp32, the rows left to the caller or None). Rows left to the caller (top_k above
    FAST_K or the whole vocabulary) are left unwritten: the caller builds them. One synchronisation (the count
    of rows left); the host work before the first kernel is kept short (the GPU waits for it)."""
    n, vocab = logits.shape
    if n == 0:
        return torch.empty(0, vocab, dtype=torch.float32, device=logits.device), None
    with launch_device(logits.device):
        queued = _launch(logits, temperature, top_k, top_p, config)
    return queued.out, queued.left()


def run_sparse(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, config: dict[str, int] | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The kernels with a sparse output: no zeros written, each taken row's k probabilities by rank.
    -> (values [rows, FAST_K] fp32, ids [rows, FAST_K] int32: ranks k and above value 0 and id V, the rows left
    to the caller or None; their slots hold nothing). Same arguments and rules as run."""
    values, ids, pending = queue_sparse(logits, temperature, top_k, top_p, config)
    return values, ids, pending()


def queue_sparse(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    config: dict[str, int] | None = None,
    max_top_k: int | None = None,
) -> tuple[Tensor, Tensor, Callable[[], Tensor | None]]:
    """run_sparse without its synchronisation: the kernels are queued and (values, ids, left) come back at
    once, `left()` the synchronisation that reads which rows the caller must build (None: no row). Work
    queued on the outputs before left() runs after the kernels, as any work on the stream. max_top_k: the host's
    bound on every row's top_k (SGLang's sampling_info.max_top_k; see bounded())."""
    if logits.shape[0] == 0:
        empty = torch.empty(0, FAST_K, device=logits.device)
        return empty, empty.int(), lambda: None
    with launch_device(logits.device):
        queued = _launch(logits, temperature, top_k, top_p, config, sparse=True, max_top_k=max_top_k)
    return queued.out, queued.ids, queued.left


def queue_step(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    step: Step,
    config: dict[str, int] | None = None,
    max_top_k: int | None = None,
) -> tuple[Tensor, Tensor, VerifyOutput, Callable[[], Tensor | None]]:
    """queue_sparse with the step's verification inside the finish: one launch of the kernels (FUSE) or a pass
    and a finish, and no verify kernel. -> (values, ids, the verifier's output, left); a step with a row left to
    the caller has tokens made from unwritten entries: the caller verifies it again once left() has named it."""
    bsz, gamma = step.drafts.shape
    if logits.shape[0] != bsz * (gamma + 1):
        raise ValueError(f"{logits.shape[0]} rows of logits for {bsz} steps of {gamma} drafts: need B * (G+1)")
    if bsz == 0:
        empty = torch.empty(0, FAST_K, device=logits.device)
        none = torch.empty(0, dtype=torch.int64, device=logits.device)
        return empty, empty.int(), VerifyOutput(num_accepted=none, tokens=none.view(0, gamma + 1)), lambda: None
    with launch_device(logits.device):
        queued = _launch(logits, temperature, top_k, top_p, config, sparse=True, step=step, max_top_k=max_top_k)
    assert queued.accepted is not None and queued.tokens is not None  # a step's outputs (_launch)
    return queued.out, queued.ids, VerifyOutput(num_accepted=queued.accepted, tokens=queued.tokens), queued.left


def bounded(max_top_k: int | None, vocab: int) -> bool:
    """Whether the host's bound on every row's top_k (None: none known) guarantees that the kernels take every
    row (1 <= bound <= FAST_K and below the vocabulary): then the call needs no synchronisation to learn the rows
    left, and queues instead a device-side check that none was (a false bound that left a row stops the process:
    torch._assert_async). A bound below 1 is a ValueError."""
    if max_top_k is None:
        return False
    if max_top_k < 1:
        raise ValueError(f"max_top_k {max_top_k}: the host's bound on every row's top_k must be >= 1 (or None)")
    return max_top_k <= FAST_K and max_top_k < vocab


def kernel_shapes(vocab: int, cfg: dict[str, int], sparse: bool) -> dict[str, int]:
    """The constexprs both kernels take, for a vocabulary and a launch configuration (launch_config's keys)."""
    group = group_size(vocab, cfg["GROUPS"])
    return {
        "SLOTS": max(16, next_power_of_2(triton.cdiv(vocab, group))),  # a tensor of at least 16 (Triton's smallest)
        "GROUP": group,
        "TILE_GROUPS": max(1, cfg["TILE"] // group),
        "SPARSE": sparse,
        "REPLACE": cfg["REPLACE"],
        "SUPER": cfg["SUPER"],
    }


def step_shapes(step: Step | None) -> dict[str, int]:
    """The verify step's constexprs (VERIFY 0 without one)."""
    if step is None:
        return {"VERIFY": 0, "GAMMA": 1, "GP": 2, "BLOCK_VERIFY": 0, "DENSE_Q": 0}
    gamma = step.drafts.shape[1]
    return {
        "VERIFY": 1,
        "GAMMA": gamma,
        "GP": max(2, next_power_of_2(gamma + 1)),
        "BLOCK_VERIFY": int(step.block),
        "DENSE_Q": int(step.q is not None),
    }


def row_slices(n: int, chunks: int, halving: bool) -> list[tuple[int, int]]:
    """(first row, rows) of the slices the pass and the finish take in turn: one slice, or `chunks` of about
    n / chunks rows, or (halving) a half of the rows, a quarter, ..., and the rest (the last two equal), fewer
    where a slice would be empty."""
    if chunks <= 1 or n <= 1:
        return [(0, n)]
    if halving:
        sizes, rest = [], n
        for _ in range(chunks - 1):
            if rest // 2 == 0:
                break
            sizes.append(rest // 2)
            rest -= rest // 2
        sizes.append(rest)
    else:
        each = -(-n // chunks)
        sizes = [min(each, n - row0) for row0 in range(0, n, each)]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return list(zip(starts, sizes, strict=True))


def _pass_then_finish(
    slices: list[tuple[int, int]],
    launch_pass: Callable[[int, int], None],
    launch_finish: Callable[[int, int], None],
    device: torch.device,
) -> None:
    """The pass and the finish kernel over the slices of rows (row_slices). On CUDA each slice's finish runs on a
    high-priority side stream as soon as the slice's pass is done, so that it fills the SMs beside the next
    slices' passes (the pass is bound by memory, the finish by latency), and the current stream waits for every
    finish before anything queued after this call. Elsewhere (the interpreter): one after the other."""
    if device.type != "cuda" or len(slices) == 1:
        for row0, rows in slices:
            launch_pass(row0, rows)
            launch_finish(row0, rows)
        return
    main, side = torch.cuda.current_stream(device), _side_stream(device.index)
    for row0, rows in slices:
        launch_pass(row0, rows)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            launch_finish(row0, rows)
    main.wait_stream(side)  # the outputs, and the inputs' memory, belong to the current stream again


@functools.cache
def _side_stream(index: int) -> torch.cuda.Stream:
    """The device's stream for the finish kernels, at the highest priority (torch maps -100 to it): its programs
    are scheduled before the pass's next ones as SMs free up."""
    return torch.cuda.Stream(device=index, priority=-100)


def _launch(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    config: dict[str, int] | None,
    sparse: bool = False,
    step: Step | None = None,
    max_top_k: int | None = None,
) -> Queued:
    """Queue the kernels. The host's work before the first pass is kept to what the pass reads or writes (the
    maxima, the status words, the dense output): a sparse pass that only reads starts before the outputs exist."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    cfg = {**launch_config(vocab, sparse), **(config or {})}
    device = logits.device
    shapes = kernel_shapes(vocab, cfg, sparse)
    verify = step_shapes(step)
    block = max(cfg["PASS_BLOCK"], shapes["GROUP"])
    blocks = triton.cdiv(vocab, block)
    fuse = cfg["FUSE"]
    skip_sync = bounded(max_top_k, vocab)
    maxes = torch.empty(n, shapes["SLOTS"], dtype=torch.float32, device=device)
    steps = 0 if step is None else step.drafts.shape[0]
    # a status per row, the rows left, an arrival count per row (FUSE), a count of finished rows per step (VERIFY)
    status = torch.zeros(2 * n + 1 + steps, dtype=torch.int32, device=device)
    outputs: list[Tensor] = []

    def written() -> list[Tensor]:
        """The outputs, allocated on first need: out, ids, tokens, accepted (unused ones: the maxima)."""
        if not outputs:
            out = torch.empty(n, FAST_K if sparse else vocab, dtype=torch.float32, device=device)
            ids = torch.empty(n, FAST_K, dtype=torch.int32, device=device) if sparse else out
            tokens = torch.empty(steps, verify["GAMMA"] + 1, dtype=torch.int64, device=device) if step else maxes
            accepted = torch.empty(steps, dtype=torch.int64, device=device) if step else maxes
            outputs.extend((out, ids, tokens, accepted))
        return outputs

    def args(need_outputs: bool) -> tuple:
        out, ids, tokens, accepted = written() if need_outputs else (maxes,) * 4
        drafts, q, u = (
            (step.drafts, maxes if step.q is None else step.q, step.uniforms) if step is not None else (maxes,) * 3
        )
        return (
            logits,
            logits.stride(0),
            out,
            ids,
            maxes,
            status,
            temperature,
            top_k,
            top_p,
            n,
            vocab,
            drafts,
            q,
            u,
            tokens,
            accepted,
        )

    # a pass that does not finish rows compiles once for every merge, pick and step (their constexprs unused)
    pass_shapes = {**shapes, **verify} if fuse else {**shapes, "REPLACE": 0, "SUPER": 0, **step_shapes(None)}

    def launch_pass(row0: int, rows: int) -> None:
        _pass_kernel[(rows * blocks,)](
            *args(bool(fuse) or not sparse), row0, BLOCK=block, FUSE=fuse, **pass_shapes, num_warps=cfg["PASS_WARPS"]
        )

    def launch_finish(row0: int, rows: int) -> None:
        _finish_kernel[(rows,)](*args(True), row0, **shapes, **verify, num_warps=cfg["FINISH_WARPS"])

    if fuse:
        launch_pass(0, n)
    else:
        _pass_then_finish(row_slices(n, cfg["CHUNKS"], bool(cfg["HALVING"])), launch_pass, launch_finish, device)
    out, ids, tokens, accepted = written()

    def left() -> Tensor | None:
        if int(status[n]) == 0:  # the one synchronisation
            return None
        return (status[:n] == 2).nonzero().squeeze(-1)

    if skip_sync:  # no row can be left but through a false bound: checked on the device, asynchronously
        torch._assert_async(status[n] == 0)
        return Queued(out, ids, tokens if step else None, accepted if step else None, lambda: None)
    return Queued(out, ids, tokens if step else None, accepted if step else None, left)
