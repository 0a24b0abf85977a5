"""Secrets never reach a campaign's files: by name (environment variables, flags), by shape (tokens of a known
form, URL credentials, secret query values) and by value (a secret found by name is masked wherever it
reappears: the log tail copied into a failed run's error, the server's log, its /server_info reply).

The end-to-end test plants secrets in the runner's environment, in the server's argv (`--api-key`) and in the
server's log (tests/fixtures/servers/faulty_engine.py prints them, and tokens that appear nowhere else), runs
a campaign whose second arm's server dies after printing them, and searches every file of the campaign and
everything the runner printed for each secret."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from campaigns import SMALL

from harness.client.requests import StreamError
from harness.client.sse import parse_object
from harness.server.redact import (
    MASK,
    Secrets,
    clip,
    is_secret_name,
    redact,
    redact_argv,
    redact_override,
    redact_value,
)

FAULTY = Path(__file__).resolve().parents[1] / "fixtures" / "servers"

GH = "ghp_" + "A1b2C3d4" * 5
SLACK = "https://hooks.slack.com/services/T0000AAAA/B0000BBBB/" + "x" * 24
DSN = "https://" + "0123456789abcdef" * 2 + "@o123456.ingest.sentry.io/7890"
PLANTED = {
    "PLANTED_SERVICE_TOKEN": "tok-planted-0123456789",  # secret by name, no known shape
    "GH_PAT": GH,
    "PLANTED_SLACK_WEBHOOK_URL": SLACK,
    "SENTRY_DSN": DSN,
    "PLANTED_DB_URL": "https://db.example.org/q?user=bob&password=hunter2hunter2&token=tkn-0123456789",
}
API_KEY = "argv-api-key-9876543210"
ARM_TOKEN = "arm-env-token-24680"  # an arm's own env (K4: was printed in clear in the resume hint)
# what must appear nowhere: each planted value's secret part
SECRET_PARTS = [
    "tok-planted-0123456789",
    GH,
    "T0000AAAA/B0000BBBB",
    "0123456789abcdef0123456789abcdef",
    "hunter2hunter2",
    "tkn-0123456789",
    API_KEY,
    ARM_TOKEN,
    "AKIA" + "Q" * 16,
    "xoxb-" + "1" * 12,
    "eyJ" + "a" * 12,
]


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("GH_PAT", True),
        ("GITHUB_PAT", True),
        ("SENTRY_DSN", True),
        ("SLACK_WEBHOOK_URL", True),
        ("HF_TOKEN", True),
        ("SESSION_COOKIE", True),
        ("--api-key", True),
        ("PATH", False),
        ("PWD", False),
        ("PYTHON_COMPAT", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("--speculative-num-draft-tokens", False),
    ],
)
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        (SLACK, "https://hooks.slack.com/services/"),
        (DSN, "@o123456.ingest.sentry.io/7890"),
        ("postgres://bob:pw1234@db/x", "postgres://bob:"),
        ("https://h/x?password=hunter2&page=2", "&page=2"),
        ("https://h/x?token=abc123&api_key=k9", "https://h/x?token="),
        ("Authorization: Bearer abcdefgh12345678", "Authorization: Bearer "),
        (f"clone with {GH} now", "clone with "),
        ("AKIA" + "Q" * 16, ""),
        ("hf_" + "a" * 34, ""),
        ("sk-proj-" + "b" * 30, ""),
    ],
)
def test_secret_shapes_are_masked_inside_any_value(value, kept):
    masked = redact_value(value)
    assert MASK in masked and kept in masked and masked != value


def test_env_full_masks_by_name_and_by_shape():
    env = redact({**PLANTED, "HOME": "/root", "PATH": "/usr/bin"})
    assert env["HOME"] == "/root" and env["PATH"] == "/usr/bin"
    assert all(part not in str(env) for part in SECRET_PARTS)


def test_a_secret_found_by_name_is_masked_wherever_it_reappears():
    secrets = Secrets.of(
        {"MY_TOKEN": "abcdef-123456", "SHORT_KEY": "ab", "HOME": "/root"},
        [["--port", "1", "--api-key", API_KEY], ["--hf-token=zz-9876543"]],
    )
    assert secrets.values == (API_KEY, "abcdef-123456", "zz-9876543")  # longest first; too short to match by value: no
    assert secrets.scrub(f"x {API_KEY} y abcdef-123456 z zz-9876543 /root ab") == "x *** y *** z *** /root ab"
    assert redact_argv(["--api-key", API_KEY, "--hf-token=zz"]) == ["--api-key", MASK, "--hf-token=***"]


HF = "hf_" + "Zq9" * 10  # a token known only by its shape


def test_a_shaped_token_is_masked_before_an_error_is_cut_to_length():
    """K2f: cut first, the token's first 18 characters stayed in clear (its tail, which makes it recognisable,
    was cut off)."""
    body = "x" * 181 + " " + HF + " and more"
    assert clip(body, 200) == "x" * 181 + " " + MASK + " and more"[:15]
    with pytest.raises(StreamError) as err:
        parse_object(body.encode())
    assert "hf_" not in str(err.value) and MASK in str(err.value)
    assert redact_override(f"+experiment.arms.0.env.ARM_TOKEN={ARM_TOKEN}") == "+experiment.arms.0.env.ARM_TOKEN=***"
    assert redact_override("server.env.PATH=/bin") == "server.env.PATH=/bin"
    assert redact_override("sampling.max_new_tokens=16") == "sampling.max_new_tokens=16"


def run_leaky_campaign(tmp: Path) -> subprocess.CompletedProcess:
    overrides = [
        "experiment=embedded_aa",
        "experiment.base_seeds=[3]",
        "campaign=leaky",
        *SMALL[:-1],
        "server.module=faulty_engine",
        f"+server.env.PYTHONPATH={FAULTY}",
        "+server.env.FAULTY_ENGINE=leak",
        "+experiment.arms.1.env.FAULTY_ENGINE=leak_and_die",
        f"+experiment.arms.0.env.ARM_TOKEN={ARM_TOKEN}",
        "+experiment.arms.0.env.SHORT_TOKEN=abc",  # too short to mask by value: masked by its name
        "experiment.aa=false",
        f"server.args=[--api-key,{API_KEY}]",
        "server.log_checks.must=[]",
    ]
    return subprocess.run(
        [sys.executable, "-m", "harness.bench", f"results_dir={tmp}", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **PLANTED},
    )


@pytest.mark.slow
def test_secrets_in_the_environment_the_argv_and_the_server_log_appear_in_no_campaign_file(tmp_path):
    proc = run_leaky_campaign(tmp_path)
    printed = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in printed, printed  # arm b's server died: one failed run
    hint = " ".join(printed.split())
    assert "resume them with:" in hint and "'+experiment.arms.0.env.ARM_TOKEN=***'" in hint, hint
    assert "'+experiment.arms.0.env.SHORT_TOKEN=***'" in hint and "SHORT_TOKEN=abc" not in hint
    root = tmp_path / "embedded_aa" / "leaky"
    files = [p for p in root.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"campaign.json", "manifest.json", "server.log", "records.jsonl", "report.md"} <= names, names
    logs = {p.parent.name: p.read_text() for p in root.glob("runs/*/server.log")}
    assert all("leak: api_key=***" in text for text in logs.values()), logs  # the leak happened, masked
    failed = next(p for p in root.glob("runs/*-b-*/manifest.json"))
    assert "leak: api_key=***" in failed.read_text()  # the log tail in the error, masked
    for part in SECRET_PARTS:
        assert part not in printed, part
        for path in files:
            assert part not in path.read_text(errors="replace"), (part, path)
