"""A comparison needs a difference, checked before anything launches: required `???` values that composition
could drop, arms that resolve to one launch (and A/As that do not), the embedded server's argv checked by its own
parser in the dry run, and overrides whose value only needs quoting."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from analysis.report import build_report
from harness.contract import CheckoutState, ServerCode
from harness.hydra_setup import CONFIG_DIR
from harness.runner.cmdline import CommandLine
from harness.runner.command import GROUPS, to_typed
from harness.runner.config import BenchConfig, register_configs
from harness.runner.difference import check_arms_differ, parsed_options
from harness.runner.overrides import OverrideError, check_overrides
from harness.runner.plan import planned_launches
from harness.runner.sources import resolve_sources
from harness.runner.unread import check_unread
from harness.server.launch import Launch
from harness.server.provenance import ProvenanceError
from harness.validation import ConfigError

SGLANG_PATHS = ["server.model_path=/models/target", "server.draft_model_path=/models/draft", "server.preflight=skip"]


def typed(*overrides: str) -> BenchConfig:
    """The config as the command composes it, with its command line (Hydra's choices and config folders)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        node = compose(config_name="bench", overrides=list(overrides), return_hydra_config=True)
    line = CommandLine.of(node.hydra)
    with open_dict(node):
        del node["hydra"]
    return to_typed(node, line)


def bench(*overrides: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.bench", *overrides], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def flat(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------------- required values


def test_an_arms_required_interpreter_is_not_dropped():
    """The speedbench experiment marks each arm's python `???`: composition used to turn that into the harness's
    own interpreter for both arms, and the comparison compared one install with itself."""
    with pytest.raises(ConfigError, match=r"experiment\.arms\.0\.python, experiment\.arms\.1\.python are required"):
        typed("experiment=dflash_verify_probs_speedbench", *SGLANG_PATHS)
    with pytest.raises(
        ConfigError,
        match=r"^experiment\.arms\.1\.python is required and has no value: set it on the "
        r"command line \(experiment\.arms\.1\.python=\.\.\.\)",
    ):
        typed("experiment=dflash_verify_probs_speedbench", *SGLANG_PATHS, "experiment.arms.0.python=/envs/a/bin/python")
    cfg = typed(
        "experiment=dflash_verify_probs_speedbench",
        *SGLANG_PATHS,
        "experiment.arms.0.python=/envs/a/bin/python",
        "experiment.arms.1.python=/envs/b/bin/python",
    )
    assert [a.python for a in cfg.experiment.arms] == ["/envs/a/bin/python", "/envs/b/bin/python"]


def test_required_values_are_named_by_the_command_before_anything_runs():
    proc = bench("experiment=dflash_verify_probs_speedbench", "dry_run=true")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "error: experiment.arms.0.python, experiment.arms.1.python, server.draft_model_path, server.model_path "
        "are required"
    ) in flat(proc.stdout)


# ---------------------------------------------------------------------- arms that resolve equal


def test_arms_without_their_difference_are_refused():
    cfg = typed("experiment.arms.1.args=[]")
    with pytest.raises(
        ConfigError,
        match=r"arms token and block resolve to the same launch .*declares a difference "
        r"\('--speculative-use-block-verification'\).*experiment\.aa=true",
    ):
        check_arms_differ(cfg, planned_launches(cfg), {})
    check_arms_differ(typed(), planned_launches(typed()), {})  # the shipped A/B differs


def test_an_aa_is_declared_and_must_launch_alike():
    cfg = typed("experiment=embedded_aa")
    assert cfg.experiment.aa
    check_arms_differ(cfg, planned_launches(cfg), {})  # seed streams differ: still an A/A
    cfg = typed("experiment=embedded_aa", "experiment.arms.1.args=[--draft-mode,greedy]")
    with pytest.raises(
        ConfigError,
        match=r"experiment\.aa=true declares an A/A, but arms a and b would launch "
        r"differently: args \[\] vs \['--draft-mode', 'greedy'\]",
    ):
        check_arms_differ(cfg, planned_launches(cfg), {})
    cfg = typed("experiment=embedded_aa", "experiment.aa=false")
    with pytest.raises(ConfigError, match="arms a and b resolve to the same launch"):
        check_arms_differ(cfg, planned_launches(cfg), {})


def code(packages_sha256: str) -> ServerCode:
    checkout = CheckoutState("git", "/src", "/src", "c" * 40, "main", False, None, [])
    return ServerCode(
        "3.11",
        "/x/python",
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        "harness.engine",
        None,
        "/src/harness",
        None,
        None,
        None,
        checkout,
        {},
        packages_sha256,
    )


def test_two_paths_of_one_interpreter_are_one_interpreter():
    """Interpreters given as different paths count as one when their probes say the same packages and code."""
    cfg = typed(
        "experiment.arms.1.args=[]", "experiment.arms.0.python=/a/bin/python", "experiment.arms.1.python=/a/bin/python3"
    )
    launches = planned_launches(cfg)

    def same(spec: Launch) -> ServerCode:
        return code("f" * 64)

    def other(spec: Launch) -> ServerCode:
        return code(("a" if spec.argv[0].endswith("python") else "b") * 64)

    with pytest.raises(ConfigError, match="arms token and block resolve to the same launch"):
        check_arms_differ(cfg, launches, {}, probe=same)
    check_arms_differ(cfg, launches, {}, probe=other)


@pytest.mark.parametrize(
    "arms",
    [
        # N06: server.args already sets it: the arm's copy changes nothing
        ["server.args=[--max-running-requests,'8']", "experiment.arms.1.args=[--max-running-requests,'8']"],
        # N07: `--flag=v` is `--flag v`
        [
            "experiment.arms.0.args=[--speculative-num-draft-tokens,'8']",
            "experiment.arms.1.args=['--speculative-num-draft-tokens=8']",
        ],
        # the last value of a flag counts
        ["experiment.arms.0.args=[--x,'8']", "experiment.arms.1.args=[--x,'4','--x=8']"],
    ],
)
def test_arms_equal_as_parsed_arguments_are_an_aa_in_disguise(arms):
    cfg = typed(*arms)
    with pytest.raises(ConfigError, match="arms token and block resolve to the same launch"):
        check_arms_differ(cfg, planned_launches(cfg), {})


def test_parsed_options_keep_what_differs():
    assert parsed_options(["--a", "1", "--b", "--c=x", "--a=2", "--n", "-3", "pos"]) == (
        (("--a", "2"), ("--b", None), ("--c", "x"), ("--n", "-3")),
        ("pos",),
    )
    cfg = typed("experiment.arms.0.args=[--x,'8']", "experiment.arms.1.args=['--x=4']")
    check_arms_differ(cfg, planned_launches(cfg), {})  # a real difference


def test_one_interpreter_written_two_ways_is_one_without_asking_it(tmp_path):
    link = tmp_path / "python"
    link.symlink_to(sys.executable)
    cfg = typed(
        "experiment.arms.1.args=[]", f"experiment.arms.0.python={sys.executable}", f"experiment.arms.1.python={link}"
    )

    def unanswered(spec: Launch) -> ServerCode:
        raise ProvenanceError("the provenance probe did not answer")

    with pytest.raises(ConfigError, match="arms token and block resolve to the same launch"):
        check_arms_differ(cfg, planned_launches(cfg), {}, probe=unanswered)
    cfg = typed("experiment.arms.1.args=[]", "experiment.arms.0.python=/a/python", "experiment.arms.1.python=/b/python")
    with pytest.raises(ConfigError, match=r"differ only in their interpreters .* cannot be told"):
        check_arms_differ(cfg, planned_launches(cfg), {}, probe=unanswered)  # said "different" before: an A/B


def test_two_installs_with_the_same_packages_are_one_interpreter():
    cfg = typed(
        "experiment.arms.1.args=[]", "experiment.arms.0.python=/a/bin/python", "experiment.arms.1.python=/b/bin/python"
    )

    def install(spec: Launch) -> ServerCode:  # the same packages and commit, in two places
        where = "/a" if spec.argv[0].startswith("/a") else "/b"
        checkout = CheckoutState("git", f"{where}/src", f"{where}/src", "c" * 40, "main", False, None, [])
        return dataclasses.replace(
            code("f" * 64), executable=f"{where}/bin/python", module_origin=f"{where}/src/harness", checkout=checkout
        )

    with pytest.raises(ConfigError, match="arms token and block resolve to the same launch"):
        check_arms_differ(cfg, planned_launches(cfg), {}, probe=install)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_two_refs_of_one_commit_are_refused(tmp_path):
    """The reproduction: a branch made at main with the change left uncommitted resolves to main's commit."""
    repo = tmp_path / "repo"
    (repo / "harness" / "engine").mkdir(parents=True)
    (repo / "harness" / "engine" / "x.py").write_text("A = 1\n")
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    git(repo, "-c", "user.email=t@e", "-c", "user.name=t", "add", "-A")
    git(repo, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "main")
    git(repo, "branch", "x")
    (repo / "harness" / "engine" / "x.py").write_text("A = 2\n")  # the change, not committed
    refs = [
        f"experiment.arms.0.source.repo={repo}",
        f"experiment.arms.1.source.repo={repo}",
        "experiment.arms.0.source.ref=main",
        f"source_cache={tmp_path / 'cache'}",
    ]
    cfg = typed("experiment=embedded_code_ab", *refs, "experiment.arms.1.source.ref=x")
    sources = resolve_sources(cfg)
    with pytest.raises(
        ConfigError,
        match=r"arms base and change resolve to the same launch .*the same code \(tree "
        r"[0-9a-f]{40} \(\.\): ref 'main' -> [0-9a-f]{12}, ref 'x' -> ",
    ):
        check_arms_differ(cfg, planned_launches(cfg, sources), sources)
    cfg = typed("experiment=embedded_code_ab", *refs, "experiment.arms.1.source.ref=WORKTREE")
    sources = resolve_sources(cfg)
    check_arms_differ(cfg, planned_launches(cfg, sources), sources)  # the uncommitted change is a difference


def test_the_command_refuses_identical_arms_before_the_dry_run(tmp_path):
    proc = bench(f"results_dir={tmp_path}", "experiment.arms.1.args=[]", "dry_run=true")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "arms token and block resolve to the same launch" in flat(proc.stdout)
    assert "nothing was launched" not in proc.stdout and not list(tmp_path.iterdir())


# ---------------------------------------------------------------------- the embedded server's own parser


def test_the_dry_run_checks_embedded_flags_with_the_servers_parser():
    proc = bench("experiment.arms.1.args=[--speculative-use-block-verification,--bogus]", "dry_run=true")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = flat(proc.stdout)
    assert (
        "--bogus (from experiment.arms.1.args): refused by the embedded server's parse check: python -m "
        "harness.engine: error: unrecognized arguments: --bogus"
    ) in text
    assert "argv preflight FAILED" in text
    ok = bench("dry_run=true")
    assert (
        ok.returncode == 0
        and "argv preflight passed: 6 distinct command(s) accepted by the embedded server's parser" in flat(ok.stdout)
    )


def test_a_real_run_with_a_refused_flag_launches_nothing(tmp_path):
    proc = bench(f"results_dir={tmp_path}", "experiment.arms.1.args=[--speculative-use-block-verification,--bogus]")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no server was launched" in proc.stdout and not list(tmp_path.iterdir())


# ---------------------------------------------------------------------- quoting


@pytest.mark.parametrize("ref", ["HEAD~1", "HEAD^", "main@{1}"])
def test_a_ref_that_needs_quoting_says_how(ref):
    wanted = re.escape(f"""write it as 'experiment.arms.1.source.ref="{ref}"'""")
    with pytest.raises(OverrideError, match=wanted):
        check_overrides([f"experiment.arms.1.source.ref={ref}"], BenchConfig, GROUPS)
    check_overrides([f'experiment.arms.1.source.ref="{ref}"'], BenchConfig, GROUPS)


# ---------------------------------------------------------------------------------------------- overrides nothing reads


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            ["workload.path=/tmp/p.jsonl"],
            "workload.path is not read with workload.kind=synthetic (only with "
            "workload.kind=aime25 or speed_bench or jsonl): for a kind that reads it, add "
            "workload=jsonl",
        ),
        (
            ["experiment=dflash_block_vs_token", *SGLANG_PATHS, "workload.n_items=5"],
            "workload.n_items is not read with workload.kind=aime25 (only with workload.kind=synthetic): take a seeded "
            "subset of the fixed set with workload.subsample=N",
        ),
        (["experiment.gpus=[2,3]"], "experiment.gpus is not read with experiment.placement=sequential"),
        (["server.binary=/usr/bin/llama-server"], "server.binary is not read with server.backend=embedded"),
    ],
)
def test_an_override_that_nothing_reads_is_refused(overrides, said):
    cfg = typed(*overrides)
    with pytest.raises(ConfigError, match=re.escape(said)):
        check_unread(cfg, [o.split("=", 1)[0] for o in overrides if not o.startswith("experiment=")])


