"""Unit tests of analysis.commands: what counts as a difference between two server commands."""

from __future__ import annotations

from analysis.commands import EnvDiff, Hunk, env_diffs, normalise, token_hunks


def test_port_run_id_and_base_seed_are_masked():
    cmd = [
        "python",
        "-m",
        "srv",
        "--port",
        "31001",
        "--random-seed",
        "980406",
        "--log-file",
        "/r/runs/003-block/server.log",
        "--port=31002",
        "--random-seed=980406",
        "--max-running-requests",
        "980406",
    ]
    assert normalise(cmd, "003-block", 980406) == [
        "python",
        "-m",
        "srv",
        "--port",
        "<port>",
        "--random-seed",
        "<base_seed>",
        "--log-file",
        "/r/runs/<run_id>/server.log",
        "--port=<port>",
        "--random-seed=<base_seed>",
        "--max-running-requests",
        "980406",  # not a seed flag: a real value
    ]
    assert normalise(["--random-seed", "7"], "x", 980406) == ["--random-seed", "7"]  # another seed: kept


def test_hunks_name_the_flag_before_a_changed_value():
    base = ["srv", "--max-running-requests", "8", "--flag"]
    other = ["srv", "--max-running-requests", "16", "--flag", "--speculative-use-block-verification"]
    hunks = token_hunks(base, other)
    assert hunks == [
        Hunk(("8",), ("16",), "--max-running-requests"),
        Hunk((), ("--speculative-use-block-verification",), "--flag"),
    ]
    assert [str(h) for h in hunks] == [
        "after `--max-running-requests`: `8` -> `16`",
        "+ `--speculative-use-block-verification`",
    ]
    assert str(token_hunks(["a", "b"], ["a"])[0]) == "after `a`: - `b`"


def test_env_differences_are_declared_only_when_the_arms_declare_them():
    diffs = env_diffs({"A": "1", "B": "x"}, {"A": "2", "C": "y", "B": "x"}, {"A"})
    assert diffs == [EnvDiff("A", "1", "2", True), EnvDiff("C", None, "y", False)]
