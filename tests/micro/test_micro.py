"""The verify-probability microbenchmark: the Hydra app end to end on the CPU (as a subprocess), its
config errors, the SGLang adapter's plumbing against stand-in modules, and the timing / bandwidth
arithmetic. The adapter against the real SGLang (its fields, its output, `make micro`'s sglang row) is
tested in tests/conformance/test_sglang_builders.py and tests/conformance/test_sglang_micro.py (.venv-sglang); the stand-ins
here cover what the real SGLang cannot: the older function name, an unknown required parameter, and
every reason for a skip."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from harness import verify
from harness.host import envinfo
from harness.micro import app, impls, measure, writeup
from harness.micro.compare import compare_outputs
from harness.micro.config import MicroConfig
from harness.micro.inputs import make_params, padding_row_count, rotated_copies, rotation_count
from harness.validation import ConfigError

REPO = Path(__file__).resolve().parents[2]
VOCAB, ROWS = 512, [4, 16]
FAMILIES = ["iid", "clustered", "smollm2"]  # a synthetic structured family and a real one (the fixture bank)
IMPLS = 5  # full_vocab, topk_first, topk_first_torch, topk_fused, sglang


def make_logits(rows: int, vocab: int, *, seed: int, padding_fraction: float = 0.0) -> torch.Tensor:
    """The micro's i.i.d. logits (fp32, on the CPU), the last rows padding."""
    cfg = MicroConfig(vocab=[vocab], seed=seed, padding_fraction=padding_fraction)
    return app.make_logits(cfg, app.Input("iid", vocab), rows, torch.device("cpu"))


REQUIRED_KEYS = {
    "impl",
    "rows",
    "vocab",
    "median_ms",
    "min_ms",
    "max_ms",
    "peak_temp_bytes",
    "bitwise_equal",
    "copy_floor_ms",
    "status",
    "top_k",
    "top_p",
    "dtype",
    "padding_fraction",
    "bandwidth_gbs",
    "floor_fraction",
}


