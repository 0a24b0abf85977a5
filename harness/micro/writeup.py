"""report.md and the console table of a microbenchmark run (pure functions of manifest + rows)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from tabulate import tabulate

from harness.micro import measure
from harness.micro.app import ResultRow

IMPL_DESCRIPTIONS = {
    "full_vocab": "scale the whole [rows, vocab] matrix by the temperature, then torch.topk",
    "topk_first": "top-k of the raw logits with radix_topk ({backend}), then scale only the k values",
    "topk_first_torch": "top-k first with torch.topk forced (the fallback path)",
    "topk_fused": "a Triton kernel that reads the logits once and writes the output once (each group's maximum in "
    "the pass; a row's k largest groups hold its top k); topk_first off CUDA",
    "sglang": "SGLang's own builder through the adapter ({note})",
}


def fmt_ms(ms: float | None) -> str:
    """Three significant figures, as the seed's table: 0.670, 2.07, 14.2, 153."""
    if ms is None:
        return "-"
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}" if ms >= 0.1 else f"{ms:.3f}"


def fmt_bytes(n: int | None) -> str:
    """GiB with two decimals from 0.1 GiB up, else MiB; 'n/a' when not measured."""
    if n is None:
        return "n/a"
    return f"{n / 2**30:.2f} GiB" if n >= 0.1 * 2**30 else f"{n / 2**20:.1f} MiB"


def fmt_memory_pair(before: int | None, after: int | None) -> str:
    """'0.95 to 0.47 GiB' (one unit, the larger value's); 'n/a (CPU)' when not measured."""
    if before is None or after is None:
        return "n/a (CPU)"
    if max(before, after) >= 0.1 * 2**30:
        return f"{before / 2**30:.2f} to {after / 2**30:.2f} GiB"
    return f"{before / 2**20:.1f} to {after / 2**20:.1f} MiB"


def fmt_equal(row: ResultRow) -> str:
    if row.status != "ok":
        return "-"
    if row.rows_unexplained:
        return f"**NO**: {row.rows_unexplained} row(s) differ without a tie"
    if row.bitwise_equal:
        return "bitwise"
    if row.values_equal:
        return "values, not bitwise" + ("" if row.kept_sets_equal else " (tied tokens differ)")
    if row.kept_sets_equal and row.max_abs_diff is not None:
        return f"same kept set, values within {row.max_abs_diff:.1e}"
    if row.rows_differ and row.rows_unexplained == 0:
        return f"{row.rows_differ} tied row(s) differ, the rest the same"
    return f"NO (max diff {row.max_abs_diff:.1e})" if row.max_abs_diff is not None else "NO (shape)"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _find(rows: Sequence[ResultRow], impl: str, n: int) -> ResultRow | None:
    return next((r for r in rows if r.impl == impl and r.rows == n and r.status == "ok"), None)


def first_input(rows: Sequence[ResultRow]) -> list[ResultRow]:
    """The rows of the run's first (family, vocabulary): what the seed-shaped before/after table shows."""
    if not rows:
        return []
    family, vocab = rows[0].family, rows[0].vocab
    return [r for r in rows if r.family == family and r.vocab == vocab]


def floor_multiple(row: ResultRow) -> float | None:
    """median / copy floor (1.0 = as fast as the copy)."""
    return row.median_ms / row.copy_floor_ms if row.median_ms and row.copy_floor_ms else None


def fmt_cell(row: ResultRow | None) -> str:
    """'2.21 (1.16x)': median ms and its multiple of the copy floor; the status when not measured."""
    if row is None:
        return "-"
    if row.status != "ok" or row.median_ms is None:
        return row.status
    multiple = floor_multiple(row)
    return fmt_ms(row.median_ms) + (f" ({multiple:.2f}x)" if multiple is not None else "")


