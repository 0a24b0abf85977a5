"""Log checks are not vacuous: every regex of the experiment files matches a line that the installed
SGLang really logs, the checks pass on a sampled run's lines and fail on a greedy one's, and the
embedded server prints the same lines in the same words.

SGLang's lines are rendered from its source: each `logger.<level>(format, *args)` call under
srt/speculative is read with `ast`, and the format is filled with every value its arguments can take
(constants and `a if cond else b` of constants from the code itself; the rest from KNOWN_VALUES, whose
justifying assignment is asserted to be in the same file), as logging would render it (`format % args`).
"""

from __future__ import annotations

import ast
import io
import itertools
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from serverutil import start_engine, stop_engine, wait_ready
from sglang_support import import_sglang

from configs import NEEDS
from harness.engine import server as engine
from harness.engine.args import parse_args
from harness.engine.logs import DATEFMT, FORMAT
from harness.hydra_setup import CONFIG_DIR
from harness.models.real import is_real
from harness.runner.command import to_typed
from harness.runner.config import BenchConfig, register_configs
from harness.runner.overrides import group_options
from harness.runner.plan import planned_launches
from harness.server.config import LogChecks
from harness.server.launch import merge_log_checks
from harness.server.logs import check_log

pytestmark = pytest.mark.sglang

LOGGER_METHODS = {"debug", "info", "warning", "error", "critical", "exception"}
PLACEHOLDERS = [
    "server.model_path=/models/target",
    "server.draft_model_path=/models/draft",
    "experiment.arms.0.python=/envs/a/bin/python",
    "experiment.arms.1.python=/envs/b/bin/python",
]
# (file, argument expression) -> (its values, the assignment in that file that says so)
KNOWN_VALUES = {
    ("dflash_worker_v2.py", "self._selector_sampling_enabled"): (
        (True, False),
        "self._selector_sampling_enabled = not _is_npu",
    ),
}
LOG_PREFIX = "[2026-11-30 12:00:00 TP0] "  # what SGLang's handler puts before each message
EMBEDDED_MODEL = "embedded:mini"  # the log lines do not depend on the preset; mini starts fastest


@dataclass(frozen=True)
class LogFormat:
    path: Path
    lineno: int
    fmt: str
    values: tuple[tuple, ...] | None  # the possible values of each argument; None when one is unknown

    def rendered(self) -> list[str]:
        return [self.fmt % combo for combo in itertools.product(*self.values)] if self.values is not None else []

    def render(self, *args) -> str:
        assert all(a in vs for a, vs in zip(args, self.values, strict=True)), (args, self.values)
        return self.fmt % args

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.lineno}"


def arg_values(path: Path, node: ast.expr) -> tuple | None:
    if isinstance(node, ast.Constant):
        return (node.value,)
    if isinstance(node, ast.IfExp) and isinstance(node.body, ast.Constant) and isinstance(node.orelse, ast.Constant):
        return (node.body.value, node.orelse.value)
    known = KNOWN_VALUES.get((path.name, ast.unparse(node)))
    if known is None:
        return None
    values, assignment = known
    assert assignment in path.read_text(), f"{path.name} no longer has {assignment!r}: re-read what it logs"
    return values


