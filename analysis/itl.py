"""The ITL engine: inter-token latencies from the records' chunk arrays (`chunk_us`, `chunk_tokens`) and their
percentiles, pooled per arm and per run, without sorting every value.

ITL: each chunk after the first that carries n > 0 tokens gives (its arrival - the previous such chunk's) / n,
counted n times (SGLang bench_serving's rule); chunks without tokens are skipped. Schema 1 records (no chunk arrays)
have none. analysis.metrics calls it for the latency tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from analysis.load import Chunks, segment_sums

PERCENTILES = (50, 90, 99)  # the latency percentiles the report prints


@dataclass(frozen=True)
class Itl:
    """Inter-token latencies of the used requests: one entry per (request, chunk after its first), worth
    gap_us / tokens microseconds per token and counted `tokens` times."""

    run: np.ndarray  # int32
    gap_us: np.ndarray  # int64: arrival after the request's previous chunk with tokens
    tokens: np.ndarray  # int64: tokens the chunk carried (> 0)

    @property
    def value(self) -> np.ndarray:
        """Seconds per token."""
        return self.gap_us / 1e6 / self.tokens


_BLOCK = 1 << 20  # chunks per block: temporaries stay small enough to be reused, not page-faulted afresh


def itl_values(chunks: Chunks, rows: np.ndarray, run_of_row: np.ndarray) -> Itl:
    """ITL of the records `rows` (used requests, in order) whose chunk lists carry token counts.

    Works on the flat chunk arrays, a block of whole records at a time, with per-record masks expanded by
    np.repeat (no per-request loop)."""
    if len(chunks.us_present) == 0 or len(rows) == 0 or len(chunks.us) == 0:
        return Itl(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    parts = list(_itl_blocks(chunks, rows, run_of_row))
    return Itl(*(np.concatenate([p[k] for p in parts]) for k in range(3)))


def _itl_blocks(chunks: Chunks, rows: np.ndarray, run_of_row: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """(run, gap_us, tokens) of the records `rows`, a block of whole records (about _BLOCK chunks) at a time."""
    n = len(chunks.us_present)
    lengths = np.diff(chunks.us_offsets)
    selected = np.zeros(n, dtype=bool)
    selected[rows] = chunks.aligned[rows]
    tok = _tokens_per_chunk(chunks, selected, lengths)
    run_of_record = np.full(n, -1, dtype=np.int32)
    run_of_record[rows] = run_of_row
    cuts = np.unique(np.searchsorted(chunks.us_offsets, np.arange(0, len(chunks.us), _BLOCK), side="right") - 1)
    for a, b in zip(cuts, [*cuts[1:], n], strict=True):
        yield _itl_block(chunks, tok, lengths, selected, run_of_record, int(a), int(b))


def _itl_block(
    chunks: Chunks,
    tok: np.ndarray,
    lengths: np.ndarray,
    selected: np.ndarray,
    run_of_record: np.ndarray,
    r0: int,
    r1: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(run, gap_us, tokens) of records r0..r1-1."""
    base, end = chunks.us_offsets[r0], chunks.us_offsets[r1]
    us, tk, ln = chunks.us[base:end], tok[base:end], lengths[r0:r1]
    first = np.zeros(end - base, dtype=bool)
    first[chunks.us_offsets[r0:r1][ln > 0] - base] = True
    keep = np.repeat(selected[r0:r1], ln) & (first | (tk > 0))  # later chunks without tokens are skipped
    run = np.repeat(run_of_record[r0:r1], ln)
    if not keep.all():
        idx = np.flatnonzero(keep)
        us, first, tk, run = us[idx], first[idx], tk[idx], run[idx]
    later = ~first[1:]  # chunk j + 1 is not a first chunk: its predecessor j is in the same request
    return run[1:][later], np.diff(us)[later], tk[1:][later].astype(np.int64)


