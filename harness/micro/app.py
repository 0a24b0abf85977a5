"""The microbenchmark run: for each logit family, vocabulary and batch size, time the copy floor and every
implementation.

`run` is the whole job below the Hydra entry point; it takes typed configuration only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from harness import verify
from harness.contract import to_json, write_json
from harness.host import envinfo
from harness.host.devices import check_fits, resolve_device
from harness.micro import bank, measure
from harness.micro.compare import OutputMatch, compare_outputs, tied_rows, unexplained_rows
from harness.micro.config import MicroConfig
from harness.micro.families import FAMILIES, check_families, make_family
from harness.micro.impls import REGISTRY, Impl, ImplError, check_names, resolve_impls
from harness.micro.inputs import (
    DTYPES,
    RowParams,
    make_params,
    padding_row_count,
    rotated_copies,
)
from harness.validation import ConfigError, new_out_dir

MICRO_SCHEMA_VERSION = 1  # of the microbenchmark's own files (manifest.json, results.jsonl under results/micro)
Step = Callable[[str], None]


@dataclass
class ResultRow:
    """One line of results.jsonl: one implementation at one batch size."""

    impl: str
    rows: int
    vocab: int
    status: str  # ok | skipped | error
    top_k: int
    top_p: float
    temperature: float
    dtype: str
    padding_fraction: float
    padding_rows: int
    device: str
    family: str = "iid"  # the logit family (harness.micro.families)
    bank_rows: int | None = None  # a real family: how many distinct rows of the logit bank were tiled
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    repeats: int = 0
    peak_temp_bytes: int | None = None  # None on the CPU: not measured
    bitwise_equal: bool | None = None  # torch.equal with the baseline's output
    kept_sets_equal: bool | None = None
    rows_differ: int | None = None  # rows whose kept set differs from the baseline's
    rows_unexplained: int | None = None  # of them, rows without a tie at the k-th value or at the top-p cut
    values_equal: bool | None = None
    max_abs_diff: float | None = None
    copy_floor_ms: float | None = None
    copy_bandwidth_gbs: float | None = None
    bytes_moved: int = 0  # rows*vocab*elem_size (read) + rows*vocab*4 (fp32 write)
    bandwidth_gbs: float | None = None
    floor_fraction: float | None = None  # copy_floor_ms / median_ms
    speedup_vs_baseline: float | None = None  # baseline median / this median
    baseline: str = ""
    rotate_copies: int = 1
    note: str = ""


COPY = "copy floor"  # the plain device copy timed next to the implementations


@dataclass(frozen=True)
class Batch:
    """Everything one batch size shares: the rotated inputs, the parameters, the reference output."""

    copies: list[Tensor]  # [rows, vocab] each, identical values
    params: RowParams
    reference: Tensor  # the baseline's output [rows, vocab] fp32
    tied: Tensor  # [rows] bool: rows whose kept set the rules leave open (compare.tied_rows)


@dataclass(frozen=True)
class Input:
    """One (family, vocabulary) of the run: what its batches are made of."""

    family: str
    vocab: int
    bank_rows: Tensor | None = None  # a real family's rows ([m, V0] bfloat16), tiled to each batch size


def check_config(cfg: MicroConfig) -> None:
    """Names the config refers to must be registered (implementations, families), the baseline must be the
    project's code, and the device must exist."""
    check_names([*cfg.impls, cfg.baseline, cfg.after])
    check_families(list(cfg.logits))
    if resolve_device(cfg.device, "micro.device").type != "cuda" and cfg.queued_ms:
        raise ConfigError(
            f"micro.queued_ms={cfg.queued_ms:g} needs a CUDA device (a CPU has no queue to hide the "
            "host's work behind); leave it at 0 here"
        )
    check_memory(cfg, resolve_device(cfg.device, "micro.device"))
    if REGISTRY[cfg.baseline]().external:
        raise ImplError(
            f"micro.baseline={cfg.baseline!r} must be one of the project's builders: {', '.join(verify.BUILDERS)}"
        )


def check_memory(cfg: MicroConfig, device: torch.device) -> None:
    """ConfigError when the largest set cannot be allocated: at least its logits (micro.dtype) and one fp32
    output of the same [rows, vocab] shape (the builders' output, the reference) must fit at once; the rotated
    copies and the builders' temporaries come on top."""
    rows, vocab = max(cfg.rows), max(cfg.vocab)
    elem = torch.empty((), dtype=getattr(torch, cfg.dtype)).element_size()
    check_fits(
        rows * vocab * (elem + 4),
        device,
        f"micro.vocab={vocab} x micro.rows={rows} ({cfg.dtype} logits and an fp32 output)",
        "lower micro.vocab or micro.rows",
    )


