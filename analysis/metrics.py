"""Point metrics per arm: pooled, per base seed, per category and per run.

Definitions (`docs/records.md`; the report's method section says the same in words):
- acceptance length = sum completion_tokens / sum spec_verify_ct over the requests that report verify
  steps: completion tokens per verify step, the first token (emitted by the prefill, without a verify
  step) and tokens past the cap that a step emitted and the server truncated included as the server
  counts them. The request-weighted mean of completion_tokens / spec_verify_ct is secondary.
- correct drafts per verify step = sum spec_num_correct_drafts / sum spec_verify_ct.
- output throughput of a run = sum completion_tokens of its measured requests / (max t_end - min t_sent);
  pooled over runs = sum of tokens / sum of run windows.
- decode throughput of a run (measured) = sum over its requests of (completion_tokens - tokens of the first
  chunk) / length of the union of the requests' [first chunk, last chunk] intervals: output tokens per
  second while at least one stream was decoding. Pooled = sum of tokens / sum of union lengths. The
  per-request decode rate (completion_tokens - first-chunk tokens) / (last chunk - first chunk), averaged
  over requests, is secondary. Schema 1 (no chunk arrays): the first chunk counts as 1 token and
  [t_first_token, t_end] is the interval.
- TTFT = t_first_token - t_start and end-to-end latency = t_end - t_start, where t_start = t_scheduled in
  open loop (request_rate set) and t_sent in closed loop; queueing time = t_sent - t_scheduled (open loop).
- TPOT of a request = (t_end - t_first_token) / (completion_tokens - 1), for 2 tokens or more.
- ITL: each chunk after the first that carries n > 0 tokens gives (its arrival - the previous such chunk's)
  / n, counted n times (SGLang bench_serving's rule); chunks without tokens are skipped. Schema 1: n/a.
- Percentiles (linear interpolation) are pooled over all used requests of an arm (ITL: over its tokens);
  per run for the paired comparison.
Measured requests (for throughput) are all records outside warmup of a finished planned run; every other
figure uses the audit's selection (each planned request once, finished, no error).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.audit import Picked, foreign_load, recompute_hit_cap
from analysis.load import Chunks, Loaded, segment_sums

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "e2e", "itl", "tpot")  # percentile families
MIN_PERCENTILE_VALUES = 100  # a percentile over fewer values is flagged in the report
NO_CATEGORY = "(none)"


@dataclass(frozen=True)
class Partition:
    """A grouping of requests: by run (run_code) or by item (item_code)."""

    name: str  # pooled | seed | category
    labels: tuple
    run_code: np.ndarray | None
    item_code: np.ndarray | None

    def code(self, run: np.ndarray, item: np.ndarray) -> np.ndarray:
        if self.run_code is not None:
            return self.run_code[run]
        assert self.item_code is not None  # every partition has one of the two
        return self.item_code[item]

    @property
    def size(self) -> int:
        return len(self.labels)


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


@dataclass
class RequestTables:
    """The used requests and their partitions: all that the bootstraps over items need, ready before the ITL."""

    arms: list[str]
    baseline: str
    requests: pd.DataFrame  # the used requests, one row each, with integer codes
    partitions: dict[str, Partition]


@dataclass
class Metrics(RequestTables):
    ratios: pd.DataFrame  # (partition, group, arm) -> sums and ratio metrics
    outcomes: pd.DataFrame  # (partition, group, arm) -> planned, used, correct, scored, cap_hits, errors
    runs: pd.DataFrame  # one row per planned run with data
    seed_runs: pd.DataFrame  # (base_seed, arm) -> tokens, window, throughput, runs
    histogram: pd.DataFrame  # bin -> verify steps per arm (empty without histograms)
    pooled_latency: pd.DataFrame  # index "<family>_p<q>" and "queue_mean" / "queue_p99"; one column per arm
    pooled_counts: pd.DataFrame  # index family (ttft, e2e, itl, tpot, queue); values behind each percentile
    open_loop: bool
    chunk_timings: bool  # every used request carries chunk arrays with token counts


def arm_order(data: Loaded, baseline: str) -> list[str]:
    declared = [n for c in data.campaigns for n in c.arm_names]
    seen = [*declared, *data.runs["arm"].tolist()]
    ordered = list(dict.fromkeys([baseline, *seen]))
    return [a for a in ordered if a]


def start(data: Loaded, picked: Picked, arms: list[str], baseline: str,
          pool: Executor) -> tuple[RequestTables, Future[Metrics]]:
    """The metrics in two jobs on `pool` (give it two workers for them: numpy's and pandas' loops release the
    GIL): the ITL, queued first, and the rest once this thread has made the request tables; -> (the tables, the
    metrics to come). Work that needs only the tables can run in this thread meanwhile."""
    arm_of_run = pd.Index(arms).get_indexer(data.runs["arm"]).astype(np.int64)
    used = picked.selection.used
    itl_job = pool.submit(itl_summary, data.chunks, np.flatnonzero(used), data.records["_run"].to_numpy()[used],
                          arm_of_run, len(arms))
    tables = RequestTables(arms, baseline, request_frame(data, picked, arm_of_run), partitions(data))
    return tables, pool.submit(_finish, data, picked, tables, arm_of_run, itl_job)


def _finish(data: Loaded, picked: Picked, tables: RequestTables, arm_of_run: np.ndarray,
            itl_job: Future[ItlSummary]) -> Metrics:
    arms, req, parts = tables.arms, tables.requests, tables.partitions
    ratios = ratio_table(req, parts, arms)
    outcomes = outcome_table(data, picked, req, parts, arms, arm_of_run)
    histogram = histogram_table(data, picked, arm_of_run, arms)
    runs = run_table(data, picked, req, itl_job.result, arm_of_run)  # waits for the ITL once the rest is done
    latency, counts = pooled_latency(req, itl_job.result(), len(arms), arms)
    return Metrics(
        arms=arms,
        baseline=tables.baseline,
        requests=req,
        partitions=parts,
        ratios=ratios,
        outcomes=outcomes,
        runs=runs,
        seed_runs=seed_run_table(runs),
        histogram=histogram,
        pooled_latency=latency,
        pooled_counts=counts,
        open_loop=any(c.open_loop for c in data.campaigns),
        chunk_timings=bool(len(req)) and bool(req["chunked"].all()),
    )


def partitions(data: Loaded) -> dict[str, Partition]:
    runs, items = data.runs, data.items
    seeds = sorted({int(s) for s in runs["base_seed"].dropna()})
    seed_code = np.array([seeds.index(int(s)) if pd.notna(s) else -1 for s in runs["base_seed"]], dtype=np.int64)
    cats = items["category"].astype(object).where(items["category"].notna(), NO_CATEGORY).astype(str)
    cat_labels = sorted(cats.unique())
    cat_code = pd.Index(cat_labels).get_indexer(cats).astype(np.int64)
    out = {
        "pooled": Partition("pooled", ("all",), np.zeros(len(runs), np.int64), None),
        "seed": Partition("seed", tuple(seeds), seed_code, None),
    }
    if cat_labels and cat_labels != [NO_CATEGORY]:
        out["category"] = Partition("category", tuple(cat_labels), None, cat_code)
    return out


def _chunk_ends(chunks: Chunks, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per record in `rows`: has chunk times, first and last chunk offset (s after t_sent), first-chunk tokens."""
    if len(chunks.us_present) == 0:
        nan = np.full(len(rows), np.nan)
        return np.zeros(len(rows), bool), nan, nan, np.ones(len(rows))
    start, stop = chunks.us_offsets[rows], chunks.us_offsets[rows + 1]
    has = chunks.us_present[rows] & (stop > start)
    safe_first = np.where(has, start, 0)
    safe_last = np.where(has, stop - 1, 0)
    us = chunks.us if len(chunks.us) else np.zeros(1, np.int64)
    first = np.where(has, us[safe_first] / 1e6, np.nan)
    last = np.where(has, us[safe_last] / 1e6, np.nan)
    aligned = chunks.aligned[rows] & has
    tok = chunks.tok if len(chunks.tok) else np.zeros(1, np.int64)
    first_tokens = np.where(aligned, tok[np.where(aligned, chunks.tok_offsets[rows], 0)], 1).astype(float)
    return aligned, first, last, first_tokens