def itl_by_run(chunks: Chunks, rows: np.ndarray, run_of_row: np.ndarray, n_runs: int) -> ItlByRun:
    """group_by_run(itl_values(...)) in one pass when the records come run by run (as load() reads them) and every
    value packs into a key: each block's ITL goes straight into its run's packed keys (no run, gap and token
    arrays of every chunk, no concatenation, no reordering)."""
    if len(chunks.us_present) == 0 or len(rows) == 0 or len(chunks.us) == 0 or np.any(np.diff(run_of_row) < 0):
        return group_by_run(itl_values(chunks, rows, run_of_row), n_runs)
    keys = np.empty(len(chunks.us), dtype=np.int64)
    counts, weights = np.zeros(n_runs, dtype=np.int64), np.zeros(n_runs, dtype=np.int64)
    filled = 0
    for run, gap, tokens in _itl_blocks(chunks, rows, run_of_row):
        if _packed(gap, tokens, keys[filled : filled + len(gap)]) is None:  # a value that does not pack
            return group_by_run(itl_values(chunks, rows, run_of_row), n_runs)
        filled += len(gap)
        edges, sums = _run_sums(run, tokens, n_runs)  # the block's values come run by run
        counts += np.diff(edges)
        weights += sums
    return ItlByRun(np.concatenate([[0], np.cumsum(counts)]), keys[:filled], tokens=weights)


@dataclass(frozen=True)
class ItlSummary:
    """The ITL percentiles the tables print: per run [runs, PERCENTILES], and pooled over each arm's runs (the
    percentiles and the tokens behind them)."""

    per_run: np.ndarray
    pooled: list[tuple[list[float], int]]


def itl_summary(
    chunks: Chunks, rows: np.ndarray, run_of_row: np.ndarray, arm_of_run: np.ndarray, n_arms: int
) -> ItlSummary:
    """ITL percentiles of the used records `rows` (run_of_row: their runs), per run and pooled per arm."""
    n_runs = len(arm_of_run)
    itl = itl_by_run(chunks, rows, run_of_row, n_runs)
    per_run = np.array([itl.run_percentiles(r, PERCENTILES) for r in range(n_runs)]).reshape(n_runs, len(PERCENTILES))
    arm_of_row = arm_of_run[run_of_row]
    return ItlSummary(
        per_run, [itl.pooled(np.unique(run_of_row[arm_of_row == a]).tolist(), PERCENTILES) for a in range(n_arms)]
    )


def _tokens_per_chunk(chunks: Chunks, selected: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """chunk_tokens laid out like chunk_us (zeros where a record is not selected)."""
    if np.array_equal(chunks.tok_offsets, chunks.us_offsets):
        return chunks.tok
    tok = np.zeros(len(chunks.us), dtype=np.int64)
    for r in np.flatnonzero(selected & (lengths > 0)):  # rare: some records lack chunk_tokens
        a, b = chunks.us_offsets[r], chunks.us_offsets[r + 1]
        tok[a:b] = chunks.tok[chunks.tok_offsets[r] : chunks.tok_offsets[r] + (b - a)]
    return tok


def weighted_percentiles(
    values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...], presorted: bool = False
) -> list[float]:
    """np.percentile(np.repeat(values, weights), q) for each q (linear interpolation; integer weights),
    without repeating anything: one sort, then the repeated positions are found in the cumulative weights.
    presorted: values are sorted, finite, and their weights positive."""
    if not presorted:
        ok = np.isfinite(values) & (weights > 0)
        order = np.argsort(values[ok])
        values, weights = values[ok][order], weights[ok][order]
    if values.size == 0:
        return [float("nan")] * len(qs)
    cw = np.cumsum(weights)
    out = []
    for h, lo, hi in _spots(int(cw[-1]), qs):
        at = np.searchsorted(cw, [lo, hi], side="right")  # value at repeated position k: first cw > k
        out.append(float(values[at[0]] + (h - lo) * (values[at[1]] - values[at[0]])))
    return out


def _spots(total: int, qs: tuple[float, ...]) -> list[tuple[float, int, int]]:
    """For each q, np.percentile's linear interpolation over `total` repeated values: (h, lo, hi), the value at
    h between those at repeated positions lo and hi."""
    out = []
    for q in qs:
        h = (total - 1) * q / 100.0
        lo = int(np.floor(h))
        out.append((h, lo, min(lo + 1, total - 1)))
    return out


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """np.percentile(np.repeat(values, weights), q) (see weighted_percentiles)."""
    return weighted_percentiles(values, weights, (q,))[0]


