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
Without FUSE the rows go in CHUNKS slices: each slice's finish kernel runs on a high-priority side stream as soon
as the slice's pass is done, beside the next slices' passes (_pass_then_finish).
Rows left to the caller (top_k above FAST_K or covering the vocabulary) are counted; the caller builds them
(harness.verify.fused_build: topk_first), and only them. The launches are queued without waiting; one
synchronisation at the end reads the count of rows left.

`run_sparse` runs the same kernels with a sparse output (harness.verify.sparse.fused_sparse_probs): the pass
writes no zeros and the finish writes each row's k probabilities and int32 ids by rank ([rows, FAST_K] each);
`queue_sparse` is run_sparse without the synchronisation (harness.verify.sparse.verify_step queues the verify
kernel behind it first).

Temporary memory: a row's group maxima (4 bytes each, at most GROUPS: the next power of two of vocab / GROUP)
and two int32 words per row (a status, an arrival count): 4,104 bytes a row at most with GROUPS 1,024 (16 MiB
at 4,096 rows).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
from torch import Tensor

from harness.verify.rows import GREEDY_TEMPERATURE  # a temperature below it (or top_k 1) is a greedy row

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the name stays usable through the topk_first path
    triton = None

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
    def _pass_kernel(logits_ptr, stride_row, out_ptr, ids_ptr, maxes_ptr, status_ptr, temp_ptr, top_k_ptr, top_p_ptr,
                     n_rows, vocab, row0, BLOCK: tl.constexpr, GROUP: tl.constexpr, FUSE: tl.constexpr,
                     SLOTS: tl.constexpr, TILE_GROUPS: tl.constexpr, SPARSE: tl.constexpr,
                     REPLACE: tl.constexpr, SUPER: tl.constexpr):
        """Program (row, block), rows from row0: zeros over the block of the dense output (not SPARSE), and the
        maximum of each of its GROUP-logit groups into the row's maxima (SLOTS a row; past the vocabulary:
        nothing). FUSE: the row's last program to arrive (a counter per row, after the statuses) finishes the row
        (_finish_row)."""
        blocks = tl.cdiv(vocab, BLOCK)
        row = row0 + tl.program_id(0) // blocks
        block = tl.program_id(0) % blocks
        groups = block * (BLOCK // GROUP) + tl.arange(0, BLOCK // GROUP)
        offs = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        inside = offs < vocab
        if not SPARSE:
            tl.store(out_ptr + tl.cast(row, tl.int64) * vocab + offs, tl.zeros([BLOCK // GROUP, GROUP], tl.float32),
                     mask=inside)
        x = tl.load(logits_ptr + tl.cast(row, tl.int64) * stride_row + offs, mask=inside,
                    other=float("-inf")).to(tl.float32)
        tl.store(maxes_ptr + tl.cast(row, tl.int64) * SLOTS + groups, tl.max(x, axis=1),
                 mask=groups * GROUP < vocab)
        if FUSE:
            tl.debug_barrier()  # every thread's zeros and maxima stored before the release below: the finishing
            # program, which acquires them all, reads the maxima and writes over the zeros
            if tl.atomic_add(status_ptr + n_rows + 1 + row, 1, sem="acq_rel", scope="gpu") == blocks - 1:
                _finish_row(row, logits_ptr, stride_row, out_ptr, ids_ptr, maxes_ptr, status_ptr, temp_ptr, top_k_ptr,
                            top_p_ptr, n_rows, vocab, SLOTS, GROUP, TILE_GROUPS, SPARSE, REPLACE, SUPER)

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
        tl.store(scratch + _TWO_K * SUPER + tl.arange(0, SLOTS // SUPER),
                 tl.max(tl.reshape(gkeys, [SLOTS // SUPER, SUPER]), axis=1))
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
    def _finish_kernel(logits_ptr, stride_row, out_ptr, ids_ptr, maxes_ptr, status_ptr, temp_ptr, top_k_ptr,
                       top_p_ptr, n_rows, vocab, row0, SLOTS: tl.constexpr, GROUP: tl.constexpr, TILE_GROUPS: tl.constexpr,
                       SPARSE: tl.constexpr, REPLACE: tl.constexpr, SUPER: tl.constexpr):
        """Program i: _finish_row of row row0 + i."""
        _finish_row(row0 + tl.program_id(0), logits_ptr, stride_row, out_ptr, ids_ptr, maxes_ptr, status_ptr, temp_ptr,
                    top_k_ptr, top_p_ptr, n_rows, vocab, SLOTS, GROUP, TILE_GROUPS, SPARSE, REPLACE, SUPER)

    @triton.jit
    def _finish_row(row, logits_ptr, stride_row, out_ptr, ids_ptr, maxes_ptr, status_ptr, temp_ptr, top_k_ptr,
                    top_p_ptr, n_rows, vocab, SLOTS: tl.constexpr, GROUP: tl.constexpr, TILE_GROUPS: tl.constexpr,
                    SPARSE: tl.constexpr, REPLACE: tl.constexpr, SUPER: tl.constexpr):
        """A row's parameters; a row the kernels take gets its k largest logits from its k largest groups (module
        docstring) and its probabilities written (status 1); another is counted for the caller (status 2, and the
        count after the rows' statuses)."""
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
                            m = tl.maximum(tl.max(tl.where(keys < prev, keys, _LOWEST), axis=0),
                                           tl.max(tl.where(top < prev, top, _LOWEST), axis=0))
                            merged = tl.where(ranks == i, m, merged)
                            prev = m
                        top = merged
                        have = total
            if REPLACE:
                top = tl.sort(tl.where(ranks < k, top, _LOWEST), descending=True)
            dst = out_ptr + tl.cast(row, tl.int64) * (_FAST_K if SPARSE else vocab)
            dst_ids = ids_ptr + tl.cast(row, tl.int64) * _FAST_K
            _write_probs(top, k, tl.where(greedy, 1.0, temp), tl.load(top_p_ptr + row).to(tl.float32), dst, dst_ids,
                         vocab, SPARSE)
            tl.store(status_ptr + row, 1)
        else:
            tl.store(status_ptr + row, 2)
            tl.atomic_add(status_ptr + n_rows, 1)


def available() -> bool:
    return triton is not None


def launch_config(vocab: int = 0, sparse: bool = False) -> dict[str, int]:
    """Block sizes and warps of the kernels: the pass takes blocks of PASS_BLOCK logits (at least a group) with
    PASS_WARPS warps, a row keeps at most GROUPS group maxima, the finish reads TILE logits at a time (at least a
    group). FUSE 1: a row's last pass program to arrive finishes the row (one kernel; its finish overlaps the
    other rows' passes); 0: a finish kernel of FINISH_WARPS warps after the pass. Chosen on an H200 (4096 rows,
    top_k 20, iid, sorted and real Gemma rows, 32,000 to 262,144 ids, variants timed in the same rounds;
    tune_groups*.log in results/published/verify-probs-h200-families): FUSE 1 with TILE 1,024 was 1.17x-1.67x
    the copy where the two kernels with TILE 2,048 were 1.27x-2.16x; TILE 512 and 2,048 groups were within noise
    of it, 256-logit tiles, 512 groups, 1,024- or 4,096-logit blocks and 8 warps slower. The sparse mode, whose
    pass only reads, finishes in a kernel of its own with one warp a row: its worst of 5 families 1.59x the read at
    248,320 ids, 1.89x at 151,936, 2.50x at 32,000, against 1.70x, 2.06x and 2.50x fused (run_sparse alone;
    tune_groups_sparse.log in results/published/verify-step-h200-sparse), and in tiles of 512 logits since a tile's
    merge skips the ranks it cannot change: at or below 1,024 in 27 of 30 cells, within 2% in the others
    (tune_sparse_placed*.log there). CHUNKS (slices of rows whose finishes run beside the later slices' passes, on
    a side stream; without FUSE) and REPLACE (the merge by replacing the least: fewer iterations on real rows by
    scripts/count_merge_steps.py's count) are exact (the tests: bitwise the same output) but not yet timed on a
    GPU: off until scripts/tune_sparse_pass.py (c2, c4, c8, replace, replace_c4) says otherwise. Nor SUPER (the
    group pick in two rounds for top_k up to 32, where the row's maxima leave room for its scratch: 146 SASS
    instructions a round of k against 295, scripts/sass_loops.py)."""
    if sparse:
        return {"PASS_BLOCK": 2048, "PASS_WARPS": 4, "GROUPS": 1024, "TILE": 512, "FUSE": 0, "FINISH_WARPS": 1,
                "CHUNKS": 1, "REPLACE": 0, "SUPER": 0}
    return {"PASS_BLOCK": 2048, "PASS_WARPS": 4, "GROUPS": 1024, "TILE": 1024, "FUSE": 1, "FINISH_WARPS": 4,
            "CHUNKS": 1, "REPLACE": 0, "SUPER": 0}


def run(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, config: dict[str, int] | None = None
        ) -> tuple[Tensor, Tensor | None]:
    """The kernels over a batch. temperature, top_k, top_p: [rows] each, on the logits' device (any dtype).
    -> (out [rows, V] fp32, the rows left to the caller or None). Rows left to the caller (top_k above
    FAST_K or the whole vocabulary) are left unwritten: the caller builds them. One synchronisation (the count
    of rows left); the host work before the first kernel is kept short (the GPU waits for it)."""
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


def kernel_shapes(vocab: int, cfg: dict[str, int], sparse: bool) -> dict[str, int]:
    """The constexprs both kernels take, for a vocabulary and a launch configuration (launch_config's keys)."""
    group = group_size(vocab, cfg["GROUPS"])
    return {"SLOTS": max(16, next_power_of_2(triton.cdiv(vocab, group))),  # a tensor of at least 16 (Triton's smallest)
            "GROUP": group, "TILE_GROUPS": max(1, cfg["TILE"] // group), "SPARSE": sparse, "REPLACE": cfg["REPLACE"],
            "SUPER": cfg["SUPER"]}


def _pass_then_finish(n: int, chunks: int, launch_pass: Callable[[int, int], None],
                      launch_finish: Callable[[int, int], None], device: torch.device) -> None:
    """The pass and the finish kernel over slices of cdiv(n, chunks) rows. On CUDA each slice's finish runs on a
    high-priority side stream as soon as the slice's pass is done, so that it fills the SMs beside the next
    slices' passes (the pass is bound by memory, the finish by latency), and the current stream waits for every
    finish before anything queued after this call. Elsewhere (the interpreter): one after the other."""
    step = -(-n // max(1, chunks))
    if device.type != "cuda" or step >= n:
        for row0 in range(0, n, step):
            launch_pass(row0, min(step, n - row0))
            launch_finish(row0, min(step, n - row0))
        return
    main, side = torch.cuda.current_stream(device), _side_stream(device.index)
    for row0 in range(0, n, step):
        launch_pass(row0, min(step, n - row0))
        side.wait_stream(main)
        with torch.cuda.stream(side):
            launch_finish(row0, min(step, n - row0))
    main.wait_stream(side)  # the outputs, and the inputs' memory, belong to the current stream again


@functools.cache
def _side_stream(index: int) -> torch.cuda.Stream:
    """The device's stream for the finish kernels, at the highest priority (torch maps -100 to it): its programs
    are scheduled before the pass's next ones as SMs free up."""
    return torch.cuda.Stream(device=index, priority=-100)


def launch_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it the tensors' (a CPU, under the interpreter: nothing)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _launch(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, config: dict[str, int] | None,
            sparse: bool = False) -> tuple[Tensor, Tensor, Callable[[], Tensor | None]]:
    """(out, ids, left): the output (dense [rows, V], or the sparse values), the sparse ids (the output itself
    when dense: nothing to read), and the synchronisation that reads the rows left to the caller."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    cfg = {**launch_config(vocab, sparse), **(config or {})}
    device = logits.device
    shapes = kernel_shapes(vocab, cfg, sparse)
    group, slots = shapes["GROUP"], shapes["SLOTS"]
    block = max(cfg["PASS_BLOCK"], group)
    out = torch.empty(n, FAST_K if sparse else vocab, dtype=torch.float32, device=device)
    ids = torch.empty(n, FAST_K, dtype=torch.int32, device=device) if sparse else out
    maxes = torch.empty(n, slots, dtype=torch.float32, device=device)
    status = torch.zeros(2 * n + 1, dtype=torch.int32, device=device)  # a status per row, the rows left, arrivals
    fuse = cfg["FUSE"]
    row_args = (logits, logits.stride(0), out, ids, maxes, status, temperature, top_k, top_p, n, vocab)
    blocks = triton.cdiv(vocab, block)

    def launch_pass(row0: int, rows: int) -> None:
        _pass_kernel[(rows * blocks,)](*row_args, row0, BLOCK=block, FUSE=fuse, **shapes, num_warps=cfg["PASS_WARPS"])

    def launch_finish(row0: int, rows: int) -> None:
        _finish_kernel[(rows,)](*row_args, row0, **shapes, num_warps=cfg["FINISH_WARPS"])

    if fuse:
        launch_pass(0, n)
    else:
        _pass_then_finish(n, cfg["CHUNKS"], launch_pass, launch_finish, device)

    def left() -> Tensor | None:
        if int(status[n]) == 0:  # the one synchronisation
            return None
        return (status[:n] == 2).nonzero().squeeze(-1)

    return out, ids, left
