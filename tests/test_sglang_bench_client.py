"""SGLang's own benchmark client (`python -m sglang.benchmark.serving`) against the embedded server.

One embedded server (DFLASH, sampled drafts) serves three client runs, one per backend: `sglang`
(native /generate), `sglang-oai-chat` (/v1/chat/completions) and `sglang-oai` (/v1/completions). Each
must complete every request. No `--tokenizer`: the client loads the tokenizer folder that
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
from serverutil import HOST, engine_server, get_json
from sglang_support import import_sglang

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NUM_PROMPTS = 32
INPUT_LEN, OUTPUT_LEN, RANGE_RATIO = 64, 32, 0.5
NUM_DRAFT_TOKENS = 8
SERVER_ARGS = ["--model-path", "embedded:mini", "--speculative-algorithm", "DFLASH", "--draft-mode", "sampled",
               "--speculative-num-draft-tokens", str(NUM_DRAFT_TOKENS), "--decode-log-interval", "1",
               "--random-seed", "3"]
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


def run_client(port: int, backend: str, out_dir: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """One `sglang.benchmark.serving` run; its output JSON line."""
    output = out_dir / f"{backend}.jsonl"
    cmd = [sys.executable, "-m", "sglang.benchmark.serving", "--backend", backend, "--host", HOST,
           "--port", str(port), "--dataset-name", "random-ids", "--num-prompts", str(NUM_PROMPTS),
           "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
           "--random-range-ratio", str(RANGE_RATIO), "--seed", "1", "--flush-cache", "--disable-tqdm",
           "--output-file", str(output), "--output-details", "--ready-check-timeout-sec", "10"]
    env = {**os.environ, **OFFLINE}
    proc = subprocess.run(cmd, cwd=out_dir, env=env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    assert proc.returncode == 0, f"{backend}: exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    lines = output.read_text().splitlines()
    assert len(lines) == 1, lines
    return proc, json.loads(lines[0])


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai-chat", "sglang-oai"])
def test_bench_client_completes_every_request(server, backend: str, tmp_path: Path, cache_home: Path) -> None:
    proc, result = run_client(server.port, backend, tmp_path)
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
    assert re.search(rf"^Accept length:\s+{accept_length:.2f}\s*$", proc.stdout, re.MULTILINE), proc.stdout[-2000:]
    state = get_json(server.url + "/server_info")["internal_states"][0]
    assert state["avg_spec_accept_length"] == accept_length  # nothing has run since
