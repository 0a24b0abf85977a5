"""Where the test suite's CPU goes: a pytest plugin that records each test's CPU, and a summary per module.

Each test's own CPU (its process's user + system time while it ran, setup and teardown included, so a module-scoped
fixture counts in the first test that uses it) and its children's (the servers, runners and probes it started and
waited for: RUSAGE_CHILDREN), one JSON line per test appended to $TEST_CPU_LOG (default test_cpu.jsonl); every
pytest-xdist worker appends to the same file. From the repository root:

    rm -f /tmp/cpu.jsonl
    TEST_CPU_LOG=/tmp/cpu.jsonl PYTHONPATH=lab/scripts .venv/bin/python -m pytest -p test_cpu -n 2 --dist loadgroup \\
        -m "not sglang and not slurm and not interpreter"
    python lab/scripts/test_cpu.py /tmp/cpu.jsonl [--top 20]

A child that a test leaves running, or that its parent never waits for, is not counted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    own0, kids0 = _cpu()
    start = time.perf_counter()
    yield
    own1, kids1 = _cpu()
    line = {"id": item.nodeid, "own": own1 - own0, "children": kids1 - kids0, "wall": time.perf_counter() - start}
    with open(os.environ.get("TEST_CPU_LOG", "test_cpu.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def summary(path: Path, top: int) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no test lines (was the plugin loaded? -p test_cpu with lab/scripts/ on PYTHONPATH)")
    per_module: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        m = per_module[r["id"].split("::")[0]]
        m[0], m[1], m[2], m[3] = m[0] + r["own"], m[1] + r["children"], m[2] + r["wall"], m[3] + 1
    own, kids, wall = (sum(m[i] for m in per_module.values()) for i in range(3))
    out = [
        f"{len(rows)} tests: {own + kids:.0f} CPU-s ({own:.0f} in the test processes, {kids:.0f} in their children), "
        f"{wall:.0f} s of test wall time summed over workers",
        "| module | CPU-s | own | children | wall s | tests |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ranked = sorted(per_module.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    out += [
        f"| {name} | {m[0] + m[1]:.1f} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.1f} | {m[3]} |" for name, m in ranked[:top]
    ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description="Summarise a test_cpu.jsonl per module (heaviest first).")
    parser.add_argument("log", type=Path)
    parser.add_argument("--top", type=int, default=20, help="modules shown (default 20)")
    args = parser.parse_args()
    if not args.log.is_file():
        raise SystemExit(f"{args.log}: no such file; run the suite with -p test_cpu first (see the docstring)")
    print(summary(args.log, args.top))


if __name__ == "__main__":
    main()
