"""Every experiment file composes and dry-runs; bad overrides fail with the valid keys listed."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from llamacpp_support import require_llama_server
from rich.console import Console

from configs import NEEDS, SGLANG_PATHS, SKIP, composed, dry_run, dry_run_text
from harness.backends.python_preflight import EXIT_CODE, named_flag
from harness.hydra_setup import CONFIG_DIR
from harness.runner.command import GROUPS, after_runs
from harness.runner.config import BenchConfig
from harness.runner.overrides import OverrideError, check_overrides, group_options
from harness.runner.plan import make_plan
from harness.validation import ConfigError


@pytest.mark.parametrize("name", group_options("experiment"))
def test_every_experiment_composes_and_dry_runs(name):
    if name.startswith("llamacpp"):
        require_llama_server()  # its argv preflight runs the binary
    cfg = composed(f"experiment={name}", "dry_run=true", *NEEDS.get(name, []))
    text = dry_run_text(cfg)
    plan = make_plan(cfg.experiment)
    assert len(plan) == len(cfg.experiment.arms) * len(cfg.experiment.base_seeds) * cfg.experiment.repeats
    for run in plan:
        assert run.run_id in text
    assert "nothing was launched" in text
    # the arms differ in argv (or interpreter, or code), except in the A/A experiment
    assert ("(same argv)" in text) == (name in ("embedded_aa", "embedded_code_ab"))
    assert "code under test" in text
    if cfg.server.backend == "sglang":
        assert "argv preflight SKIPPED (server.preflight=skip): the commands were NOT checked" in text
    elif cfg.server.backend == "llamacpp":
        assert "argv preflight passed" in text and "accepted by llama-server's parser" in text
    elif cfg.server.backend == "openai":  # servers already running: nothing to parse, nothing launched
        assert "argv preflight: not applicable" in text and "server: already running at" in text
    else:
        assert "argv preflight passed" in text and "accepted by the embedded server's parser" in text


def test_seed_protocol_block_vs_token_is_exact():
    cfg = composed("experiment=dflash_block_vs_token", *NEEDS["dflash_block_vs_token"])
    assert cfg.experiment.base_seeds == [980406, 981406, 982406]
    assert cfg.sampling.max_new_tokens == 32768 and cfg.client.concurrency == 8
    assert (cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.top_k) == (1.0, 0.95, 20)
    assert "--disable-radix-cache" in cfg.server.args and "--enable-deterministic-inference" in cfg.server.args
    assert cfg.workload.kind == "aime25" and cfg.experiment.warmup.requests == 8
    text = dry_run_text(cfg)
    assert "+ --speculative-use-block-verification" in text
    assert "sglang.launch_server" in text and "--speculative-draft-model-path /models/draft" in text


def test_speedbench_runs_arms_side_by_side_on_two_gpus():
    cfg = composed("experiment=dflash_verify_probs_speedbench", *NEEDS["dflash_verify_probs_speedbench"])
    plan = make_plan(cfg.experiment)
    for slot in {r.slot for r in plan}:
        gpus = sorted(r.gpu for r in plan if r.slot == slot)
        assert gpus == [0, 1]
    text = dry_run_text(cfg)
    assert "CUDA_VISIBLE_DEVICES=0" in text and "CUDA_VISIBLE_DEVICES=1" in text
    assert "- /envs/before/bin/python; + /envs/after/bin/python" in text


def test_missing_model_path_is_named():
    with pytest.raises(Exception, match="model_path"):
        composed("experiment=dflash_block_vs_token")


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match="experiment.order='zigzag'.*alternate, fixed"):
        composed("experiment.order=zigzag")
    with pytest.raises(ConfigError, match="experiment.baseline='c'"):
        composed("experiment.baseline=c")
    with pytest.raises(ConfigError, match="sampling.top_p=1.5"):
        composed("sampling.top_p=1.5")


@pytest.mark.parametrize(
    "override, message",
    [
        ("sampling.temperature=nan", r"sampling.temperature=nan must be a finite number in \[0, inf\)"),
        ("sampling.temperature=inf", r"sampling.temperature=inf must be a finite number"),
        ("sampling.top_p=nan", r"sampling.top_p=nan must be a finite number in \(0, 1\]"),
        ("sampling.min_p=-0.1", r"sampling.min_p=-0.1 must be a finite number in \[0, 1\]"),
        (
            "sampling.top_k=4294967296",
            r"sampling.top_k=4294967296 must be -1 \(whole vocabulary\) or in \[1, 2147483647\]",
        ),
        ("client.timeout_s=-1", r"client.timeout_s=-1.0 must be a finite number in \(0, inf\)"),
        ("client.request_rate=nan", r"client.request_rate \(requests/s; null for closed loop\)=nan"),
        ("server.ready_timeout_s=0", r"server.ready_timeout_s=0.0 must be a finite number in \(0, inf\)"),
        ("server.health_timeout_s=0", r"server.health_timeout_s=0.0 must be a finite number in \(0, inf\)"),
        ("experiment.warmup.requests=-1", r"experiment.warmup.requests=-1 must be >= 0"),
        ("experiment.max_failed_requests=-1", r"experiment.max_failed_requests=-1 must be >= 0"),
        ("campaign=../elsewhere", r"campaign='../elsewhere' is not a safe directory name"),
        ("campaign=a/b", r"campaign='a/b' is not a safe directory name"),
        ("experiment.name=..", r"experiment.name='..' is not a safe directory name"),
        ("experiment.arms.0.name=x/y", r"experiment.arms\[0\].name='x/y' is not a safe directory name"),
        ("server.log_checks.must=['(']", r"log_checks.must regex '\(' is invalid \(missing \)"),
        ("experiment.arms.1.log_checks.must_not=['[a']", r"log_checks.must_not regex '\[a' is invalid"),
    ],
)
def test_bad_numbers_names_and_regexes_are_refused_before_anything_runs(override, message):
    with pytest.raises(ConfigError, match=message):
        composed(override)


def test_unwritable_results_dir_is_a_message_not_a_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.bench",
            f"results_dir={blocker}",
            "workload.n_items=1",
            "server.model_path=embedded:mini",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = proc.stdout.replace("\n", "")
    assert f"cannot write the campaign folder {blocker}" in out and "choose a writable results_dir" in out
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "override, message",
    [
        ("client.concurency=3", "client has no key 'concurency'; valid keys: route, stream, concurrency"),
        ("experiment.warmup.request=3", "warmup has no key 'request'; valid keys: requests, max_new_tokens"),
        ("bogus=1", "the top level has no key 'bogus'"),
        ("+client.concurency=1", "client has no key 'concurency'"),  # added, it would be dropped without a word
        ("++experiment.foo=1", "experiment has no key 'foo'"),
        ("+extra=1", "the top level has no key 'extra'"),
        ("client.concurrency=abc", "client.concurrency='abc' is not an integer"),  # a value the typed config refuses:
        ("client.concurrency=1.5", "client.concurrency=1.5 is not an integer"),  # named here, exit 2 (Hydra: exit 1)
        ("client.concurrency=4,abc", "client.concurrency='abc' is not an integer"),
        ("dry_run=maybe", "dry_run='maybe' is not true or false"),
        ("experiment.base_seeds=abc", "experiment.base_seeds='abc' is not a list"),
        ("experiment.base_seeds=[1,x]", "experiment.base_seeds='x' is not an integer"),
        ("client.concurrency=null", "client.concurrency needs a value"),
        ("~client.concurrency", "the typed config cannot lose a key"),
        ("experiment=nope", "valid experiment configs: dflash_block_vs_token"),
        ("server=vllm", "valid server configs: embedded, llamacpp, openai, openai_vllm, sglang"),
    ],
)
def test_bad_overrides_list_the_valid_keys(override, message):
    with pytest.raises(OverrideError) as err:
        check_overrides([override], BenchConfig, GROUPS)
    assert message in str(err.value)


def test_good_overrides_pass():
    check_overrides(
        [
            "client.concurrency=4",
            "experiment.arms.0.args=[--x]",
            "server.env.FOO=1",
            "experiment=embedded_aa",
            "+server.env.FOO=1",
            "++client.concurrency=2",
            "hydra.verbose=true",
            "client.request_rate=null",
            "experiment.base_seeds=[1,2]",
            "client.concurrency=range(1,3)",
            "dry_run=yes",
            "~server.env.FOO",
            "client.timeout_s=5",
            "client.concurrency=64,128",
        ],
        BenchConfig,
        GROUPS,
    )


def test_cli_bad_override_exits_with_the_valid_keys():
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench", "client.concurency=3"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "concurrency" in proc.stderr and "concurency" in proc.stderr


def test_cli_dry_run_prints_argv_and_launches_nothing():
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench", "dry_run=true"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("-m harness.engine") == 6
    assert "nothing was launched" in proc.stdout
    assert "workload: synthetic" in proc.stdout and "items, sha256" in proc.stdout  # read as a run reads it


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["workload=jsonl", "workload.path=/nonexistent.jsonl"], "/nonexistent.jsonl does not exist"),
        (["experiment.base_seeds=[9223372036854775807]"], "does not fit a 64-bit integer"),
    ],
)
def test_cli_dry_run_refuses_what_the_run_would_refuse(overrides, message):
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench", *overrides, "dry_run=true"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and message in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def user_config_dir(tmp_path) -> Path:
    """A user's --config-dir holding experiment/my_aa.yaml (embedded_aa renamed)."""
    user = tmp_path / "user"
    (user / "experiment").mkdir(parents=True)
    (user / "experiment" / "my_aa.yaml").write_text(
        (CONFIG_DIR / "experiment" / "embedded_aa.yaml").read_text().replace("name: embedded_aa", "name: my_aa")
    )
    return user


