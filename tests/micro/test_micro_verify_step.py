"""The verify-step microbenchmark (python -m harness.micro.verify_step) on the CPU: every path times, the
sparse path makes the dense path's decisions, and bad arguments are named."""

from __future__ import annotations

import json

import pytest

from harness.micro import verify_step


def cpu_argv(out, **flags: str) -> list[str]:
    """verify_step's argv on the CPU into `out`: each keyword a flag (--families iid ...)."""
    return [*(x for name, value in flags.items() for x in (f"--{name}", value)), "--device", "cpu", "--out", str(out)]


def test_a_small_run_writes_its_report_and_the_paths_agree(tmp_path, capsys):
    out = tmp_path / "vs"
    assert (
        verify_step.main(
            cpu_argv(str(out), families="iid,bf16,padding", vocabs="2048", steps="8", gamma="3", repeats="2")
        )
        == 0
    )
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["family"] for r in results] == ["iid", "bf16", "padding"]
    for r in results:
        assert r["rows"] == 8 * 4 and r["read_floor_ms"] > 0
        assert set(r["median_ms"]) == {"dense_topk_first", "dense_topk_fused", "sparse", "sparse_fused", "read_floor"}
        assert r["rows_differ"]["sparse"] == r["rows_differ"]["sparse_fused"] == 0  # the dense path's tokens
        assert r["peak_bytes"]["sparse"] is None  # measured on CUDA only
        assert r["radix_topk"] == "torch"  # which top-k the topk_first and sparse paths ran, said in each row
    assert all(r["queued_ms"] == 0.0 for r in results)
    report = (out / "report.md").read_text()
    assert report.count("| 2,048 |") == 3 and "read floor" in report and "sparse: torch;" in report
    assert "sparse_fused: given the host's bound on top_k (max_top_k 20" in report  # as a server knows it
    assert all(r["sparse_fused_max_top_k"] == 20 for r in results)
    assert "Timing: each call runs on the CPU after the previous one returned" in report  # no GPU words on a CPU
    assert "torch threads, torch " in report.splitlines()[0] and ", git " in report.splitlines()[0]  # the machine
    assert "wrote" in capsys.readouterr().out


def test_an_unknown_family_is_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        verify_step.main(["--families", "iid,gausian", "--device", "cpu"])
    assert exit_info.value.code == 2 and "gausian" in capsys.readouterr().err


def test_queued_timing_is_refused_off_cuda(capsys):
    with pytest.raises(SystemExit) as exit_info:
        verify_step.main(["--device", "cpu", "--queued-ms", "1"])
    assert exit_info.value.code == 2 and "--queued-ms 1: needs a CUDA device" in capsys.readouterr().err


def test_the_report_says_how_calls_were_timed():
    assert "the host's work before its first kernel is timed too" in verify_step._timing([{"queued_ms": 0.0}, {}])
    queued = verify_step._timing([{"queued_ms": 1.0}])
    assert "queued behind a GPU busy-wait of about 1 ms" in queued and "host's launches overlap GPU work" in queued


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--families", ","], "--families ',' names no family"),
        (["--vocabs", "abc"], "--vocabs 'abc': not a comma-separated list of integers"),
        (["--vocabs", "32000,8"], "--vocabs '32000,8': each must be above top_k 20"),
        (["--repeats", "0"], "--repeats 0 must each be >= 1"),
        (
            ["--families", "smollm2", "--bank", "/nonexistent"],
            "no readable smollm2 rows in the logit bank /nonexistent",
        ),
    ],
)
def test_bad_arguments_are_named_before_anything_runs(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        verify_step.main([*args, "--device", "cpu", "--out", str(tmp_path / "vs")])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "vs").exists()  # nothing made


def test_an_earlier_set_is_never_written_over(tmp_path, capsys):
    (tmp_path / "report.md").write_text("an earlier set")
    with pytest.raises(SystemExit) as exit_info:
        verify_step.main(["--device", "cpu", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "already holds report.md" in capsys.readouterr().err
    assert (tmp_path / "report.md").read_text() == "an earlier set"


def test_an_interrupt_keeps_the_cells_measured(tmp_path, capsys, monkeypatch):
    real, calls = verify_step.one_cell, []

    def one_cell(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_step, "one_cell", one_cell)
    code = verify_step.main(
        cpu_argv(str(tmp_path / "vs"), families="iid,bf16", vocabs="256", steps="2", gamma="1", repeats="1")
    )
    assert code == 130 and "interrupted: 1 of 2 cells measured" in capsys.readouterr().err
    assert len((tmp_path / "vs" / "results.jsonl").read_text().splitlines()) == 1


def test_real_rows_are_named_with_their_bank_and_count(tmp_path):
    out = tmp_path / "vs"
    assert (
        verify_step.main(
            cpu_argv(
                str(out),
                families="smollm2",
                vocabs="256",
                steps="2",
                gamma="1",
                repeats="1",
                bank="tests/fixtures/logit_bank",
            )
        )
        == 0
    )
    row = json.loads((out / "results.jsonl").read_text())
    assert row["bank"] == "tests/fixtures/logit_bank" and row["bank_rows"] == 4  # 2 x 2 rows, of the bank's 8
    assert "smollm2 at 256: 4 distinct rows of tests/fixtures/logit_bank tiled to 4" in (out / "report.md").read_text()


def test_what_cannot_be_allocated_is_refused_naming_its_size(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        verify_step.main(["--vocabs", "1000000000000", "--device", "cpu", "--out", str(tmp_path / "vs")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--vocabs 1000000000000 x 512 rows" in err, err
    assert "needs at least 4,096,000,000,000,000 bytes" in err and "cannot be allocated" in err
    assert not (tmp_path / "vs").exists()


def test_a_cuda_device_torch_does_not_see_is_a_message(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # (as on this CPU-only machine)
    with pytest.raises(SystemExit) as exit_info:
        verify_step.main(["--device", "cuda", "--out", str(tmp_path / "vs")])
    assert exit_info.value.code == 2 and "torch sees no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "vs").exists()