# ITL values are kept as int64 keys, nanoseconds per token x 2^20 + tokens: integers order as the values do, each
# carries its token count, and their percentiles are selected by counting (select_keys) rather than sorted. A
# value is kept to the nanosecond (the report prints 10 microseconds). A chunk of 2^20 tokens or more, or a gap
# beyond 2^42 ns (73 minutes) per token, falls back to sorting floats.
_W_BITS = 20


_W_MASK = (1 << _W_BITS) - 1


@dataclass(frozen=True)
class ItlByRun:
    """ITL grouped by run: run r is bounds[r]:bounds[r + 1] of `keys` (packed, in no particular order; percentiles
    by selection), or of `values` / `weights` (the float fallback, sorted within each run)."""

    bounds: np.ndarray
    keys: np.ndarray | None
    values: np.ndarray | None = None
    weights: np.ndarray | None = None
    tokens: np.ndarray | None = None  # [runs] with packed keys: the tokens (weights) of each run

    def _slice(self, r: int) -> slice:
        return slice(int(self.bounds[r]), int(self.bounds[r + 1]))

    def _floats(self) -> tuple[np.ndarray, np.ndarray]:
        """`values` and `weights`, which the float fallback (keys None) sets."""
        assert self.values is not None and self.weights is not None
        return self.values, self.weights

    def _parts(self, runs: list[int]) -> tuple[list[np.ndarray], int]:
        """The packed keys of `runs` and their tokens."""
        assert self.keys is not None and self.tokens is not None
        return [self.keys[self._slice(r)] for r in runs], int(self.tokens[runs].sum())

    def run_percentiles(self, r: int, qs: tuple[float, ...]) -> list[float]:
        if self.keys is not None:
            return key_percentiles(*self._parts([r]), qs)
        values, weights = self._floats()
        return weighted_percentiles(values[self._slice(r)], weights[self._slice(r)], qs, presorted=True)

    def pooled(self, runs: list[int], qs: tuple[float, ...]) -> tuple[list[float], int]:
        """Percentiles over the tokens of `runs` together, and how many tokens."""
        if self.keys is not None:
            parts, total = self._parts(runs)
            return key_percentiles(parts, total, qs), total
        all_values, all_weights = self._floats()
        values = np.concatenate([all_values[self._slice(r)] for r in runs] or [np.zeros(0)])
        weights = np.concatenate([all_weights[self._slice(r)] for r in runs] or [np.zeros(0)])
        order = np.argsort(values, kind="stable")
        return weighted_percentiles(values[order], weights[order], qs, presorted=True), int(weights.sum())


def key_percentiles(parts: list[np.ndarray], total: int, qs: tuple[float, ...]) -> list[float]:
    """weighted_percentiles of the packed keys (value in ns x 2^20 + weight) of `parts` together (`total`: their
    weights), in seconds: the keys at np.percentile's repeated positions are selected (select_keys), not sorted."""
    if total == 0:
        return [float("nan")] * len(qs)
    spots = _spots(total, qs)
    at = select_keys(parts, np.array([k for _, lo, hi in spots for k in (lo, hi)], dtype=np.int64))
    seconds = (at >> _W_BITS) / 1e9
    return [
        float(seconds[2 * i] + (h - lo) * (seconds[2 * i + 1] - seconds[2 * i])) for i, (h, lo, _) in enumerate(spots)
    ]


_SMALL = 1 << 12  # a selection sorts what is left once it has narrowed to this many keys


_BUCKET_BITS = 16  # each step of a selection splits what is left into at most 2^16 + 1 buckets of key values