def test_override_check_reads_glob_sweeps_and_user_config_dirs(tmp_path):
    """The pre-check never blocks a Hydra feature: `glob(...)` group sweeps and experiments found only in a
    --config-dir pass; a glob that matches nothing, or a name in no config folder, is still refused."""
    check_overrides(["experiment=glob(embedded_*)", "client.concurrency=1,2"], BenchConfig, GROUPS)
    with pytest.raises(OverrideError, match=r"matches nothing.*embedded_aa"):
        check_overrides(["experiment=glob(nope*)"], BenchConfig, GROUPS)
    user = user_config_dir(tmp_path)
    with pytest.raises(OverrideError, match="my_aa"):
        check_overrides(["experiment=my_aa"], BenchConfig, GROUPS)
    for argv in (
        ["--config-dir", str(user), "experiment=my_aa"],
        [f"--config-dir={user}", "experiment=my_aa"],
        ["-cd", str(user), "experiment=my_aa"],
    ):
        check_overrides(argv, BenchConfig, GROUPS)
    mine = user / "experiment" / "my_aa.yaml"
    mine.write_text("\n".join(line for line in mine.read_text().splitlines() if "@package" not in line))
    with pytest.raises(
        OverrideError,
        match=r"my_aa\.yaml: an experiment file begins with the line '# @package "
        r"_global_'",
    ):
        check_overrides(["--config-dir", str(user), "experiment=my_aa"], BenchConfig, GROUPS)