def family_table(rows: Sequence[ResultRow], family: str) -> str:
    """vocab | rows | each implementation: median ms (x the copy floor) | copy floor ms | equal to the baseline."""
    mine = [r for r in rows if r.family == family]
    impls = list(dict.fromkeys(r.impl for r in mine))
    lines = []
    for vocab in dict.fromkeys(r.vocab for r in mine):
        for n in dict.fromkeys(r.rows for r in mine if r.vocab == vocab):
            cell = {r.impl: r for r in mine if r.vocab == vocab and r.rows == n}
            floor = next((r.copy_floor_ms for r in cell.values() if r.copy_floor_ms), None)
            ran = [i for i in impls if i in cell and cell[i].status == "ok"]
            equal = "; ".join(f"{i}: {fmt_equal(cell[i])}" for i in ran if not cell[i].bitwise_equal)
            lines.append(
                [
                    f"{vocab:,}",
                    n,
                    *[fmt_cell(cell.get(i)) for i in impls],
                    fmt_ms(floor),
                    equal or ("bitwise" if ran else "- (nothing ran)"),
                ]
            )
    headers = ["vocab", "rows", *[f"{i} ms (x floor)" for i in impls], "copy floor ms", "equal to baseline"]
    return tabulate(lines, headers=headers, tablefmt="pipe", disable_numparse=True)


def worst_table(rows: Sequence[ResultRow]) -> str:
    """Per implementation, at the largest row count: its worst and best (family, vocabulary) in multiples of
    the copy floor, and how often it was slower than topk_first at any row count."""
    top = max((r.rows for r in rows), default=0)
    lines = []
    for impl in dict.fromkeys(r.impl for r in rows):
        at_top = [(m, r) for r in rows if r.impl == impl and r.rows == top and (m := floor_multiple(r)) is not None]
        if not at_top:
            continue
        worst, best = max(at_top, key=lambda p: p[0]), min(at_top, key=lambda p: p[0])
        first = {(r.family, r.vocab, r.rows): r.median_ms for r in rows if r.impl == "topk_first" and r.median_ms}
        mine = [
            (r.median_ms, first[(r.family, r.vocab, r.rows)])
            for r in rows
            if r.impl == impl and r.median_ms and (r.family, r.vocab, r.rows) in first
        ]
        slower = sum(1 for ms, reference in mine if reference is not None and ms > reference)
        lines.append(
            [
                impl,
                f"{worst[1].family}, {worst[1].vocab:,}: {worst[0]:.2f}x",
                f"{best[1].family}, {best[1].vocab:,}: {best[0]:.2f}x",
                "-" if impl == "topk_first" or not mine else f"{slower} of {len(mine)}",
            ]
        )
    headers = [
        "implementation",
        f"worst family, vocab at {top} rows (x floor)",
        "best (x floor)",
        "slower than topk_first (cells)",
    ]
    return tabulate(lines, headers=headers, tablefmt="pipe", disable_numparse=True)


def seed_table(rows: Sequence[ResultRow], before: str, after: str) -> str | None:
    """rows | before | after | peak temporary memory, before to after (None without both impls), for the
    run's first family and vocabulary."""
    rows = first_input(rows)
    lines = []
    for n in dict.fromkeys(r.rows for r in rows):
        b, a = _find(rows, before, n), _find(rows, after, n)
        if b and a:
            lines.append(
                [
                    n,
                    f"{fmt_ms(b.median_ms)} ms",
                    f"{fmt_ms(a.median_ms)} ms",
                    fmt_memory_pair(b.peak_temp_bytes, a.peak_temp_bytes),
                ]
            )
    if not lines:
        return None
    headers = ["rows", "before", "after", "peak temporary memory, before to after"]
    return tabulate(lines, headers=headers, tablefmt="pipe", colalign=("right", "right", "right", "left"))


FULL_HEADERS = [
    "family",
    "vocab",
    "rows",
    "impl",
    "median ms",
    "min ms",
    "max ms",
    "speedup",
    "GB/s",
    "copy floor ms",
    "copy GB/s",
    "fraction of floor",
    "peak temp",
    "equal to baseline",
]