def test_the_command_names_an_unread_override_before_anything_runs(tmp_path):
    proc = bench(f"results_dir={tmp_path}", "workload.path=/tmp/p.jsonl")
    assert proc.returncode == 2 and "workload.path is not read with workload.kind=synthetic" in flat(proc.stdout)
    assert not list(tmp_path.iterdir())
    ok = bench("workload=jsonl", f"workload.path={tmp_path / 'none.jsonl'}", "dry_run=true")
    assert "is not read" not in flat(ok.stdout)  # (it is read: the file's absence is the next thing said)


# ---------------------------------------------------------------------------------------------- A/A in the analysis


@pytest.fixture(scope="module")
def aa_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("aa")
    proc = bench(
        f"results_dir={tmp}",
        "experiment=embedded_aa",
        "workload.n_items=3",
        "experiment.base_seeds=[1]",
        "sampling.max_new_tokens=16",
        "experiment.warmup.requests=1",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (root,) = (tmp / "embedded_aa").iterdir()
    return root


@pytest.mark.slow
def test_a_declared_aa_is_titled_so_and_an_undeclared_one_fails_the_audit(aa_campaign, tmp_path):
    report = build_report([aa_campaign], n_boot=50)
    assert report.audit.passed and report.markdown.startswith("# A/A report: embedded_aa")
    assert report.pr.startswith("## embedded_aa: A/A of `b` and `a` (the noise floor: ")
    copy = Path(shutil.copytree(aa_campaign, tmp_path / "embedded_aa" / aa_campaign.name))
    doc = json.loads((copy / "campaign.json").read_text())
    doc["config"]["experiment"]["aa"] = False  # as if the A/A had been run as an A/B
    (copy / "campaign.json").write_text(json.dumps(doc))
    report = build_report([copy], n_boot=50)
    check = next(c for c in report.audit.checks if c.name == "Commands and environments differ only as declared")
    assert check.status == "fail" and "b: IDENTICAL to the baseline, though a difference is declared" in check.summary
    assert report.markdown.startswith("# A/B report") and "compares a thing with itself" in " ".join(check.details)