def run_micro(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.micro", *overrides], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def sglang_importable() -> bool:
    try:
        __import__("sglang")
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# end to end (one subprocess run shared by the tests that read its output)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    proc = run_micro(
        f"micro.vocab=[{VOCAB}]",
        f"micro.rows=[{','.join(map(str, ROWS))}]",
        "micro.repeats=2",
        f"micro.logits=[{','.join(FAMILIES)}]",
        "micro.bank=tests/fixtures/logit_bank",
        "micro.warmup=1",
        "micro.padding_fraction=0.25",
        "micro.min_rotate_bytes=65536",
        "micro.device=cpu",
        f"results_dir={results}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirs = list((results / "micro").iterdir())
    assert len(dirs) == 1, dirs
    rows = [json.loads(line) for line in (dirs[0] / "results.jsonl").read_text().splitlines()]
    manifest = json.loads((dirs[0] / "manifest.json").read_text())
    return types.SimpleNamespace(proc=proc, out=dirs[0], rows=rows, manifest=manifest)


def test_e2e_writes_three_files_with_required_keys(e2e):
    assert {p.name for p in e2e.out.iterdir()} == {"manifest.json", "results.jsonl", "report.md"}
    assert len(e2e.rows) == len(ROWS) * IMPLS * len(FAMILIES)
    assert [r["family"] for r in e2e.rows[:: len(ROWS) * IMPLS]] == FAMILIES
    for row in e2e.rows:
        assert REQUIRED_KEYS <= row.keys(), REQUIRED_KEYS - row.keys()
        assert row["vocab"] == VOCAB and row["padding_fraction"] == 0.25
        assert row["bank_rows"] == (min(row["rows"], 8) if row["family"] == "smollm2" else None)
    m = e2e.manifest
    assert m["status"] == "complete" and m["config"]["micro"]["vocab"] == [VOCAB]
    assert set(m["families"]) == set(FAMILIES) and set(m["bank"]["models"]) == {"smollm2"}
    assert m["radix_topk_backend"] == "torch" and m["device"]["type"] == "cpu"
    assert set(m["versions"]) == {"python", "torch", "sglang", "flashinfer", "triton", "cuda"}
    assert set(m["git"]) == {"version", "git_sha", "dirty"} and set(m["host"]) >= {"hostname", "cpu", "cores"}
    assert f"micro.vocab=[{VOCAB}]" in m["overrides"]
    assert str(e2e.out) in e2e.proc.stdout.replace("\n", "")


def test_e2e_topk_first_bitwise_equal_and_timed(e2e):
    ok = [r for r in e2e.rows if r["impl"] in ("full_vocab", "topk_first", "topk_first_torch")]
    assert len(ok) == len(ROWS) * 3 * len(FAMILIES)
    for r in ok:
        assert r["status"] == "ok" and r["bitwise_equal"] is True, r
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["repeats"] == 2
        assert r["peak_temp_bytes"] is None  # not measured on the CPU
        assert r["copy_floor_ms"] > 0
        assert r["bytes_moved"] == r["rows"] * VOCAB * 4 * 2
        assert math.isclose(r["bandwidth_gbs"], r["bytes_moved"] / (r["median_ms"] * 1e-3) / 1e9)
        assert math.isclose(r["floor_fraction"], r["copy_floor_ms"] / r["median_ms"])
        assert r["rows_unexplained"] == 0
    assert [r["padding_rows"] for r in e2e.rows if r["impl"] == "topk_first"] == [1, 4] * len(FAMILIES)


def test_e2e_sglang_skipped_cleanly(e2e):
    if sglang_importable():
        pytest.skip("sglang is installed here")
    sg = [r for r in e2e.rows if r["impl"] == "sglang"]
    assert len(sg) == len(ROWS) * len(FAMILIES)
    assert all(r["status"] == "skipped" and r["median_ms"] is None and r["bitwise_equal"] is None for r in sg)
    assert e2e.proc.stdout.count("sglang not installed: skipped") == 1
    assert e2e.manifest["impls"]["sglang"]["available"] is False


def test_e2e_report_has_seed_table_and_full_table(e2e):
    text = (e2e.out / "report.md").read_text()
    assert "| rows | before | after | peak temporary memory, before to after |" in " ".join(text.split())
    assert "n/a (CPU)" in text
    for n in ROWS:
        assert any(
            line.split("|")[3].strip() == str(n) and "topk_first" in line
            for line in text.splitlines()
            if line.startswith("|") and line.count("|") > 10
        )
    for family in FAMILIES:  # one table per family, and each builder's worst one
        assert f"### `{family}`" in text
    assert "### Worst family per implementation" in text


def test_bad_impl_name_fails_listing_valid_names(tmp_path):
    proc = run_micro("micro.impls=[full_vocab,bogus]", f"results_dir={tmp_path}")
    assert proc.returncode != 0
    assert "'bogus'" in proc.stderr
    for name in impls.REGISTRY:
        assert name in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing was written


def test_a_set_that_cannot_be_allocated_is_refused_naming_its_size(tmp_path):
    proc = run_micro(
        "micro.vocab=[1000000000000]",
        "micro.rows=[4]",
        "micro.impls=[full_vocab]",
        "micro.device=cpu",
        f"results_dir={tmp_path}",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "micro.vocab=1000000000000 x micro.rows=4" in proc.stderr
    assert "needs at least 32,000,000,000,000 bytes" in proc.stderr and "cannot be allocated" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing was written


def test_bad_key_fails_naming_it(tmp_path):
    proc = run_micro("micro.vocabb=5", f"results_dir={tmp_path}")
    assert proc.returncode != 0
    assert "micro.vocabb" in proc.stderr


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------


def test_padding_rows_are_all_equal_and_the_others_are_not():
    logits = make_logits(8, 64, seed=1, padding_fraction=0.5)
    pad = padding_row_count(8, 0.5)
    assert pad == 4
    assert all(bool((row == row[0]).all()) for row in logits[-pad:])
    assert not any(bool((row == row[0]).all()) for row in logits[:-pad])
    assert padding_row_count(4, 0.25) == 1 and padding_row_count(10, 0.0) == 0 and padding_row_count(3, 1.0) == 3


def test_padding_rows_give_the_tie_case_in_the_builders():
    logits = make_logits(6, 256, seed=0, padding_fraction=0.5)
    p = make_params(6, temperature=1.0, top_k=20, top_p=1.0, device=torch.device("cpu"))
    probs = verify.full_vocab_probs(logits, p.temperature, p.top_k, p.top_p)
    kept = (probs[-3:] > 0).sum(dim=-1)
    assert kept.tolist() == [20, 20, 20]
    kept_values = probs[-3:][probs[-3:] > 0]
    assert torch.equal(kept_values, kept_values[:1].expand(60))  # all tied tokens get the same value
    assert torch.allclose(kept_values, torch.full((60,), 1 / 20))


def test_rotation_exceeds_min_bytes():
    assert rotation_count(100, 250) == 3
    assert rotation_count(100, 300) == 4  # strictly more than the minimum
    assert rotation_count(1000, 10) == 1
    x = torch.zeros(4, 8)
    copies = rotated_copies(x, 300)
    assert len(copies) == 3 and copies[0] is x and all(torch.equal(c, x) for c in copies)
    assert len({c.data_ptr() for c in copies}) == 3


# ---------------------------------------------------------------------------------------------
# timing and bandwidth arithmetic
# ---------------------------------------------------------------------------------------------


def test_summarize_median_min_max():
    s = measure.summarize([3.0, 1.0, 2.0, 10.0])
    assert (s.median_ms, s.min_ms, s.max_ms, s.repeats) == (2.5, 1.0, 10.0, 4)
    assert measure.summarize([5.0]).median_ms == 5.0
    with pytest.raises(ValueError):
        measure.summarize([])


def test_bytes_and_bandwidth_match_the_reference_roofline():
    # the seed's sizes: 4096 rows, vocab 248,320, fp32 in and out ~ 8.1 GB; at ~4.3 TB/s ~ 1.9 ms
    nbytes = measure.bytes_moved(4096, 248320, 4)
    assert nbytes == 4096 * 248320 * 8 and round(nbytes / 1e9, 1) == 8.1
    assert math.isclose(measure.bandwidth_gbs(nbytes, 1.9), 4282.6, rel_tol=1e-4)
    assert measure.bytes_moved(2, 10, 2) == 2 * 10 * 2 + 2 * 10 * 4  # bf16 in, fp32 out
    assert measure.bandwidth_gbs(2_000_000_000, 1000.0) == 2.0
    assert measure.floor_fraction(1.0, 4.0) == 0.25
    with pytest.raises(ValueError):
        measure.bandwidth_gbs(1, 0.0)


def test_time_calls_cycles_inputs_after_warmup():
    inputs = [torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)]
    seen = []
    times = measure.time_calls(lambda x: seen.append(int(x)) or x, inputs, warmup=2, repeats=4)
    assert seen == [0, 1, 2, 0, 1, 2]  # consecutive calls never share an input
    assert len(times) == 4 and all(t >= 0 for t in times)


def test_time_interleaved_round_robin_rotates_order_and_inputs():
    inputs = [torch.full((1,), float(i)) for i in range(2)]
    log, rounds = [], []

    def call(name):
        return lambda x: log.append((name, int(x))) or x

    times = measure.time_interleaved({n: call(n) for n in "abc"}, inputs, warmup=1, repeats=2, on_round=rounds.append)
    assert [n for n, _ in log] == [n for r in range(3) for n in measure.round_robin_order(list("abc"), r)]
    assert [i for _, i in log] == [0, 1, 0, 1, 0, 1, 0, 1, 0]
    assert rounds == [0, 1, 2]
    assert {n: len(t) for n, t in times.items()} == {"a": 2, "b": 2, "c": 2}


def test_queued_timing_needs_cuda_and_a_wait_of_zero_or_more(monkeypatch):
    inputs = [torch.zeros(1)]
    for bad in (1.0, -1.0):  # a CPU has no queue to hide the host's work behind
        with pytest.raises(ValueError, match="queued_ms"):
            measure.time_interleaved({"a": lambda x: x}, inputs, warmup=0, repeats=1, queued_ms=bad)
    with pytest.raises(ConfigError, match="micro.queued_ms=-0.5"):
        MicroConfig(queued_ms=-0.5)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="micro.queued_ms=2 needs a CUDA device"):
        app.check_config(MicroConfig(queued_ms=2.0))  # micro.device=auto resolves to the CPU here
    assert "the host's work before its first kernel is timed too" in measure.start_text(0.0)
    assert "busy-wait of about 2 ms" in measure.start_text(2.0)
    setup = writeup._setup(dataclasses.asdict(MicroConfig(queued_ms=2.0)))  # the report's setup line says it
    assert setup.endswith(measure.start_text(2.0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_queued_timing_hides_the_host_work_before_a_call_s_first_kernel():
    """A call whose host sleeps 3 ms before its one tiny kernel: on an idle GPU the 3 ms are timed; queued behind
    a 10 ms GPU wait they overlap it and the call times the kernel only."""
    import time  # noqa: PLC0415

    x = torch.ones(1024, device="cuda")

    def call(t):
        time.sleep(0.003)
        return t * 2

    idle = measure.time_interleaved({"c": call}, [x], warmup=1, repeats=5)["c"]
    queued = measure.time_interleaved({"c": call}, [x], warmup=1, repeats=5, queued_ms=10.0)["c"]
    assert min(idle) > 2.5 and max(queued) < 1.0, (idle, queued)


def test_round_order_is_a_reproducible_shuffle_without_fixed_neighbours():
    names = ["copy", "full_vocab", "topk_first", "topk_first_torch"]
    orders = [measure.round_robin_order(names, r) for r in range(40)]
    assert all(sorted(o) == sorted(names) for o in orders)
    assert orders == [measure.round_robin_order(names, r) for r in range(40)]
    assert {o[0] for o in orders} == set(names)  # every name is sometimes first
    before_topk_first = {o[o.index("topk_first") - 1] for o in orders if o[0] != "topk_first"}
    assert before_topk_first == {"copy", "full_vocab", "topk_first_torch"}


def test_peak_memory_not_measured_on_cpu():
    out, peak = measure.call_with_peak_memory(lambda x: x * 2, torch.ones(3))
    assert peak is None and torch.equal(out, torch.full((3,), 2.0))


# ---------------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------------


def test_compare_bitwise_ties_and_differences():
    ref = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    assert compare_outputs(ref.clone(), ref).bitwise_equal
    tie = compare_outputs(torch.tensor([[0.5, 0.0, 0.5, 0.0]]), ref)  # another tied token kept
    assert not tie.bitwise_equal and not tie.kept_sets_equal and tie.values_equal and tie.max_abs_diff == 0.0
    diff = compare_outputs(torch.tensor([[0.6, 0.4, 0.0, 0.0]]), ref)
    assert not diff.values_equal and diff.kept_counts_equal and math.isclose(diff.max_abs_diff, 0.1, rel_tol=1e-5)
    assert not compare_outputs(torch.zeros(2, 4), ref).bitwise_equal


# ---------------------------------------------------------------------------------------------
# registry and the SGLang adapter
# ---------------------------------------------------------------------------------------------


def test_registry_error_lists_valid_names():
    with pytest.raises(impls.ImplError) as err:
        impls.resolve_impls(["full_vocab", "nope"])
    assert "'nope'" in str(err.value)
    for name in ("full_vocab", "topk_first", "topk_first_torch", "sglang"):
        assert name in str(err.value)


def test_every_builder_has_a_description_in_the_report():
    from harness.micro.writeup import IMPL_DESCRIPTIONS  # noqa: PLC0415

    assert set(IMPL_DESCRIPTIONS) == set(verify.BUILDERS) | {"sglang"}


def test_baseline_must_be_a_project_builder():
    with pytest.raises(impls.ImplError, match="micro.baseline"):
        app.check_config(MicroConfig(baseline="sglang"))


def fake_sglang_builder(
    *,
    next_token_logits,
    sampling_info,
    draft_token_num,
    bs,
    max_top_k=None,
    uniform_top_k_value=None,
    use_sparse_topk=True,
):
    """Stands in for SGLang's function under either name: checks the shapes the adapter passes, computes
    with the project's builder (the real function's values: tests/conformance/test_sglang_builders.py)."""
    assert sampling_info.temperatures.shape == (bs, 1) and sampling_info.top_ks.dtype == torch.int32
    assert sampling_info.top_ps.shape == (bs,) and sampling_info.need_top_k_sampling
    assert next_token_logits.shape[0] == bs * draft_token_num and max_top_k == 7 and uniform_top_k_value == 7
    t = torch.repeat_interleave(sampling_info.temperatures.squeeze(-1), draft_token_num)
    probs = verify.full_vocab_probs(next_token_logits, t, sampling_info.top_ks, sampling_info.top_ps)
    return probs.view(bs, draft_token_num, -1)


def install_fake_sglang(monkeypatch, **functions):
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    module = types.ModuleType(impls.SGLANG_MODULE)
    for name, fn in functions.items():
        setattr(module, name, fn)
    monkeypatch.setitem(sys.modules, impls.SGLANG_MODULE, module)


@pytest.mark.parametrize("fn_name", impls.SGLANG_FUNCTIONS)
def test_sglang_adapter_calls_either_name(monkeypatch, fn_name):
    install_fake_sglang(monkeypatch, **{fn_name: fake_sglang_builder})
    [impl] = impls.resolve_impls(["sglang"])
    assert impl.available and impl.info["function"].endswith(fn_name)
    logits = make_logits(5, 64, seed=3)
    p = make_params(5, temperature=0.7, top_k=7, top_p=0.9, device=torch.device("cpu"))
    out = impl.prepare(p)(logits)
    assert out.shape == (5, 64)
    assert torch.equal(out, verify.full_vocab_probs(logits, p.temperature, p.top_k, p.top_p))


def test_sglang_adapter_refuses_an_unknown_required_parameter(monkeypatch):
    def odd(*, next_token_logits, sampling_info, spec_mode):
        raise AssertionError("must not be called")

    install_fake_sglang(monkeypatch, build_speculative_verify_target_probs=odd)
    [impl] = impls.resolve_impls(["sglang"])
    p = make_params(2, temperature=1.0, top_k=7, top_p=1.0, device=torch.device("cpu"))
    with pytest.raises(TypeError, match=r"adapter does not know \[.spec_mode.\]"):
        impl.prepare(p)(torch.zeros(2, 16))


def test_sglang_missing_or_without_the_function_is_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang -> ImportError
    [impl] = impls.resolve_impls(["sglang"])
    assert not impl.available and impl.note == "sglang not installed: skipped"
    install_fake_sglang(monkeypatch)  # the module exists, neither function does
    [impl] = impls.resolve_impls(["sglang"])
    assert not impl.available and "build_dflash_verify_target_probs" in impl.note and "skipped" in impl.note


@pytest.fixture
def sglang_on_disk(tmp_path, monkeypatch):
    """Write a stand-in `sglang` package under tmp_path (files: relative path -> source) and make it the
    one `import sglang` finds; sys.modules is restored afterwards."""
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)

    def write(files: dict[str, str]) -> None:
        for rel, source in files.items():
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))

    yield write
    for name in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_sglang_whose_import_raises_is_skipped_with_the_first_line(sglang_on_disk):
    sglang_on_disk({"sglang/__init__.py": "raise RuntimeError('Found no NVIDIA driver on your system.\\nmore')\n"})
    [impl] = impls.resolve_impls(["sglang"])
    assert not impl.available
    assert impl.note.endswith(
        "installed but sglang does not import (RuntimeError: Found no NVIDIA driver on your system.): skipped"
    ), impl.note


