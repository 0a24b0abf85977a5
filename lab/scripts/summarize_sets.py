"""Per vocabulary, the worst and the median family of a verify-step set (sparse_fused against one read of the
logits) or of a verify-probs set (topk_fused against the copy floor, at the largest row count), and, for repeated
cells (`h200_sparse.sh odd`: a vocabulary named again is measured again), each repeat. CPU only; from the
repository root:

    python lab/scripts/summarize_sets.py DIR/results.jsonl [...]   (a verify-step or a verify-probs results.jsonl)
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def step_ratios(rows: list[dict]) -> dict[int, list[tuple[str, float]]]:
    """vocab -> [(family, sparse_fused / read floor)] in file order (repeats kept)."""
    out: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for r in rows:
        out[r["vocab"]].append((r["family"], r["median_ms"]["sparse_fused"] / r["read_floor_ms"]))
    return out


def probs_ratios(rows: list[dict]) -> dict[int, list[tuple[str, float]]]:
    """vocab -> [(family, topk_fused / copy floor)] at the set's largest row count."""
    most = max(r["rows"] for r in rows)
    out: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for r in rows:
        if r["impl"] == "topk_fused" and r["rows"] == most and r["status"] == "ok":
            out[r["vocab"]].append((r["family"], r["median_ms"] / r["copy_floor_ms"]))
    return out


def lines(path: Path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    step = "read_floor_ms" in rows[0]
    ratios = step_ratios(rows) if step else probs_ratios(rows)
    what = "sparse_fused / one read" if step else f"topk_fused / copy floor at {max(r['rows'] for r in rows)} rows"
    queued = {r.get("queued_ms", 0.0) for r in rows} if step else {"?"}
    out = [f"{path}: {what}; queued_ms {sorted(queued)}"]
    for vocab, cells in sorted(ratios.items()):
        worst = max(cells, key=lambda c: c[1])
        med = statistics.median(c[1] for c in cells)
        by_family: dict[str, list[float]] = defaultdict(list)
        for family, ratio in cells:
            by_family[family].append(ratio)
        repeats = "; ".join(f"{f} " + "/".join(f"{x:.2f}" for x in xs) for f, xs in by_family.items() if len(xs) > 1)
        out.append(
            f"  {vocab:>7,}: worst {worst[1]:.2f}x ({worst[0]}), median {med:.2f}x, best {min(c[1] for c in cells):.2f}x"
            + (f"; repeats: {repeats}" if repeats else "")
        )
    return out


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for name in sys.argv[1:]:
        print("\n".join(lines(Path(name))))


if __name__ == "__main__":
    main()