def log_formats(root: Path) -> list[LogFormat]:
    """Every logger call with a constant format under `root` (rendered only when all its values are known)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LOGGER_METHODS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                continue
            values = [arg_values(path, a) for a in node.args[1:]]
            known = tuple(values) if all(v is not None for v in values) else None
            found.append(LogFormat(path, node.lineno, node.args[0].value, known))
    return found


@pytest.fixture(scope="module")
def formats() -> list[LogFormat]:
    return log_formats(Path(import_sglang().__file__).parent / "srt" / "speculative")


def the_format(formats: list[LogFormat], file: str, prefix: str) -> LogFormat:
    matches = [f for f in formats if f.path.name == file and f.fmt.startswith(prefix)]
    assert len(matches) == 1, f"{file}: {len(matches)} log calls start with {prefix!r}"
    return matches[0]


def matching(regex: str, formats: list[LogFormat]) -> list[str]:
    """Where a rendered SGLang line matches `regex` (file:line), as check_log searches a log."""
    return [f.where for f in formats for line in f.rendered() if re.search(regex, LOG_PREFIX + line)]


def composed(name: str) -> BenchConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        backend = compose(config_name="bench", overrides=[f"experiment={name}"]).server.backend
        extra = PLACEHOLDERS if backend == "sglang" else NEEDS.get(name, [])  # (openai_two_servers: a model name)
        return to_typed(compose(config_name="bench", overrides=[f"experiment={name}", *extra]))


def checks_of(cfg: BenchConfig, arm: str) -> LogChecks:
    return merge_log_checks(cfg.server.log_checks, cfg.experiment.arm(arm).log_checks)


def regexes(cfg: BenchConfig) -> list[str]:
    every = [cfg.server.log_checks, *(a.log_checks for a in cfg.experiment.arms)]
    return [r for c in every for r in (*c.must, *c.must_not)]


@pytest.fixture(scope="module")
def experiments() -> dict[str, BenchConfig]:
    return {name: composed(name) for name in group_options("experiment")}


def sglang_ones(experiments: dict[str, BenchConfig]) -> dict[str, BenchConfig]:
    return {n: c for n, c in experiments.items() if c.server.backend == "sglang"}


# ---------------------------------------------------------------------- against SGLang's source


def algorithm_files(cfg: BenchConfig, formats: list[LogFormat]) -> list[LogFormat]:
    """The log calls of the experiment's speculative algorithm (files named after it: dflash_*, dspark_*)."""
    args = [str(a) for a in cfg.server.args]
    algorithm = args[args.index("--speculative-algorithm") + 1].lower()
    return [f for f in formats if algorithm in f.path.relative_to(f.path.parents[1]).as_posix().lower()]


def test_every_regex_of_the_sglang_experiments_matches_a_line_its_algorithm_logs(experiments, formats):
    checked = {
        (name, rx): matching(rx, algorithm_files(cfg, formats))
        for name, cfg in sglang_ones(experiments).items()
        for rx in regexes(cfg)
    }
    assert len(checked) >= 4  # dflash and dspark block-vs-token: a must and a must_not each
    assert [key for key, where in checked.items() if not where] == []


def test_a_regex_that_no_sglang_line_prints_is_caught(formats):
    dspark = [f for f in formats if "dspark" in f.path.name]
    assert dspark and matching("sampling_enabled=True", dspark) == []  # the old DSPARK check: vacuous
    assert matching("DSpark draft proposal \\(greedy \\+ sampling\\)", formats) == []  # an older SGLang's words
    assert matching("sampling_enabled=True", formats) != []  # but DFLASH prints it


