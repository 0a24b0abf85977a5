"""Static instruction counts of topk_fused's finish kernel, compiled for an H100/H200 (sm_90) on a host without a GPU:
the SASS instructions of each loop body (a backward branch's span), per launch option, so that two designs of the
finish can be compared before a GPU is lent. A loop's count is the work of one iteration for a warp (one warp a
row in the sparse mode); it says nothing of memory latency. Triton's wheels carry ptxas and cuobjdump:

    python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0 torch==2.13.0 numpy
    /tmp/t36/bin/python lab/scripts/sass_loops.py [vocab, default 248320] [options as JSON, default '[{}, {"REPLACE": 1}]']
        [sparse|dense, default sparse: the dense mode's finish runs in its pass kernel (FUSE 1), 4 warps]

On 2026-12-04 (248,320 ids, the sparse mode's defaults): the pick of the k largest of 1,024 group maxima 296
instructions an iteration (k iterations), the tile merge 177 (the rank merge) or 171 (REPLACE) an iteration;
SUPER 8's pick 61 (128 super-group keys) + 85 (256 group keys) an iteration. The dense mode at 32,000 ids (the
finish in the pass kernel, 4 warps: fewer keys a thread, a barrier a round): the pick 103 an iteration, 62 + 67
with SUPER 8 (no gain there), the merge 106-154, 148 with REPLACE.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.verify import topk_fused  # noqa: E402

SIGNATURE = {
    "logits_ptr": "*fp32",
    "stride_row": "i32",
    "out_ptr": "*fp32",
    "ids_ptr": "*i32",
    "maxes_ptr": "*fp32",
    "status_ptr": "*i32",
    "temp_ptr": "*fp32",
    "top_k_ptr": "*i64",
    "top_p_ptr": "*fp32",
    "n_rows": "i32",
    "vocab": "i32",
    "row0": "i32",
}


def finish_sass(vocab: int, options: dict, sparse: bool = True) -> str:
    """The SASS for sm_90 (cuobjdump of the cubin Triton builds) of the kernel that finishes the rows: the finish
    kernel, or the pass kernel where the configuration fuses them (the dense mode's default)."""
    cfg = {**topk_fused.launch_config(vocab, sparse=sparse), **options}
    shapes = topk_fused.kernel_shapes(vocab, cfg, sparse)
    fn, warps = topk_fused._finish_kernel, cfg["FINISH_WARPS"]
    if cfg["FUSE"]:
        fn, warps = topk_fused._pass_kernel, cfg["PASS_WARPS"]
        shapes.update(BLOCK=max(cfg["PASS_BLOCK"], shapes["GROUP"]), FUSE=1)
    source = ASTSource(fn=fn, signature={**SIGNATURE, **dict.fromkeys(shapes, "constexpr")}, constexprs=shapes)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "finish.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        tool = Path(os.path.dirname(triton.__file__)) / "backends" / "nvidia" / "bin" / "cuobjdump"
        return subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


def loop_sizes(sass: str) -> tuple[int, Counter]:
    """(instructions in all, Counter of loop body sizes): a loop is a branch to a lower address."""
    code = [(int(a, 16), text) for a, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    sizes = Counter()
    for at, text in code:
        target = re.search(r"BRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < at:
            start = int(target.group(1), 16)
            sizes[sum(1 for a, _ in code if start <= a <= at)] += 1
    return len(code), sizes


def main() -> None:
    vocab = int(sys.argv[1]) if len(sys.argv) > 1 else 248_320
    sparse = (sys.argv[3] if len(sys.argv) > 3 else "sparse") == "sparse"
    for options in json.loads(sys.argv[2]) if len(sys.argv) > 2 else [{}, {"REPLACE": 1}]:
        total, sizes = loop_sizes(finish_sass(vocab, options, sparse))
        loops = ", ".join(f"{n} x {size}" for size, n in sorted(sizes.items()))
        print(
            f"{vocab:,} ids, {'sparse' if sparse else 'dense'}, {json.dumps(options)}: {total} instructions; "
            f"loops (count x instructions): {loops}"
        )


if __name__ == "__main__":
    main()