def full_table_rows(rows: Sequence[ResultRow]) -> list[list[str | int]]:
    """The per-implementation table's cells (strings, the row count an int), one list per result row."""
    out: list[list[str | int]] = []
    for r in rows:
        if r.status != "ok":
            out.append([r.family, r.vocab, r.rows, r.impl, r.status, *["-"] * (len(FULL_HEADERS) - 5)])
            continue
        out.append(
            [
                r.family,
                r.vocab,
                r.rows,
                r.impl,
                fmt_ms(r.median_ms),
                fmt_ms(r.min_ms),
                fmt_ms(r.max_ms),
                _num(r.speedup_vs_baseline, ".2f") + "x" if r.speedup_vs_baseline else "-",
                _num(r.bandwidth_gbs, ".1f"),
                fmt_ms(r.copy_floor_ms),
                _num(r.copy_bandwidth_gbs, ".1f"),
                _num(r.floor_fraction, ".2f"),
                fmt_bytes(r.peak_temp_bytes),
                fmt_equal(r),
            ]
        )
    return out


def full_table(rows: Sequence[ResultRow]) -> str:
    colalign = ("left", "right", "right", "left", *["right"] * (len(FULL_HEADERS) - 5), "left")
    return tabulate(full_table_rows(rows), headers=FULL_HEADERS, tablefmt="pipe", colalign=colalign)


def _where(manifest: dict[str, Any]) -> str:
    """One line: the device (GPU with driver and clocks, or CPU model), torch, FlashInfer, git."""
    dev, gpu, ver, git = manifest["device"], manifest.get("gpu"), manifest["versions"], manifest["git"]
    if dev["type"] == "cuda":
        where = dev["name"]
        first = (gpu or {}).get("gpus", [{}])[0]
        if gpu:
            where += (
                f" (driver {gpu['driver_version']}, SM clock {first.get('clocks_sm_mhz')} MHz"
                f" of max {first.get('clocks_max_sm_mhz')}, memory clock {first.get('clocks_mem_mhz')} MHz)"
            )
    else:
        where = f"CPU: {manifest['host']['cpu']}, {dev['torch_threads']} torch threads"
        if dev.get("load_avg_1m") is not None:
            where += f", load average {dev['load_avg_1m']} at the start"
    torch_v = f"torch {ver['torch']}" + (f" (CUDA {ver['cuda']})" if ver.get("cuda") else "")
    fi = f"FlashInfer {ver['flashinfer']}" if ver.get("flashinfer") else "no FlashInfer"
    sha = (git.get("git_sha") or "unknown")[:10] + (" (dirty)" if git.get("dirty") else "")
    return f"{where} · {torch_v} · {fi} · radix top-k: {manifest['radix_topk_backend']} · git {sha}"


def _rotation(min_bytes: int) -> str:
    if min_bytes <= 0:
        return "every call on the same input (micro.min_rotate_bytes=0: a call may find it in the cache)"
    return (
        f"each call on the next of several input copies (together over {min_bytes / 2**20:.0f} MiB, so that no "
        "call finds its input in the cache)"
    )


def _setup(micro: dict[str, Any], gpu: bool = True) -> str:
    pad = micro["padding_fraction"]
    vocabs = ", ".join(f"{v:,}" for v in micro["vocab"])
    return (
        f"logit families {', '.join(micro['logits'])} · vocabularies {vocabs} · top_k {micro['top_k']} · "
        f"top_p {micro['top_p']} · temperature {micro['temperature']} · {micro['dtype']} logits (seed "
        f"{micro['seed']}) · padding rows (all-equal logits) on top of each family: {pad:.0%} · median of "
        f"{micro['repeats']} timed rounds after "
        f"{micro['warmup']} warm-up rounds; each round calls the copy and every implementation once, "
        f"in a shuffled order, {_rotation(micro['min_rotate_bytes'])}; "
        + measure.start_text(micro.get("queued_ms") or 0.0, gpu)
    )


def _impl_lines(manifest: dict[str, Any], names: Sequence[str]) -> list[str]:
    lines = []
    for name in names:
        info = manifest["impls"].get(name, {})
        text = IMPL_DESCRIPTIONS.get(name, "").format(backend=manifest["radix_topk_backend"], note=info.get("note", ""))
        if not info.get("available", True):
            text = f"not measured ({info.get('note', '')})"
        lines.append(f"- `{name}`: {text}")
    return lines