def make_out_dir(results_dir: str, out_dir: str | None) -> Path:
    """`out_dir` as given (a new or empty folder: ConfigError if it holds files), else a new
    `<results_dir>/micro/<YYYYmmdd-HHMMSS>[-n]/`."""
    if out_dir:
        return Path(new_out_dir("micro.out_dir", out_dir))
    base = Path(results_dir) / "micro" / datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = base, 0
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    return path


def _base_row(cfg: MicroConfig, source: Input, impl: str, rows: int, device: torch.device) -> ResultRow:
    return ResultRow(
        impl=impl,
        rows=rows,
        vocab=source.vocab,
        status="ok",
        family=source.family,
        bank_rows=None if source.bank_rows is None else min(rows, int(source.bank_rows.shape[0])),
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        temperature=cfg.temperature,
        dtype=cfg.dtype,
        padding_fraction=cfg.padding_fraction,
        padding_rows=padding_row_count(rows, cfg.padding_fraction),
        device=str(device),
        baseline=cfg.baseline,
    )


def _with_comparison(row: ResultRow, cmp: OutputMatch, out: Tensor, batch: Batch) -> None:
    row.rows_differ, row.rows_unexplained = unexplained_rows(out, batch.reference, batch.tied)
    row.bitwise_equal = cmp.bitwise_equal
    row.kept_sets_equal = cmp.kept_sets_equal
    row.values_equal = cmp.values_equal
    row.max_abs_diff = cmp.max_abs_diff
    if not cmp.bitwise_equal:
        row.note = (row.note + "; " if row.note else "") + f"vs {row.baseline}: {cmp.summary()}"


def _with_timing(row: ResultRow, stats: measure.TimingStats, floor: measure.TimingStats, batch: Batch) -> None:
    row.median_ms, row.min_ms, row.max_ms, row.repeats = stats.median_ms, stats.min_ms, stats.max_ms, stats.repeats
    row.copy_floor_ms = floor.median_ms
    row.bytes_moved = measure.bytes_moved(row.rows, row.vocab, batch.copies[0].element_size())
    row.copy_bandwidth_gbs = measure.bandwidth_gbs(row.bytes_moved, floor.median_ms)
    row.bandwidth_gbs = measure.bandwidth_gbs(row.bytes_moved, stats.median_ms)
    row.floor_fraction = measure.floor_fraction(floor.median_ms, stats.median_ms)
    row.rotate_copies = len(batch.copies)


def warm_up(call: measure.Call, inputs: list[Tensor], n: int) -> None:
    """n untimed calls, cycling through the inputs."""
    for i in range(n):
        call(inputs[i % len(inputs)])


def prepare_impl(impl: Impl, batch: Batch, cfg: MicroConfig, row: ResultRow) -> measure.Call | None:
    """Bind the parameters, warm up, make one call for peak memory and the comparison (into `row`).

    Returns the call to time, or None when the implementation is skipped or (external only) failed;
    `row.status` / `row.note` say which.
    """
    if impl.prepare is None:  # not available
        row.status, row.note = "skipped", impl.note
        return None
    call = impl.prepare(batch.params)
    try:
        warm_up(call, batch.copies, max(1, cfg.warmup))
        out, row.peak_temp_bytes = measure.call_with_peak_memory(call, batch.copies[0])
    except Exception as exc:
        if not impl.external:
            raise
        row.status, row.note = "error", f"{type(exc).__name__}: {exc}"
        return None
    _with_comparison(row, compare_outputs(out, batch.reference), out, batch)
    return call


def make_logits(cfg: MicroConfig, source: Input, rows: int, device: torch.device) -> Tensor:
    """The batch's logits in micro.dtype: the family's (seeded by seed, rows and family), the last
    round(rows * padding_fraction) rows all equal (padding slots)."""
    logits = make_family(source.family, rows, source.vocab, seed=cfg.seed, device=device, bank_rows=source.bank_rows)
    n_pad = padding_row_count(rows, cfg.padding_fraction)
    if n_pad:
        logits[rows - n_pad :] = 0.0
    return logits.to(DTYPES[cfg.dtype])


