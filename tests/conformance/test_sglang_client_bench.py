"""The client-overhead benchmark with SGLang 0.5.23's own client (`sglang.benchmark.serving`'s request
function for the sglang backend) beside the project's, on the same stub, at a tiny size (`make client-bench`
runs the full one)."""

from __future__ import annotations

import orjson
import pytest
from sglang_support import import_sglang

from harness.client import overhead as client_bench

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def test_both_clients_read_the_same_stub(tmp_path):
    import_sglang("sglang.benchmark.serving")  # skips (or, when required, fails) without the SGLang environment
    code = client_bench.main(
        [
            "--streams",
            "3",
            "--waves",
            "2",
            "--short-tokens",
            "12",
            "--step-ms",
            "1",
            "--long-tokens",
            "48",
            "--long-streams",
            "2",
            "--long-requests",
            "2",
            "--long-chunk-tokens",
            "8",
            "--long-step-ms",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    (run,) = tmp_path.iterdir()
    report = orjson.loads((run / "client_bench.json").read_bytes())
    rows = {(r["client"], r["tokens"]): r for r in report["results"]}
    assert set(rows) == {("ours", 12), ("sglang", 12), ("ours", 48), ("sglang", 48)}
    assert "SGLang 0.5.23" in report["note"]
    for tokens, chunks in ((12, 6 * 12), (48, 2 * 6)):
        assert rows["ours", tokens]["chunks"] == rows["sglang", tokens]["chunks"] == chunks
    assert rows["ours", 12]["connections"] == 3  # kept and reused
    assert rows["sglang", 12]["connections"] == 6  # SGLang's request function opens a session per request