NOTES = """\
- **GB/s** = (bytes read + bytes written) / median time, with bytes = rows × vocab × (input element
  size) + rows × vocab × 4 (the dense fp32 output): the least any builder must move.
- **copy floor** = a plain device copy of the logits into a preallocated fp32 [rows, vocab] buffer,
  timed in the same run; **fraction of floor** = copy floor / median (1.0 = as fast as the copy).
- **peak temp** = peak allocated memory during one call minus what was allocated before it (inputs),
  output included; measured on CUDA only (n/a on the CPU).
- **equal to baseline**: `bitwise` = torch.equal with the baseline's output; `values` = the same
  kept probabilities per row, but tied tokens may differ in which index holds them."""


def families_part(manifest: dict[str, Any], rows: Sequence[ResultRow]) -> list[str]:
    """The logit families: what each models, then one table per family and the worst family per builder."""
    families = list(dict.fromkeys(r.family for r in rows))
    docs = manifest.get("families") or {}
    models = ((manifest.get("bank") or {}).get("models")) or {}
    lines = ["## Logit families", ""]
    for family in families:
        distinct = max((r.bank_rows or 0 for r in rows if r.family == family), default=0)
        model = next((m for m in models if family.startswith(m)), None)
        real = (
            (
                f" ({distinct} distinct rows of the logit bank, tiled; the model's file SHA-256 "
                f"{models[model]['file_sha256'][:12]}..., vocabulary {models[model]['vocab']:,}: truncated or "
                "padded with the row's minimum to the others)"
            )
            if distinct and model
            else ""
        )
        lines.append(f"- `{family}`: {docs.get(family, '')}{real}")
    lines += ["", "### Worst family per implementation", "", worst_table(rows), ""]
    for family in families:
        lines += [f"### `{family}`", "", family_table(rows, family), ""]
    return lines


def render_markdown(manifest: dict[str, Any], rows: Sequence[ResultRow]) -> str:
    """The whole report.md: setup, the seed-shaped before/after table, the families, the full table, notes."""
    micro = manifest["config"]["micro"]
    before, after = micro["baseline"], micro["after"]
    gpu = (manifest.get("device") or {}).get("type") == "cuda"
    parts = ["# Verify-probability builders: microbenchmark", "", _where(manifest), "", _setup(micro, gpu), ""]
    seed = seed_table(rows, before, after)
    first = first_input(rows)
    shown = f" ({first[0].family} logits, vocabulary {first[0].vocab:,})" if first else ""
    parts += [f"## Before and after{shown}", ""]
    parts += (
        [seed, "", f"before = `{before}`, after = `{after}`; median times."]
        if seed
        else [f"(no rows with both `{before}` and `{after}` measured)"]
    )
    parts += ["", *families_part(manifest, rows), "## Every implementation", "", full_table(rows), ""]
    parts += _impl_lines(manifest, list(dict.fromkeys([before, *micro["impls"]])))
    parts += [
        "",
        "Notes:",
        "",
        NOTES,
        "",
        "Reproduce:",
        "",
        "```",
        " ".join(["python -m harness.micro", *manifest["overrides"]]),
        "```",
        "",
    ]
    return "\n".join(parts)


def write_micro_report(out_dir: Path, manifest: dict[str, Any], rows: Sequence[ResultRow]) -> Path:
    """Write report.md into `out_dir` and return its path."""
    path = out_dir / "report.md"
    path.write_text(render_markdown(manifest, rows))
    return path


CONSOLE_HEADERS = [
    "family",
    "vocab",
    "rows",
    "impl",
    "median ms",
    "min",
    "max",
    "speedup",
    "GB/s",
    "copy ms",
    "copy GB/s",
    "of floor",
    "peak temp",
    "equal",
]


def console_table(rows: Sequence[ResultRow], title: str) -> Table:
    """A rich table of every result row (the full table's cells, shorter headers)."""
    table = Table(title=title)
    for i, h in enumerate(CONSOLE_HEADERS):
        table.add_column(h, justify="left" if i in (0, 3, len(CONSOLE_HEADERS) - 1) else "right", no_wrap=i < 4)
    for cells in full_table_rows(rows):
        table.add_row(*map(str, cells))
    return table
