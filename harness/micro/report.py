"""report.md and the console table of a microbenchmark run (pure functions of manifest + rows)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from tabulate import tabulate

from harness.micro.app import ResultRow

IMPL_DESCRIPTIONS = {
    "full_vocab": "scale the whole [rows, vocab] matrix by the temperature, then torch.topk",
    "topk_first": "top-k of the raw logits with radix_topk ({backend}), then scale only the k values",
    "topk_first_torch": "top-k first with torch.topk forced (the fallback path)",
    "topk_fused": "Triton kernels that read the logits once and write the output once (sampled threshold, "
                  "candidates appended in one pass, top-k of the candidates); topk_first off CUDA",
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
    if row.bitwise_equal:
        return "bitwise"
    if row.values_equal:
        return "values, not bitwise" + ("" if row.kept_sets_equal else " (tied tokens differ)")
    if row.kept_sets_equal and row.max_abs_diff is not None:
        return f"same kept set, values within {row.max_abs_diff:.1e}"
    return f"NO (max diff {row.max_abs_diff:.1e})" if row.max_abs_diff is not None else "NO (shape)"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _find(rows: Sequence[ResultRow], impl: str, n: int) -> ResultRow | None:
    return next((r for r in rows if r.impl == impl and r.rows == n and r.status == "ok"), None)


def seed_table(rows: Sequence[ResultRow], before: str, after: str) -> str | None:
    """rows | before | after | peak temporary memory, before to after (None without both impls)."""
    lines = []
    for n in dict.fromkeys(r.rows for r in rows):
        b, a = _find(rows, before, n), _find(rows, after, n)
        if b and a:
            lines.append([n, f"{fmt_ms(b.median_ms)} ms", f"{fmt_ms(a.median_ms)} ms",
                          fmt_memory_pair(b.peak_temp_bytes, a.peak_temp_bytes)])
    if not lines:
        return None
    headers = ["rows", "before", "after", "peak temporary memory, before to after"]
    return tabulate(lines, headers=headers, tablefmt="pipe", colalign=("right", "right", "right", "left"))


FULL_HEADERS = ["rows", "impl", "median ms", "min ms", "max ms", "speedup", "GB/s", "copy floor ms",
                "copy GB/s", "fraction of floor", "peak temp", "equal to baseline"]


def full_table_rows(rows: Sequence[ResultRow]) -> list[list[str | int]]:
    """The per-implementation table's cells (strings, the row count an int), one list per result row."""
    out: list[list[str | int]] = []
    for r in rows:
        if r.status != "ok":
            out.append([r.rows, r.impl, r.status, *["-"] * (len(FULL_HEADERS) - 3)])
            continue
        out.append([
            r.rows, r.impl, fmt_ms(r.median_ms), fmt_ms(r.min_ms), fmt_ms(r.max_ms),
            _num(r.speedup_vs_baseline, ".2f") + "x" if r.speedup_vs_baseline else "-",
            _num(r.bandwidth_gbs, ".1f"), fmt_ms(r.copy_floor_ms), _num(r.copy_bandwidth_gbs, ".1f"),
            _num(r.floor_fraction, ".2f"), fmt_bytes(r.peak_temp_bytes), fmt_equal(r),
        ])
    return out


def full_table(rows: Sequence[ResultRow]) -> str:
    colalign = ("right", "left", *["right"] * (len(FULL_HEADERS) - 3), "left")
    return tabulate(full_table_rows(rows), headers=FULL_HEADERS, tablefmt="pipe", colalign=colalign)


def _where(manifest: dict[str, Any]) -> str:
    """One line: the device (GPU with driver and clocks, or CPU model), torch, FlashInfer, git."""
    dev, gpu, ver, git = manifest["device"], manifest.get("gpu"), manifest["versions"], manifest["git"]
    if dev["type"] == "cuda":
        where = dev["name"]
        first = (gpu or {}).get("gpus", [{}])[0]
        if gpu:
            where += (f" (driver {gpu['driver_version']}, SM clock {first.get('clocks_sm_mhz')} MHz"
                      f" of max {first.get('clocks_max_sm_mhz')}, memory clock {first.get('clocks_mem_mhz')} MHz)")
    else:
        where = f"CPU: {manifest['host']['cpu']}, {dev['torch_threads']} torch threads"
        if dev.get("load_avg_1m") is not None:
            where += f", load average {dev['load_avg_1m']} at the start"
    torch_v = f"torch {ver['torch']}" + (f" (CUDA {ver['cuda']})" if ver.get("cuda") else "")
    fi = f"FlashInfer {ver['flashinfer']}" if ver.get("flashinfer") else "no FlashInfer"
    sha = (git.get("git_sha") or "unknown")[:10] + (" (dirty)" if git.get("dirty") else "")
    return f"{where} · {torch_v} · {fi} · radix top-k: {manifest['radix_topk_backend']} · git {sha}"


def _setup(micro: dict[str, Any]) -> str:
    pad = micro["padding_fraction"]
    return (f"vocab {micro['vocab']:,} · top_k {micro['top_k']} · top_p {micro['top_p']} · "
            f"temperature {micro['temperature']} · {micro['dtype']} logits (standard normal, seed {micro['seed']}) · "
            f"padding rows (all-equal logits): {pad:.0%} · median of {micro['repeats']} timed rounds after "
            f"{micro['warmup']} warm-up rounds; each round calls the copy and every implementation once, "
            f"in a shuffled order, each call on the next of several input copies (together over "
            f"{micro['min_rotate_bytes'] / 2**20:.0f} MiB, so no call finds its input in the cache)")


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


def render_markdown(manifest: dict[str, Any], rows: Sequence[ResultRow]) -> str:
    """The whole report.md: setup, the seed-shaped before/after table, the full table, notes."""
    micro = manifest["config"]["micro"]
    before, after = micro["baseline"], micro["after"]
    parts = ["# Verify-probability builders: microbenchmark", "", _where(manifest), "", _setup(micro), ""]
    seed = seed_table(rows, before, after)
    parts += ["## Before and after", ""]
    parts += [seed, "", f"before = `{before}`, after = `{after}`; median times."] if seed else \
        [f"(no rows with both `{before}` and `{after}` measured)"]
    parts += ["", "## Every implementation", "", full_table(rows), ""]
    parts += _impl_lines(manifest, list(dict.fromkeys([before, *micro["impls"]])))
    parts += ["", "Notes:", "", NOTES, "", "Reproduce:", "", "```", " ".join(
        ["python -m harness.micro", *manifest["overrides"]]), "```", ""]
    return "\n".join(parts)


def write_report(out_dir: Path, manifest: dict[str, Any], rows: Sequence[ResultRow]) -> Path:
    """Write report.md into `out_dir` and return its path."""
    path = out_dir / "report.md"
    path.write_text(render_markdown(manifest, rows))
    return path


CONSOLE_HEADERS = ["rows", "impl", "median ms", "min", "max", "speedup", "GB/s", "copy ms", "copy GB/s",
                   "of floor", "peak temp", "equal"]


def console_table(rows: Sequence[ResultRow], title: str) -> Table:
    """A rich table of every result row (the full table's cells, shorter headers)."""
    table = Table(title=title)
    for i, h in enumerate(CONSOLE_HEADERS):
        table.add_column(h, justify="left" if i in (1, len(CONSOLE_HEADERS) - 1) else "right", no_wrap=i < 2)
    for cells in full_table_rows(rows):
        table.add_row(*map(str, cells))
    return table