def select_keys(parts: list[np.ndarray], positions: np.ndarray) -> np.ndarray:
    """The key at each repeated position k (0-based): with the keys of `parts` sorted and each repeated by its
    weight (its low _W_BITS), the smallest key v whose keys at or below it weigh more than k. A radix selection:
    each step counts the weights in buckets of the remaining key range and keeps the bucket of each position,
    until few keys are left (then sorted): a few passes over the keys instead of a sort of them all."""
    parts = [p for p in parts if len(p)]
    lo = min(int(p.min()) for p in parts)
    hi = max(int(p.max()) for p in parts)
    return _select(parts, positions, lo, hi)


def _select(parts: list[np.ndarray], positions: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """select_keys within the keys lo..hi (all of `parts`), `positions` counted from lo."""
    if sum(len(p) for p in parts) <= _SMALL:
        keys = np.sort(np.concatenate(parts))
        return keys[np.searchsorted(np.cumsum(keys & _W_MASK), positions, side="right")]
    shift = max(0, (hi - lo).bit_length() - _BUCKET_BITS)
    buckets = [(p - lo) >> shift for p in parts]
    weight = np.zeros(((hi - lo) >> shift) + 1, dtype=np.int64)
    for p, bucket in zip(parts, buckets, strict=True):  # float sums of integer weights: exact below 2^53
        weight += np.bincount(bucket, weights=p & _W_MASK, minlength=len(weight)).astype(np.int64)
    cum = np.cumsum(weight)
    of = np.searchsorted(cum, positions, side="right")  # each position's bucket
    out = np.empty(len(positions), dtype=np.int64)
    for b in np.unique(of):
        mine, first = of == b, lo + (int(b) << shift)
        if shift == 0:  # a bucket of one key value
            out[mine] = first
            continue
        inside = [q for q in (p[bucket == b] for p, bucket in zip(parts, buckets, strict=True)) if len(q)]
        out[mine] = _select(
            inside, positions[mine] - (cum[b - 1] if b else 0), first, min(hi, first + (1 << shift) - 1)
        )
    return out


def _packed(gap: np.ndarray, tokens: np.ndarray, keys: np.ndarray | None = None) -> np.ndarray | None:
    """gap_us / tokens in ns, rounded, x 2^20 + tokens (int64; into `keys` when given), or None when a value does
    not pack."""
    if len(tokens) and tokens.max() > _W_MASK:
        return None
    keys = np.empty(len(gap), dtype=np.int64) if keys is None else keys
    limit = 2.0 ** (62 - _W_BITS)
    for a in range(0, len(gap), _BLOCK):  # in blocks: the float temporaries are reused
        ns = gap[a : a + _BLOCK] * 1000.0
        ns /= tokens[a : a + _BLOCK]
        np.rint(ns, out=ns)
        if len(ns) and not (ns.max() < limit and ns.min() > -limit):  # NaN fails both
            return None
        keys[a : a + _BLOCK] = ns
    keys <<= _W_BITS
    keys += tokens
    return keys


def _run_sums(run: np.ndarray, tokens: np.ndarray, n_runs: int) -> tuple[np.ndarray, np.ndarray]:
    """For values grouped by run (`run` non-decreasing): where each run's values start and end ([n_runs + 1]) and
    each run's tokens ([n_runs])."""
    edges = np.searchsorted(run, np.arange(n_runs + 1))
    return edges, segment_sums(tokens, edges)


def group_by_run(itl: Itl, n_runs: int) -> ItlByRun:
    """The ITL grouped by run: packed keys, or (a value that does not pack) floats sorted within each run."""
    run, gap, tokens = itl.run, itl.gap_us, itl.tokens
    if len(run) > 1 and np.any(np.diff(run) < 0):
        order = np.argsort(run, kind="stable")
        run, gap, tokens = run[order], gap[order], tokens[order]
    bounds, sums = _run_sums(run, tokens, n_runs)
    keys = _packed(gap, tokens)
    if keys is not None:
        return ItlByRun(bounds, keys, tokens=sums)
    values, weights = gap / 1e6 / tokens, tokens.astype(float)
    for r in range(n_runs):
        a, b = bounds[r], bounds[r + 1]
        order = np.argsort(values[a:b])
        values[a:b], weights[a:b] = values[a:b][order], weights[a:b][order]
    return ItlByRun(bounds, None, values, weights)