def test_sglang_missing_its_kernel_wheel_is_skipped_naming_the_module(sglang_on_disk):
    """As on a CUDA host without sgl_kernel (the real chain: tests/conformance/test_sglang_micro.py)."""
    if importlib.util.find_spec("sgl_kernel") is not None:
        pytest.skip("sgl_kernel is installed here")
    sglang_on_disk(
        {
            "sglang/__init__.py": "__version__ = '9.9'\n",
            "sglang/srt/__init__.py": "",
            "sglang/srt/speculative/__init__.py": "",
            "sglang/srt/speculative/dflash_utils.py": "from sgl_kernel import int8_scaled_mm\n",
        }
    )
    [impl] = impls.resolve_impls(["sglang"])
    assert not impl.available
    assert impl.note == (
        "sglang 9.9 installed but sglang.srt.speculative.dflash_utils needs the module 'sgl_kernel', "
        "which is not installed (SGLang's compiled CUDA kernel wheel): skipped"
    )


def test_sglang_kwargs_repeat_requests_over_draft_tokens(monkeypatch):
    install_fake_sglang(monkeypatch, build_speculative_verify_target_probs=fake_sglang_builder)
    p = make_params(2, temperature=0.7, top_k=7, top_p=0.9, device=torch.device("cpu"))
    kwargs = impls.sglang_kwargs(fake_sglang_builder, torch.zeros(6, 64), p, draft_token_num=3)
    assert kwargs["bs"] == 2 and kwargs["draft_token_num"] == 3
    assert kwargs["max_top_k"] == 7 and kwargs["uniform_top_k_value"] == 7
    with pytest.raises(ValueError, match="5 logit rows for 2 requests x draft_token_num=3"):
        impls.sglang_kwargs(fake_sglang_builder, torch.zeros(5, 64), p, draft_token_num=3)