def request_frame(data: Loaded, picked: Picked, arm_of_run: np.ndarray) -> pd.DataFrame:
    used = picked.selection.used
    rows = np.flatnonzero(used)
    rec = data.records
    run = rec["_run"].to_numpy()[used]
    ct, vct = rec["completion_tokens"].to_numpy()[used], rec["spec_verify_ct"].to_numpy()[used]
    t_sent, t_first, t_end = (rec[c].to_numpy()[used] for c in ("t_sent", "t_first_token", "t_end"))
    t_sched = rec["t_scheduled"].to_numpy()[used]
    open_loop = data.runs["open_loop"].to_numpy(dtype=bool)[run] if len(run) else np.zeros(0, bool)
    t_start = np.where(open_loop & np.isfinite(t_sched), t_sched, t_sent)
    chunked, c_first, c_last, first_tokens = _chunk_ends(data.chunks, rows)
    d0 = np.where(np.isfinite(c_first), t_sent + c_first, t_first)
    d1 = np.where(np.isfinite(c_last), t_sent + c_last, t_end)
    decode_tokens = np.where(np.isfinite(d0) & np.isfinite(d1), np.maximum(ct - first_tokens, 0), np.nan)
    spec = (vct > 0) & ~np.isnan(ct)
    with np.errstate(divide="ignore", invalid="ignore"):
        al = np.where(spec, ct / vct, np.nan)
        rate = np.where((decode_tokens > 0) & (d1 > d0), decode_tokens / (d1 - d0), np.nan)
        tpot = np.where((ct >= 2) & (t_end >= t_first), (t_end - t_first) / (ct - 1), np.nan)
    return pd.DataFrame({
        "run": run,
        "item": rec["_item"].to_numpy()[used],
        "arm": arm_of_run[run],
        "spec": spec,
        "ct": ct,
        "vct": np.where(spec, vct, 0.0),
        "ncd": np.where(spec, np.nan_to_num(rec["spec_num_correct_drafts"].to_numpy()[used]), 0.0),
        "al": al,
        "correct": rec["correct"].to_numpy()[used],
        "hit_cap": recompute_hit_cap(rec)[used],
        "ttft": t_first - t_start,
        "e2e": t_end - t_start,
        "queue": np.where(open_loop, t_sent - t_sched, np.nan),
        "tpot": tpot,
        "decode_tokens": decode_tokens,
        "decode_start": d0,
        "decode_end": d1,
        "decode_rate": rate,
        "chunked": chunked,
    })


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


