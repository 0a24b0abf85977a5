"""`python -m harness.micro` with SGLang installed: its `sglang` row runs SGLang's real builder, is
timed, and equals the project's `full_vocab` bitwise; and on a CUDA host without SGLang's compiled
kernels (`sgl_kernel`) the row is skipped with a note that names the missing module."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_support import import_sglang

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]
SGLANG_FUNCTION = "sglang.srt.speculative.dflash_utils.build_speculative_verify_target_probs"


def run_python(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


CASES = [(20, 0.95), (-1, 1.0)]


@pytest.fixture(scope="module")
def micro_runs(tmp_path_factory) -> dict[tuple[int, float], Path]:
    """One `python -m harness.micro -m` (a Hydra multirun: one process pays SGLang's imports once) over top_k x
    top_p; each job's folder by its (top_k, top_p), read from its own results."""
    import_sglang()  # fails (or skips) with the reason when SGLang is absent
    out = tmp_path_factory.mktemp("micro")
    proc = run_python(
        "-m",
        "harness.micro",
        "-m",
        "micro.vocab=[4096]",
        "micro.logits=[iid]",
        "micro.rows=[4,16]",
        f"micro.top_k={','.join(str(k) for k, _ in CASES)}",
        f"micro.top_p={','.join(str(p) for _, p in CASES)}",
        "micro.temperature=0.8",
        "micro.padding_fraction=0.25",
        "micro.impls=[full_vocab,sglang]",
        "micro.repeats=2",
        "micro.warmup=1",
        "micro.min_rotate_bytes=65536",
        "micro.device=cpu",
        f"micro.out_dir={out}/${{hydra:job.num}}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipped" not in proc.stdout
    jobs = {}
    for folder in sorted(out.iterdir()):
        first = json.loads((folder / "results.jsonl").read_text().splitlines()[0])
        jobs[(first["top_k"], first["top_p"])] = folder
    return jobs


@pytest.mark.parametrize("top_k,top_p", CASES, ids=["k20-p0.95", "whole-vocab"])
def test_micro_times_sglang_and_it_equals_full_vocab_bitwise(micro_runs, top_k, top_p):
    folder = micro_runs[(top_k, top_p)]
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    sg = [r for r in rows if r["impl"] == "sglang"]
    assert [r["rows"] for r in sg] == [4, 16]
    for r in sg:
        assert r["status"] == "ok" and r["note"] == "", r
        assert (r["top_k"], r["top_p"], r["temperature"]) == (top_k, top_p, 0.8), r
        assert r["bitwise_equal"] is True and r["baseline"] == "full_vocab", r
        assert r["repeats"] == 2 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"], r
    manifest = json.loads((folder / "manifest.json").read_text())
    info = manifest["impls"]["sglang"]
    assert info["available"] is True and info["function"] == SGLANG_FUNCTION and info["note"] == SGLANG_FUNCTION
    assert manifest["versions"]["sglang"] == import_sglang().__version__


SIMULATED_CUDA_HOST = """
import json, torch, torchvision  # torchvision first: its CUDA-version check reads the real torch
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.version.cuda = "12.8"
from harness.micro import impls
[impl] = impls.resolve_impls(["sglang"])
print(json.dumps({"available": impl.available, "note": impl.note}))
"""


def test_on_a_cuda_host_without_sgl_kernel_the_row_names_the_missing_module():
    """torch made to report an H200 (is_available, device name and capability, CUDA version): SGLang then
    imports its CUDA kernels, whose chain needs `sgl_kernel`, which this environment lacks, as a GPU
    host with `pip install sglang` but without the kernel wheel would."""
    sglang = import_sglang()
    assert importlib.util.find_spec("sgl_kernel") is None, "this test needs an environment without sgl_kernel"
    proc = run_python("-c", SIMULATED_CUDA_HOST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "available": False,
        "note": f"sglang {sglang.__version__} installed but sglang.srt.speculative.dflash_utils needs the "
        "module 'sgl_kernel', which is not installed (SGLang's compiled CUDA kernel wheel): skipped",
    }