def test_an_external_impl_error_is_recorded_a_project_error_raises():
    cfg = MicroConfig(vocab=[64], rows=[4], repeats=1, warmup=0, min_rotate_bytes=0, device="cpu")
    source = app.Input("iid", 64)

    def boom(_p):
        return lambda _x: (_ for _ in ()).throw(RuntimeError("kernel missing"))

    base = impls.resolve_impls(["full_vocab"])[0]
    ext = impls.Impl(name="sglang", prepare=boom, external=True)
    rows = app.bench_rows(cfg, source, 4, torch.device("cpu"), [base, ext], base, step=lambda _s: None)
    assert rows[0].status == "ok" and rows[1].status == "error" and "kernel missing" in rows[1].note
    with pytest.raises(RuntimeError, match="kernel missing"):
        app.bench_rows(
            cfg, source, 4, torch.device("cpu"), [impls.Impl(name="x", prepare=boom)], base, step=lambda _s: None
        )


# ---------------------------------------------------------------------------------------------
# report formatting and environment helpers
# ---------------------------------------------------------------------------------------------


def test_seed_table_formatting():
    def row(impl, ms, peak):
        r = app.ResultRow(
            impl=impl,
            rows=1024,
            vocab=248320,
            status="ok",
            top_k=20,
            top_p=0.95,
            temperature=1.0,
            dtype="float32",
            padding_fraction=0.0,
            padding_rows=0,
            device="cuda",
        )
        r.median_ms, r.peak_temp_bytes = ms, peak
        return r

    out = 1024 * 248320 * 4  # the dense fp32 output: 0.95 GiB
    table = writeup.seed_table(
        [row("full_vocab", 3.774, 2 * out), row("topk_first", 1.04, out)], "full_vocab", "topk_first"
    )
    line = " ".join(table.splitlines()[-1].split())
    assert line == "| 1024 | 3.77 ms | 1.04 ms | 1.89 to 0.95 GiB |"
    assert writeup.fmt_ms(14.21) == "14.2" and writeup.fmt_ms(0.6712) == "0.67" and writeup.fmt_ms(153.2) == "153"
    assert writeup.seed_table([row("full_vocab", 1.0, None)], "full_vocab", "topk_first") is None