def log_file(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "server.log"
    path.write_text("".join(LOG_PREFIX + line + "\n" for line in lines))
    return path


def sglang_cases(formats: list[LogFormat]) -> list[tuple[str, str, list[str], bool]]:
    """(experiment, arm, the lines SGLang would log, whether the log checks must pass)."""
    selector = the_format(formats, "dflash_worker_v2.py", "DFLASH selector decode folded")
    no_effect = the_format(formats, "dflash_worker_v2.py", "--speculative-use-block-verification has no effect")
    proposal = the_format(formats, "dspark_draft_sampler.py", "DSpark draft proposal (")
    megakernel = next(v for v in proposal.values[1] if v)
    return [
        ("dflash_block_vs_token", "block", [selector.render(True)], True),
        ("dflash_block_vs_token", "token", [selector.render(True)], True),
        ("dflash_block_vs_token", "block", [selector.render(False)], False),  # selector without sampling
        ("dflash_block_vs_token", "block", [selector.render(True), no_effect.render()], False),
        ("dflash_block_vs_token", "block", [], False),
        ("dspark_block_vs_token", "block", [proposal.render("sampling", "")], True),
        ("dspark_block_vs_token", "token", [proposal.render("sampling", megakernel)], True),
        ("dspark_block_vs_token", "block", [proposal.render("greedy draft", "")], False),
        ("dspark_block_vs_token", "block", [], False),
    ]


def test_checks_pass_on_sglangs_sampled_lines_and_fail_on_greedy_ones(experiments, formats, tmp_path):
    results = [
        (exp, arm, lines, check_log(log_file(tmp_path, lines), checks_of(experiments[exp], arm)).passed)
        for exp, arm, lines, _ in sglang_cases(formats)
    ]
    expected = [(exp, arm, lines, ok) for exp, arm, lines, ok in sglang_cases(formats)]
    assert results == expected


def test_the_embedded_server_uses_sglangs_format_strings(formats):
    sglang = {f.fmt for f in formats}
    for line in (
        engine.DFLASH_SELECTOR_LINE,
        engine.DFLASH_GREEDY_LINE,
        engine.DSPARK_PROPOSAL_LINE,
        engine.DFLASH_NO_EFFECT_LINE,
    ):
        assert line in sglang, line
    assert engine.DSPARK_NO_EFFECT_LINE not in sglang  # the embedded server's own (SGLang has none for DSPARK)


# ---------------------------------------------------------------------- against the embedded server's log

BLOCK = ["--model-path", EMBEDDED_MODEL, "--speculative-use-block-verification", "--speculative-algorithm"]
GREEDY_OR_SAMPLED = {  # name -> embedded server flags, beside the embedded experiments' own arms
    "dflash_sampled_block": [*BLOCK, "DFLASH", "--draft-mode", "sampled"],
    "dflash_greedy_block": [*BLOCK, "DFLASH"],
    "dspark_sampled_block": [*BLOCK, "DSPARK", "--draft-mode", "sampled"],
    "dspark_greedy_block": [*BLOCK, "DSPARK"],
}


def startup_log(argv: list[str]) -> str:
    """What `python -m harness.engine ARGV` logs at start-up (its log_start, with its log format)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(FORMAT, DATEFMT))
    logger = logging.getLogger("harness.engine")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        engine.log_start(parse_args(argv))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return stream.getvalue()


def embedded_arm_flags(cfg: BenchConfig, arm: str) -> list[str]:
    launch = next(launch for launch in planned_launches(cfg) if launch.run.arm == arm)
    return launch.launch.argv[3:] + ["--model-path", EMBEDDED_MODEL]


def passes(checks: LogChecks, text: str, tmp_path: Path) -> bool:
    path = tmp_path / "server.log"
    path.write_text(text)
    return check_log(path, checks).passed


def test_embedded_experiments_check_lines_the_embedded_server_prints(experiments, tmp_path):
    # a real model's experiments check lines of its loading too: tests/engine/test_real_model.py reads them off its server
    arms = [
        (name, arm.name)
        for name, cfg in experiments.items()
        if cfg.server.backend == "embedded" and not is_real(cfg.server.model_path) and regexes(cfg)
        for arm in cfg.experiment.arms
    ]
    assert {name for name, _ in arms} == {
        "embedded_block_vs_token",
        "embedded_verify_probs",
        "embedded_verify_probs_fused",
        "embedded_perf",
        "embedded_verify_sparse",
    }
    for name, arm in arms:
        log = startup_log(embedded_arm_flags(experiments[name], arm))
        assert passes(checks_of(experiments[name], arm), log, tmp_path), (name, arm, log)
    greedy = startup_log(GREEDY_OR_SAMPLED["dflash_greedy_block"])  # and the same checks fail on greedy drafts
    assert not passes(checks_of(experiments["embedded_block_vs_token"], "block"), greedy, tmp_path)


@pytest.mark.parametrize(
    "experiment, sampled, greedy",
    [
        ("dflash_block_vs_token", "dflash_sampled_block", "dflash_greedy_block"),
        ("dspark_block_vs_token", "dspark_sampled_block", "dspark_greedy_block"),
    ],
)
def test_sglang_experiments_checks_read_the_embedded_servers_log_alike(
    experiments, tmp_path, experiment, sampled, greedy
):
    checks = checks_of(experiments[experiment], "block")
    sampled_log, greedy_log = startup_log(GREEDY_OR_SAMPLED[sampled]), startup_log(GREEDY_OR_SAMPLED[greedy])
    assert passes(checks, sampled_log, tmp_path), sampled_log
    assert not passes(checks, greedy_log, tmp_path), greedy_log
    assert not any(re.search(rx, greedy_log) for rx in checks.must)  # the greedy run lacks the sampled line itself


def test_the_running_embedded_server_logs_those_lines(tmp_path):
    """Started for real (tests/support/serverutil.py), the server writes the same start-up lines to its log."""
    cases = {name: GREEDY_OR_SAMPLED[name] for name in ("dflash_sampled_block", "dspark_greedy_block")}
    servers = {name: start_engine(args, tmp_path / f"{name}.log") for name, args in cases.items()}
    try:
        for server in servers.values():
            wait_ready(server)
    finally:
        for server in servers.values():
            stop_engine(server)
    for name, server in servers.items():
        expected = [msg for _, msg in engine.draft_lines(parse_args(cases[name]))]
        assert len(expected) == (1 if "sampled" in name else 2)
        assert all(msg in server.log_text() for msg in expected), server.log_text()