def test_cli_runs_a_user_experiment_and_a_glob_sweep(tmp_path):
    user = user_config_dir(tmp_path)
    mine = subprocess.run(
        [sys.executable, "-m", "harness.bench", "--config-dir", str(user), "experiment=my_aa", "dry_run=true"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert mine.returncode == 0, mine.stdout + mine.stderr
    assert "dry run of experiment my_aa" in mine.stdout
    sweep = subprocess.run(
        [sys.executable, "-m", "harness.bench", "-m", "experiment=glob(embedded_a*)", "dry_run=true"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert "dry run of experiment embedded_aa" in sweep.stdout and "Traceback" not in sweep.stderr


def test_plan_alternates_arm_order_by_seed():
    cfg = composed("experiment.repeats=2")
    plan = make_plan(cfg.experiment)
    order = [(r.base_seed, r.repeat, r.arm) for r in plan]
    assert order == [
        (980406, 0, "token"),
        (980406, 0, "block"),
        (980406, 1, "block"),
        (980406, 1, "token"),
        (981406, 0, "token"),
        (981406, 0, "block"),
        (981406, 1, "block"),
        (981406, 1, "token"),
        (982406, 0, "token"),
        (982406, 0, "block"),
        (982406, 1, "block"),
        (982406, 1, "token"),
    ]
    assert [r.index for r in plan] == list(range(12)) and len({r.run_id for r in plan}) == 12
    fixed = make_plan(composed("experiment.order=fixed").experiment)
    assert [r.arm for r in fixed] == ["token", "block"] * 3


# ---------------------------------------------------------------------- the argv preflight (without SGLang)

FAKE_PROBE = """#!{python}
import json, os, sys
if len(sys.argv) > 1 and sys.argv[1].endswith("provenance_probe.py"):  # the code-under-test probe: the real one,
    os.execv("{python}", ["{python}", sys.argv[1], "json"])  # asked about a module this interpreter has
argvs = json.load(sys.stdin)["argvs"]
def stages(argv):
    bad = [a for a in argv if "blok" in a]
    if bad:
        return [{{"stage": "parse", "status": "refused", "message": "unrecognized arguments: " + bad[0]}}]
    return [{{"stage": s, "status": "passed"}} for s in ("parse", "model_independent", "speculative")]
print("SPECBENCH_PREFLIGHT " + json.dumps({{"sglang_version": "0.0-fake",
      "results": [{{"argv": a, "stages": stages(a)}} for a in argvs]}}))
"""


def interpreter(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def sglang_dry_run(python: str, *overrides: str) -> tuple[int, str]:
    return dry_run(composed("experiment=dflash_block_vs_token", *SGLANG_PATHS, f"server.python={python}", *overrides))


def test_preflight_passes_what_the_servers_sglang_accepts_and_names_what_it_refuses(tmp_path):
    fake = interpreter(tmp_path, "python", FAKE_PROBE.format(python=sys.executable))
    code, text = sglang_dry_run(fake)
    assert code == 0 and text.count("preflight: accepted by SGLang 0.0-fake") == 6
    assert "argv preflight passed: 6 distinct command(s) accepted by SGLang 0.0-fake in " + fake in text
    code, text = sglang_dry_run(fake, "experiment.arms.1.args=[--speculative-use-blok-verification]")
    assert code == EXIT_CODE and text.count("preflight: accepted") == 3 and "argv preflight FAILED" in text
    assert "--speculative-use-blok-verification (from experiment.arms.1.args): refused by SGLang's parse check" in text
    assert "SGLang would not start with these commands" in text


def test_preflight_without_sglang_in_the_server_interpreter_fails_saying_not_checked(tmp_path):
    # the real probe, run by an interpreter that has no site-packages (so no SGLang)
    bare = interpreter(tmp_path, "python", f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    code, text = sglang_dry_run(bare)
    assert code == EXIT_CODE and text.count("preflight: NOT checked: no SGLang here: ModuleNotFoundError") == 6
    assert "the commands were NOT checked: point server.python" in text and "nothing was launched" in text
    code, text = sglang_dry_run("/nonexistent/bin/python")
    assert code == EXIT_CODE and "the server interpreter /nonexistent/bin/python cannot be run" in text
    code, text = sglang_dry_run("/nonexistent/bin/python", SKIP)  # said explicitly: the plan only
    assert code == 0 and "NOT checked against SGLang" in text and "preflight:" not in text


# An interpreter that never answers, ignores SIGTERM and leaves a child behind (B13): each start appends its
# child's pid to a file.
HOSTILE = '#!/bin/sh\ntrap "" TERM\nsleep 1000 &\necho $! >> "{pids}"\nwait\n'


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("preflight", ["require", "skip"])
def test_a_hung_interpreter_is_bounded_by_ready_timeout_and_leaves_no_child(tmp_path, preflight):
    pids = tmp_path / "pids"
    hostile = interpreter(tmp_path, "python", HOSTILE.format(pids=pids))
    started = time.monotonic()
    code, text = sglang_dry_run(hostile, "server.ready_timeout_s=1", f"server.preflight={preflight}")
    assert time.monotonic() - started < 60  # 300 s (preflight) and 120 s (provenance probe) before the fix
    assert "did not answer within 1 s" in text
    if preflight == "require":
        assert code == EXIT_CODE
    started_children = [int(p) for p in pids.read_text().split()]
    assert started_children and not [p for p in started_children if _alive(p)]


def test_real_run_preflight_fails_before_anything_is_loaded_or_launched(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.bench",
            "experiment=dflash_block_vs_token",
            *SGLANG_PATHS,
            "server.python=/nonexistent/bin/python",
            f"results_dir={tmp_path / 'results'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EXIT_CODE, proc.stdout + proc.stderr
    assert "argv preflight FAILED" in proc.stdout and "no server was launched" in proc.stdout
    assert not (tmp_path / "results").exists()  # no campaign, no workload download


@pytest.mark.parametrize(
    "message, flag",
    [
        ("unrecognized arguments: --speculative-use-blok-verification", "--speculative-use-blok-verification"),
        ("argument --tp-size/--tensor-parallel-size: invalid int value: 'x'", "--tp-size"),
        (
            "--speculative-use-block-verification only supports EAGLE / EAGLE3 / NEXTN / DFLASH / DSPARK.",
            "--speculative-use-block-verification",
        ),
        ("DSpark speculative_num_draft_tokens must equal gamma + 1", "--speculative-num-draft-tokens"),
        ("argument --kv-cache-dtype: invalid choice: 'bf17'", "--kv-cache-dtype"),
        ("Currently ngram speculative decoding does not support dp attention.", None),
    ],
)
def test_the_flag_of_an_sglang_error_is_named(message, flag):
    args = [
        "--tp-size",
        "x",
        "--speculative-use-block-verification",
        "--speculative-num-draft-tokens",
        "9",
        "--kv-cache-dtype=bf17",
        "--speculative-use-blok-verification",
    ]
    assert named_flag(message, args) == flag


def test_bad_preflight_value_is_named():
    with pytest.raises(ConfigError, match="server.preflight='maybe' is not valid; choose one of: require, skip"):
        composed("server.preflight=maybe")


def test_manifest_client_stream_mode():
    """manifest client.stream_mode: how the client reads the server's stream (docs/records.md)."""
    from harness.client.config import ClientConfig  # noqa: PLC0415
    from harness.runner.runs import stream_mode  # noqa: PLC0415

    incremental = True
    assert stream_mode(ClientConfig(), False) == "cumulative"
    assert stream_mode(ClientConfig(), incremental) == "incremental"
    assert stream_mode(ClientConfig(route="chat"), incremental) == "chat"
    assert stream_mode(ClientConfig(stream=False), incremental) == "none"


def test_new_campaign_ids_differ_within_one_second():
    from harness.runner.folder import new_campaign_id  # noqa: PLC0415

    cfg = composed()
    ids = {new_campaign_id(cfg) for _ in range(50)}
    assert len(ids) == 50
    assert all(i.split("-")[2] == f"c{cfg.client.concurrency}" for i in ids)


def test_a_shard_that_ends_names_the_shards_still_to_run(tmp_path):
    plan = [SimpleNamespace(run_id=f"r{i}", slot=i // 2) for i in range(6)]  # 3 shards of 2 runs
    done = {"r0", "r1", "r4", "r5"}  # shards 0 and 2 finished, shard 1 not yet
    campaign = SimpleNamespace(
        plan=plan, root=tmp_path / "c1", run_status=lambda run_id: "finished" if run_id in done else None
    )
    cfg = SimpleNamespace(report=True, shard=0, strict_audit=True)
    out = io.StringIO()
    code = after_runs(
        cfg, campaign, {"r0": "finished", "r1": "finished"}, Console(file=out, width=300), None, "campaign=c1 shard=0"
    )
    assert code == 0
    assert "shard 0 done; shards not finished: 1 (run each with campaign=c1 shard=K)" in out.getvalue()