def make_batch(cfg: MicroConfig, source: Input, rows: int, device: torch.device, baseline: Impl) -> Batch:
    """The family's logits, rotated copies, reference output."""
    logits = make_logits(cfg, source, rows, device)
    params = make_params(rows, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, device=device)
    copies = rotated_copies(logits, cfg.min_rotate_bytes)
    assert baseline.prepare is not None  # check_config: the baseline is a project builder, always available
    return Batch(
        copies=copies,
        params=params,
        reference=baseline.prepare(params)(logits),
        tied=tied_rows(logits, params.temperature, params.top_k, params.top_p),
    )


def progress_steps(cfg: MicroConfig) -> int:
    """How many times `bench_rows` calls `step` over the whole run."""
    return len(cfg.logits) * len(cfg.vocab) * len(cfg.rows) * (len(cfg.impls) + cfg.warmup + cfg.repeats)


def time_batch(
    calls: dict[str, measure.Call], batch: Batch, cfg: MicroConfig, on_round: Callable[[int], None]
) -> dict[str, measure.TimingStats]:
    """Time the copy floor (a plain device copy of the logits into a preallocated fp32 [rows, vocab]
    buffer) and every call, interleaved (each round calls each once, in a shuffled order).

    Returns the stats per name, the copy's under COPY.
    """
    buf = torch.empty(batch.copies[0].shape, dtype=torch.float32, device=batch.copies[0].device)
    times = measure.time_interleaved(
        {COPY: buf.copy_, **calls},
        batch.copies,
        warmup=cfg.warmup,
        repeats=cfg.repeats,
        on_round=on_round,
        queued_ms=cfg.queued_ms,
    )
    return {name: measure.summarize(t) for name, t in times.items()}


def _fill_speedups(rows: list[ResultRow], baseline: str) -> None:
    base = next((r.median_ms for r in rows if r.impl == baseline and r.median_ms), None)
    for r in rows:
        if base and r.median_ms:
            r.speedup_vs_baseline = base / r.median_ms


def bench_rows(
    cfg: MicroConfig, source: Input, rows: int, device: torch.device, impls: list[Impl], baseline: Impl, step: Step
) -> list[ResultRow]:
    """Every implementation at one batch size of one input: prepare each (memory, comparison), then time
    them all with the copy floor, interleaved. `step(label)` is called once per implementation prepared
    and once per timing round (warm-up rounds included)."""
    batch = make_batch(cfg, source, rows, device, baseline)
    where = f"{source.family} V={source.vocab} rows={rows}"
    results, calls = [], {}
    for impl in impls:
        row = _base_row(cfg, source, impl.name, rows, device)
        call = prepare_impl(impl, batch, cfg, row)
        if call is not None:
            calls[impl.name] = call
        results.append(row)
        step(f"{where}: {impl.name} prepared")
    total = cfg.warmup + cfg.repeats
    stats = time_batch(calls, batch, cfg, on_round=lambda r: step(f"{where}: round {r + 1}/{total}"))
    for row in results:
        if row.impl in stats:
            _with_timing(row, stats[row.impl], stats[COPY], batch)
    _fill_speedups(results, cfg.baseline)
    del batch
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def _load_avg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def device_info(device: torch.device) -> dict[str, Any]:
    """What torch says about the device the benchmark ran on."""
    if device.type != "cuda":  # a shared CPU's load skews its times: keep it next to them
        return {"type": "cpu", "torch_threads": torch.get_num_threads(), "load_avg_1m": _load_avg()}
    index = torch.cuda.current_device() if device.index is None else device.index
    props = torch.cuda.get_device_properties(index)
    return {
        "type": "cuda",
        "index": index,
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "total_memory_bytes": props.total_memory,
        "torch_threads": torch.get_num_threads(),
    }


def build_manifest(
    cfg: MicroConfig, resolved: dict, device: torch.device, impls: list[Impl], overrides: list[str]
) -> dict[str, Any]:
    """manifest.json: config, command, versions, device, GPU (nvidia-smi), git, host, implementations."""
    gpu = envinfo.gpu_info() if device.type == "cuda" else None
    versions = to_json(envinfo.versions())
    return {
        "schema_version": MICRO_SCHEMA_VERSION,
        "kind": "micro",
        "status": "running",
        "started_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "finished_at": None,
        "command": [sys.executable, "-m", "harness.micro", *overrides],
        "overrides": overrides,
        "config": resolved,
        "device": device_info(device),
        "radix_topk_backend": verify.radix_topk_backend(device),
        "impls": {i.name: {"available": i.available, "note": i.note, **i.info} for i in impls},
        "versions": {k: v for k, v in versions.items() if k != "harness"},
        "git": versions["harness"],
        "gpu": to_json(gpu) if gpu is not None else None,
        "host": to_json(envinfo.host_info()),
    }