def test_nvidia_smi_parsing_and_tolerance(monkeypatch):
    gpus = envinfo.parse_nvidia_smi(
        "NVIDIA H200, 570.124.06, 1980 MHz, 3201 MHz, 1980 MHz\nNVIDIA H200, 570.124.06, [N/A], 3201 MHz, 1980 MHz\n"
    )
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H200",
        "driver_version": "570.124.06",
        "clocks_sm_mhz": 1980,
        "clocks_mem_mhz": 3201,
        "clocks_max_sm_mhz": 1980,
    }
    assert gpus[1]["clocks_sm_mhz"] is None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert envinfo.gpu_info() is None
    assert envinfo.git_info(Path("/")).git_sha is None


def test_out_dir_is_exact_else_timestamped_and_never_reused(tmp_path):
    exact = app.make_out_dir(str(tmp_path / "ignored"), str(tmp_path / "published" / "h200"))
    assert exact == tmp_path / "published" / "h200" and exact.is_dir()
    assert not (tmp_path / "ignored").exists()
    first = app.make_out_dir(str(tmp_path), None)
    second = app.make_out_dir(str(tmp_path), None)
    assert first.parent == second.parent == tmp_path / "micro" and first != second
    assert app.make_out_dir(str(tmp_path), str(exact)) == exact  # still empty: taken
    (exact / "results.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="already holds results.jsonl: a run never writes over earlier results"):
        app.make_out_dir(str(tmp_path), str(exact))  # an earlier set, e.g. a published one
    assert (exact / "results.jsonl").read_text() == "{}\n"
    with pytest.raises(ConfigError, match="is a file"):
        app.make_out_dir(str(tmp_path), str(exact / "results.jsonl"))


def test_an_interrupted_set_is_marked_so_and_keeps_its_rows(tmp_path):
    said, steps = [], []

    def step(label: str) -> None:
        steps.append(label)
        if len(steps) == 3:
            raise KeyboardInterrupt

    cfg = MicroConfig(
        vocab=[64],
        rows=[2, 4],
        repeats=1,
        warmup=0,
        impls=["full_vocab"],
        device="cpu",
        min_rotate_bytes=0,
        out_dir=str(tmp_path / "m"),
    )
    with pytest.raises(KeyboardInterrupt):
        app.run(cfg, results_dir=str(tmp_path), resolved={}, overrides=[], step=step, say=said.append)
    assert json.loads((tmp_path / "m" / "manifest.json").read_text())["status"] == "interrupted"
    assert (tmp_path / "m" / "results.jsonl").read_text().strip()  # the rows measured before it
    assert any("interrupted: the rows measured so far are kept in" in s for s in said)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"min_rotate_bytes": -1}, "micro.min_rotate_bytes=-1 must be >= 0"),
        ({"temperature": math.nan}, "micro.temperature=nan must be finite and >= 0"),
        ({"temperature": math.inf}, "micro.temperature=inf must be finite"),
        ({"top_k": 20, "vocab": [32000, 16]}, "micro.top_k=20 covers a whole vocabulary of micro.vocab=[32000, 16]"),
    ],
)
def test_values_the_builders_would_not_honour_are_refused(values, message):
    with pytest.raises(ConfigError, match=message.replace("[", "\\[").replace("]", "\\]")):
        MicroConfig(**values)
    MicroConfig(top_k=-1)  # SGLang's "no top-k": the whole-vocabulary path, asked for


