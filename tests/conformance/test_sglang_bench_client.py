"""SGLang's own benchmark client (`python -m sglang.benchmark.serving`) against the embedded server.

One embedded server (DFLASH, sampled drafts) serves three client runs, one per backend: `sglang`
(native /generate), `sglang-oai-chat` (/v1/chat/completions) and `sglang-oai` (/v1/completions), one
after the other in one client process (the CLI module run as `python -m` runs it). Each must complete
every request. No `--tokenizer`: the client loads the tokenizer folder that
`/model_info`'s `tokenizer_path` names, offline.

Dataset: `random-ids`. `--dataset-name random` cuts prompts out of ShareGPT, which it downloads from
the hub unless `--dataset-path` names a local copy (sglang/benchmark/datasets/random.py,
`sample_random_requests` with `random_sample=True`); `random-ids` draws token ids from the tokenizer's
vocabulary and decodes them into prompts, so it needs nothing but the tokenizer (and exercises it).

The server runs with `--decode-log-interval 1`: `avg_spec_accept_length`, which the client prints as
"Accept length", is refreshed at every decode-log-interval boundary (as in SGLang), and a run this short
would otherwise end before the first one. `--flush-cache` makes the figure cover the measured requests only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from serverutil import HOST, engine_server
from sglang_support import import_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NUM_PROMPTS = 32
INPUT_LEN, OUTPUT_LEN, RANGE_RATIO = 64, 32, 0.5
NUM_DRAFT_TOKENS = 8
SERVER_ARGS = [
    "--model-path",
    "embedded:mini",
    "--speculative-algorithm",
    "DFLASH",
    "--draft-mode",
    "sampled",
    "--speculative-num-draft-tokens",
    str(NUM_DRAFT_TOKENS),
    "--decode-log-interval",
    "1",
    "--random-seed",
    "3",
]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
CLIENT_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def server(cache_home: Path):
    import_sglang("sglang.benchmark.serving")  # skips (or, when required, fails) without the SGLang environment
    with engine_server(SERVER_ARGS, env={"XDG_CACHE_HOME": str(cache_home), **OFFLINE}) as s:
        yield s


BACKENDS = ["sglang", "sglang-oai-chat", "sglang-oai"]

# SGLang's client CLI once per backend, in ONE process (its imports cost about 9 CPU-s): each run executes the
# module as `python -m` does (runpy, as __main__, with its argv; a fresh module namespace per run), its stdout
# captured, and the server's /server_info read right after it.
CLIENT_RUNS = """
import contextlib, io, json, runpy, sys, traceback, urllib.request
url, runs = sys.argv[1], json.loads(sys.argv[2])
done = {}
for backend, argv in runs.items():
    sys.argv, out, code = ["python -m sglang.benchmark.serving", *argv], io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception:
        code, out = 1, io.StringIO(out.getvalue() + traceback.format_exc())
    with urllib.request.urlopen(url + "/server_info", timeout=30) as r:
        info = json.load(r)
    done[backend] = {"returncode": code, "stdout": out.getvalue(), "server_info": info}
print(json.dumps(done))
"""


def client_argv(port: int, backend: str, output: Path) -> list[str]:
    return [
        "--backend",
        backend,
        "--host",
        HOST,
        "--port",
        str(port),
        "--dataset-name",
        "random-ids",
        "--num-prompts",
        str(NUM_PROMPTS),
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--random-range-ratio",
        str(RANGE_RATIO),
        "--seed",
        "1",
        "--flush-cache",
        "--disable-tqdm",
        "--output-file",
        str(output),
        "--output-details",
        "--ready-check-timeout-sec",
        "10",
    ]


@pytest.fixture(scope="module")
def client_runs(server, tmp_path_factory) -> dict[str, dict]:
    """Every backend's run: exit code, stdout, the server's /server_info after it, and its output JSON line."""
    out_dir = tmp_path_factory.mktemp("client")
    runs = {b: client_argv(server.port, b, out_dir / f"{b}.jsonl") for b in BACKENDS}
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT_RUNS, server.url, json.dumps(runs)],
        cwd=out_dir,
        env={**os.environ, **OFFLINE},
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S * len(BACKENDS),
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    done = json.loads(proc.stdout.strip().splitlines()[-1])
    for backend, run in done.items():
        lines = (out_dir / f"{backend}.jsonl").read_text().splitlines() if run["returncode"] == 0 else []
        run["result"] = json.loads(lines[0]) if len(lines) == 1 else {"output lines": lines}
    return done


@pytest.mark.parametrize("backend", BACKENDS)
def test_bench_client_completes_every_request(client_runs, backend: str, cache_home: Path) -> None:
    run = client_runs[backend]
    assert run["returncode"] == 0, f"{backend}: exit {run['returncode']}\n{run['stdout'][-4000:]}"
    result, stdout = run["result"], run["stdout"]
    assert "output lines" not in result, result  # one JSON line per run
    errors = [e for e in result["errors"] if e]
    assert result["completed"] == NUM_PROMPTS and not errors, errors[:3]
    low = int(OUTPUT_LEN * RANGE_RATIO)
    assert all(low <= n <= OUTPUT_LEN for n in result["output_lens"]), result["output_lens"]  # ignore_eos: all of them
    assert result["total_output_tokens"] == sum(result["output_lens"]) > 0
    assert result["total_output_tokens_retokenized"] > 0
    # the tokenizer came from /model_info (there is no --tokenizer), from the server's cache folder
    tokenizer_path = Path(result["server_info"]["tokenizer_path"])
    assert tokenizer_path.parent == cache_home / "specbench" / "tokenizers"
    # the accept length it printed: the server's lifetime figure since --flush-cache, in (1, gamma + 1]
    accept_length = result["accept_length"]
    assert accept_length is not None and 1.0 < accept_length <= NUM_DRAFT_TOKENS
    assert re.search(rf"^Accept length:\s+{accept_length:.2f}\s*$", stdout, re.MULTILINE), stdout[-2000:]
    state = run["server_info"]["internal_states"][0]  # read right after this backend's run
    assert state["avg_spec_accept_length"] == accept_length