def inputs_of(cfg: MicroConfig, bank_dir: Path | None) -> list[Input]:
    """Every (family, vocabulary) of the run, in order; a real family's rows read from the bank (BankError
    when it has none)."""
    out = []
    for name in cfg.logits:
        family = FAMILIES[name]
        rows = None
        if family.bank is not None:
            if bank_dir is None:
                raise bank.BankError(
                    f"micro.logits names the real family {name!r} but no logit bank was found "
                    f"(looked for {', '.join(bank.SEARCH)}): build one with `make logit-bank`, "
                    "point micro.bank at one, or leave the real families out"
                )
            rows = bank.load_rows(bank_dir, family.bank)[0]
        out += [Input(name, vocab, rows) for vocab in cfg.vocab]
    return out


def bank_info(cfg: MicroConfig, bank_dir: Path | None) -> dict[str, Any] | None:
    """The manifest's `bank`: where the real families' rows came from (each model's bank manifest, rows cut)."""
    real = [b for n in cfg.logits if (b := FAMILIES[n].bank) is not None]
    if not real or bank_dir is None:
        return None
    models = {m: {k: v for k, v in bank.load_rows(bank_dir, m)[1].items() if k != "positions"} for m in real}
    return {"path": str(bank_dir), "models": models}


def _bench_all(
    cfg: MicroConfig,
    sources: list[Input],
    device: torch.device,
    impls: list[Impl],
    baseline: Impl,
    path: Path,
    step: Step,
) -> list[ResultRow]:
    """Every input and batch size in turn; each row is appended to `path` (JSONL) and flushed as it is measured."""
    results: list[ResultRow] = []
    with path.open("w") as f:
        for source in sources:
            for rows in cfg.rows:
                for row in bench_rows(cfg, source, rows, device, impls, baseline, step):
                    f.write(json.dumps(dataclasses.asdict(row)) + "\n")
                    f.flush()
                    results.append(row)
    return results


def _finish(out_dir: Path, manifest: dict[str, Any], status: str) -> None:
    manifest.update(status=status, finished_at=datetime.now().astimezone().isoformat(timespec="seconds"))
    write_json(out_dir / "manifest.json", manifest)


@dataclass(frozen=True)
class RunResult:
    out_dir: Path
    manifest: dict[str, Any]
    rows: list[ResultRow]


def run(
    cfg: MicroConfig, *, results_dir: str, resolved: dict, overrides: list[str], step: Step, say: Callable[[str], None]
) -> RunResult:
    """The whole benchmark; writes manifest.json and results.jsonl (flushed per row) under the output dir.

    report.md is written by the caller (`harness.micro.writeup`) from what this returns.
    """
    check_config(cfg)
    device = resolve_device(cfg.device, "micro.device")
    impls = resolve_impls(cfg.impls)
    for impl in impls:
        if not impl.available:
            say(impl.note)
    baseline = next((i for i in impls if i.name == cfg.baseline), None) or resolve_impls([cfg.baseline])[0]
    bank_dir = bank.find_bank(cfg.bank)
    sources = inputs_of(cfg, bank_dir)
    out_dir = make_out_dir(results_dir, cfg.out_dir)
    manifest = build_manifest(cfg, resolved, device, impls, overrides)
    manifest["bank"] = bank_info(cfg, bank_dir)
    manifest["families"] = {n: FAMILIES[n].doc for n in cfg.logits}
    write_json(out_dir / "manifest.json", manifest)
    say(
        f"device {device} ({manifest['device'].get('name', manifest['host']['cpu'])}), "
        f"radix top-k: {manifest['radix_topk_backend']}, writing to {out_dir}/"
    )
    try:
        results = _bench_all(cfg, sources, device, impls, baseline, out_dir / "results.jsonl", step)
    except KeyboardInterrupt:
        _finish(out_dir, manifest, "interrupted")
        say(f"interrupted: the rows measured so far are kept in {out_dir / 'results.jsonl'} (no report.md)")
        raise
    except BaseException:
        _finish(out_dir, manifest, "failed")
        raise
    _finish(out_dir, manifest, "complete")
    return RunResult(out_dir=out_dir, manifest=manifest, rows=results)