@pytest.mark.skipif(sglang_importable(), reason="needs an environment without SGLang (its implementation skipped)")
def test_a_set_that_measured_nothing_fails(tmp_path):
    proc = run_micro(
        "micro.impls=[sglang]",
        "micro.vocab=[64]",
        "micro.rows=[4]",
        "micro.repeats=1",
        "micro.warmup=0",
        "micro.device=cpu",
        "micro.min_rotate_bytes=0",
        f"micro.out_dir={tmp_path}",
    )
    assert proc.returncode == 1 and "failed: nothing was measured" in proc.stderr, proc.stdout + proc.stderr
    assert "- (nothing ran)" in (tmp_path / "report.md").read_text()  # never "bitwise" for what was not compared


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_run_measures_peak_memory_and_matches(tmp_path):
    vocab, rows = 32000, 64
    proc = run_micro(
        f"micro.vocab=[{vocab}]",
        f"micro.rows=[{rows}]",
        "micro.repeats=5",
        "micro.device=cuda",
        "micro.impls=[full_vocab,topk_first,topk_first_torch]",
        f"micro.out_dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {r["impl"]: r for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    out_bytes = rows * vocab * 4
    assert got["topk_first"]["peak_temp_bytes"] >= out_bytes  # the dense output counts
    assert got["full_vocab"]["peak_temp_bytes"] >= 2 * out_bytes  # plus the scaled fp32 copy of the logits
    assert all(r["bitwise_equal"] and r["median_ms"] > 0 and r["copy_floor_ms"] > 0 for r in got.values())
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["device"]["type"] == "cuda" and manifest["gpu"] is not None