def _itl_block(chunks: Chunks, tok: np.ndarray, lengths: np.ndarray, selected: np.ndarray,
               run_of_record: np.ndarray, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
        if _packed(gap, tokens, keys[filled:filled + len(gap)]) is None:  # a value that does not pack
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


def itl_summary(chunks: Chunks, rows: np.ndarray, run_of_row: np.ndarray, arm_of_run: np.ndarray,
                n_arms: int) -> ItlSummary:
    """ITL percentiles of the used records `rows` (run_of_row: their runs), per run and pooled per arm."""
    n_runs = len(arm_of_run)
    itl = itl_by_run(chunks, rows, run_of_row, n_runs)
    per_run = np.array([itl.run_percentiles(r, PERCENTILES) for r in range(n_runs)]).reshape(n_runs, len(PERCENTILES))
    arm_of_row = arm_of_run[run_of_row]
    return ItlSummary(per_run, [itl.pooled(np.unique(run_of_row[arm_of_row == a]).tolist(), PERCENTILES)
                                for a in range(n_arms)])


def _tokens_per_chunk(chunks: Chunks, selected: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """chunk_tokens laid out like chunk_us (zeros where a record is not selected)."""
    if np.array_equal(chunks.tok_offsets, chunks.us_offsets):
        return chunks.tok
    tok = np.zeros(len(chunks.us), dtype=np.int64)
    for r in np.flatnonzero(selected & (lengths > 0)):  # rare: some records lack chunk_tokens
        a, b = chunks.us_offsets[r], chunks.us_offsets[r + 1]
        tok[a:b] = chunks.tok[chunks.tok_offsets[r]:chunks.tok_offsets[r] + (b - a)]
    return tok


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...],
                         presorted: bool = False) -> list[float]:
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
    return [float(seconds[2 * i] + (h - lo) * (seconds[2 * i + 1] - seconds[2 * i]))
            for i, (h, lo, _) in enumerate(spots)]


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
        out[mine] = _select(inside, positions[mine] - (cum[b - 1] if b else 0), first,
                            min(hi, first + (1 << shift) - 1))
    return out


def _packed(gap: np.ndarray, tokens: np.ndarray, keys: np.ndarray | None = None) -> np.ndarray | None:
    """gap_us / tokens in ns, rounded, x 2^20 + tokens (int64; into `keys` when given), or None when a value does
    not pack."""
    if len(tokens) and tokens.max() > _W_MASK:
        return None
    keys = np.empty(len(gap), dtype=np.int64) if keys is None else keys
    limit = 2.0 ** (62 - _W_BITS)
    for a in range(0, len(gap), _BLOCK):  # in blocks: the float temporaries are reused
        ns = gap[a:a + _BLOCK] * 1000.0
        ns /= tokens[a:a + _BLOCK]
        np.rint(ns, out=ns)
        if len(ns) and not (ns.max() < limit and ns.min() > -limit):  # NaN fails both
            return None
        keys[a:a + _BLOCK] = ns
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


def _percentile(values: np.ndarray, q: float) -> float:
    finite = values[np.isfinite(values)]
    return float(np.percentile(finite, q)) if finite.size else float("nan")


def pooled_latency(req: pd.DataFrame, itl: ItlSummary, n_arms: int, arms: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Percentiles pooled over all used requests (ITL: tokens) of each arm, and how many values each has."""
    arm = req["arm"].to_numpy()
    values: dict[str, list[float]] = {}
    counts: dict[str, list[float]] = {}
    for family in LATENCIES:
        for q in PERCENTILES:
            values[f"{family}_p{q}"] = []
        counts[family] = []
    values["queue_mean"], values["queue_p99"], counts["queue"] = [], [], []
    for a in range(n_arms):
        for family in ("ttft", "e2e", "tpot"):
            col = req[family].to_numpy()[arm == a]
            counts[family].append(float(np.isfinite(col).sum()))
            for q in PERCENTILES:
                values[f"{family}_p{q}"].append(_percentile(col, q))
        pooled, tokens = itl.pooled[a]
        counts["itl"].append(float(tokens))
        for q, x in zip(PERCENTILES, pooled, strict=True):
            values[f"itl_p{q}"].append(x)
        queue = req["queue"].to_numpy()[arm == a]
        finite = queue[np.isfinite(queue)]
        counts["queue"].append(float(finite.size))
        values["queue_mean"].append(float(finite.mean()) if finite.size else float("nan"))
        values["queue_p99"].append(_percentile(queue, 99))
    latency = pd.DataFrame.from_dict(values, orient="index", columns=arms)
    return latency, pd.DataFrame.from_dict(counts, orient="index", columns=arms)


def _group_sums(code: np.ndarray, arm: np.ndarray, n_groups: int, n_arms: int, weights: np.ndarray) -> np.ndarray:
    ok = (code >= 0) & (arm >= 0)
    flat = np.bincount(code[ok] * n_arms + arm[ok], weights=weights[ok], minlength=n_groups * n_arms)
    return flat.reshape(n_groups, n_arms)


def _long(part: Partition, arms: list[str], columns: dict[str, np.ndarray]) -> pd.DataFrame:
    g, a = np.meshgrid(np.arange(part.size), np.arange(len(arms)), indexing="ij")
    frame = pd.DataFrame({
        "partition": part.name,
        "group": [part.labels[i] for i in g.ravel()],
        "arm": [arms[i] for i in a.ravel()],
    })
    for name, values in columns.items():
        frame[name] = values.ravel()
    return frame


def ratio_table(req: pd.DataFrame, parts: dict[str, Partition], arms: list[str]) -> pd.DataFrame:
    run, item, arm = req["run"].to_numpy(), req["item"].to_numpy(), req["arm"].to_numpy()
    spec = req["spec"].to_numpy()
    weights = {
        "requests": spec.astype(float),
        "tokens": np.where(spec, req["ct"].to_numpy(), 0.0),
        "verify_steps": req["vct"].to_numpy(),
        "correct_drafts": req["ncd"].to_numpy(),
        "al_sum": np.nan_to_num(req["al"].to_numpy()),
    }
    frames = []
    for part in parts.values():
        code = part.code(run, item)
        cols = {k: _group_sums(code, arm, part.size, len(arms), w) for k, w in weights.items()}
        frames.append(_long(part, arms, cols))
    out = pd.concat(frames, ignore_index=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["acceptance_length"] = out["tokens"] / out["verify_steps"].where(out["verify_steps"] > 0)
        out["al_request_mean"] = out["al_sum"] / out["requests"].where(out["requests"] > 0)
        out["correct_drafts_per_step"] = out["correct_drafts"] / out["verify_steps"].where(out["verify_steps"] > 0)
    return out


def outcome_table(
    data: Loaded, picked: Picked, req: pd.DataFrame, parts: dict[str, Partition], arms: list[str],
    arm_of_run: np.ndarray,
) -> pd.DataFrame:
    plan = picked.plan
    rec = data.records
    err = picked.selection.errored
    err_run, err_item = rec["_run"].to_numpy()[err], rec["_item"].to_numpy()[err]
    run, item, arm = req["run"].to_numpy(), req["item"].to_numpy(), req["arm"].to_numpy()
    correct = req["correct"].to_numpy()
    frames = []
    for part in parts.values():
        code = part.code(run, item)
        n, a = part.size, len(arms)
        cols = {
            "planned": _group_sums(part.code(plan.run, plan.item), arm_of_run[plan.run], n, a,
                                   np.ones(len(plan.run))),
            "used": _group_sums(code, arm, n, a, np.ones(len(run))),
            "correct": _group_sums(code, arm, n, a, (correct == 1).astype(float)),
            "scored": _group_sums(code, arm, n, a, (~np.isnan(correct)).astype(float)),
            "cap_hits": _group_sums(code, arm, n, a, req["hit_cap"].to_numpy().astype(float)),
            "errors": _group_sums(part.code(err_run, err_item), arm_of_run[err_run], n, a, np.ones(len(err_run))),
        }
        frames.append(_long(part, arms, {k: v.astype(np.int64) for k, v in cols.items()}))
    out = pd.concat(frames, ignore_index=True)
    out["missing"] = out["planned"] - out["used"] - out["errors"]
    return out


def run_table(data: Loaded, picked: Picked, req: pd.DataFrame, itl: Callable[[], ItlSummary],
              arm_of_run: np.ndarray) -> pd.DataFrame:
    """One row per planned finished run. itl: gives the ITL summary; called once every other column is made."""
    runs = data.runs
    rec = data.records
    meas = picked.selection.measured
    m_run = rec["_run"].to_numpy()[meas]
    n = len(runs)
    tokens = np.bincount(m_run, weights=np.nan_to_num(rec["completion_tokens"].to_numpy()[meas]), minlength=n)
    t0 = _group_extreme(m_run, rec["t_sent"].to_numpy()[meas], n, np.minimum, np.inf)
    t1 = _group_extreme(m_run, rec["t_end"].to_numpy()[meas], n, np.maximum, -np.inf)
    window = np.where(np.isfinite(t0) & np.isfinite(t1) & (t1 > t0), t1 - t0, np.nan)
    out = runs[["run", "campaign", "campaign_id", "run_id", "arm", "base_seed", "repeat", "order", "status",
                "server_accept_length", "machine_recorded", "cpu_other_frac", "steal_frac", "cpu_other_before",
                "cpu_other_after"]].copy()
    out["foreign_load"] = foreign_load(runs)
    out["measured"] = np.bincount(m_run, minlength=n)
    out["tokens"] = tokens
    out["window_s"] = window
    out["throughput"] = tokens / window
    out = out.join(_per_run_request_stats(req, itl, n), on="run")
    with np.errstate(divide="ignore", invalid="ignore"):
        out["decode_tps"] = out["decode_tokens"] / out["decode_span_s"].where(out["decode_span_s"] > 0)
    keep = runs["planned"].to_numpy() & (runs["status"] == "finished").to_numpy() & (arm_of_run >= 0)
    return out[keep].reset_index(drop=True)


def _group_extreme(group: np.ndarray, values: np.ndarray, n: int, ufunc: np.ufunc, fill: float) -> np.ndarray:
    out = np.full(n, fill)
    ok = ~np.isnan(values)
    ufunc.at(out, group[ok], values[ok])
    return out


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of the intervals [start_i, end_i] (empty or reversed ones count for nothing)."""
    ok = np.isfinite(start) & np.isfinite(end) & (end > start)
    if not ok.any():
        return 0.0
    order = np.argsort(start[ok], kind="stable")
    s, e = start[ok][order], end[ok][order]
    reach = np.maximum.accumulate(e)
    before = np.concatenate([[-np.inf], reach[:-1]])
    return float(np.sum(np.maximum(reach - np.maximum(s, before), 0.0)))


def _per_run_request_stats(req: pd.DataFrame, itl: Callable[[], ItlSummary], n_runs: int) -> pd.DataFrame:
    """Per-run sums and percentiles (the ITL's from `itl()`, called last)."""
    run = req["run"].to_numpy()
    order = np.argsort(run, kind="stable")
    bounds = np.searchsorted(run[order], np.arange(n_runs + 1))
    spec = req["spec"].to_numpy()
    sums = {k: np.bincount(run, weights=req[k].to_numpy() if k != "n" else None, minlength=n_runs)
            for k in ("ct", "vct", "n")}
    rows = {"used": sums["n"], "acceptance_length": np.full(n_runs, np.nan)}
    ct_spec = np.bincount(run, weights=np.where(spec, req["ct"].to_numpy(), 0.0), minlength=n_runs)
    with np.errstate(divide="ignore", invalid="ignore"):
        rows["acceptance_length"] = np.where(sums["vct"] > 0, ct_spec / sums["vct"], np.nan)
    rows["decode_tokens"] = np.bincount(run, weights=np.nan_to_num(req["decode_tokens"].to_numpy()), minlength=n_runs)
    cols = {k: req[k].to_numpy()[order] for k in ("decode_rate", "ttft", "e2e", "tpot", "decode_start", "decode_end")}
    rows["decode_span_s"] = np.array([union_length(cols["decode_start"][bounds[i]:bounds[i + 1]],
                                                   cols["decode_end"][bounds[i]:bounds[i + 1]])
                                      for i in range(n_runs)])
    rows["decode_rate_mean"] = _slice_stat(cols["decode_rate"], bounds, np.nanmean)
    for family in ("ttft", "e2e", "tpot"):
        for p in PERCENTILES:
            rows[f"{family}_p{p}"] = _slice_stat(cols[family], bounds, lambda v, p=p: np.nanpercentile(v, p))
    per_run = itl().per_run
    for k, p in enumerate(PERCENTILES):
        rows[f"itl_p{p}"] = per_run[:, k]
    return pd.DataFrame(rows, index=pd.RangeIndex(n_runs, name="run"))


def _slice_stat(values: np.ndarray, bounds: np.ndarray, fn) -> np.ndarray:
    out = np.full(len(bounds) - 1, np.nan)
    for i in range(len(bounds) - 1):
        chunk = values[bounds[i]:bounds[i + 1]]
        if chunk.size and not np.all(np.isnan(chunk)):
            out[i] = fn(chunk)
    return out


def seed_run_table(runs: pd.DataFrame) -> pd.DataFrame:
    ok = runs[np.isfinite(runs["window_s"])]
    grouped = ok.groupby(["base_seed", "arm"], sort=True)
    out = grouped.agg(tokens=("tokens", "sum"), window_s=("window_s", "sum"), runs=("run", "count"),
                      decode_tokens=("decode_tokens", "sum"), decode_span_s=("decode_span_s", "sum"))
    out["throughput"] = out["tokens"] / out["window_s"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["decode_tps"] = out["decode_tokens"] / out["decode_span_s"].where(out["decode_span_s"] > 0)
    return out.reset_index()


def histogram_table(data: Loaded, picked: Picked, arm_of_run: np.ndarray, arms: list[str]) -> pd.DataFrame:
    """Verify steps by number of correct drafts, summed over the used requests of each arm."""
    hist = data.hist
    keep = picked.selection.used & hist.present
    if not keep.any():
        return pd.DataFrame()
    arm = arm_of_run[data.records["_run"].to_numpy()]
    sums = np.stack([hist.dense[keep & (arm == a)].sum(axis=0) for a in range(len(arms))], axis=1)
    table = pd.DataFrame(sums, columns=arms)
    table.index.name = "correct_drafts"
    return table
