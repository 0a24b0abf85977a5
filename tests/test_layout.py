"""The layout keeps its promises (README "Layout"): no import loop anywhere in harness/ or analysis/ (imports
inside functions included; between the parts only the loop the design card forces), the three programs (runner,
embedded server, microbenchmark) never import each other, analysis/ reads nothing of harness but its contract
(harness.contract), only the runner's report step imports the analysis, the metrics stand on the selection and not
on the audit, and the embedded server and the microbenchmark load no library they do not use."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "analysis", "workloads")


def module_files() -> dict[str, Path]:
    """Every module of the project: dotted name -> file (a package is its __init__.py)."""
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that `path` imports anywhere in it (module level, functions, TYPE_CHECKING blocks):
    `from a.b import c` is a.b.c when that is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_loop_finder_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_loop_in_the_project():
    assert cycles(import_graph()) == []


def test_analysis_reads_only_the_contract_of_harness():
    graph = import_graph()
    reached = {
        (name, target)
        for name, targets in graph.items()
        if name.startswith("analysis")
        for target in targets
        if target.split(".")[0] == "harness"
    }
    assert {target for _, target in reached} == {"harness.contract"}, sorted(reached)


def test_the_contract_imports_nothing_of_the_project():
    assert import_graph()["harness.contract"] == set()


def test_only_the_runners_report_step_imports_the_analysis():
    """The runner calls the analysis through its API in one place (build_report, write_report, the sweep table)."""
    graph = import_graph()
    importers = {
        name
        for name, targets in graph.items()
        if name.startswith("harness") and any(t.split(".")[0] == "analysis" for t in targets)
    }
    assert importers == {"harness.runner.report_step"}


UNITS = (
    "harness.runner",
    "harness.backends",
    "harness.server",
    "harness.client",
    "harness.engine",
    "harness.micro",
    "harness.verify",
    "harness.host",
    "harness.models",
)

# the three programs (README "Layout"): the runner is harness/bench.py with harness/runner/ and the parts only it
# uses (the backends, launching servers, sending requests)
PROGRAMS = {
    "the runner": ("harness.bench", "harness.runner", "harness.backends", "harness.server", "harness.client"),
    "the embedded server": ("harness.engine",),
    "the microbenchmark": ("harness.micro",),
}


def program(module: str) -> str | None:
    """Which of the three programs a module belongs to, or None (what they share: models, verify, host, ...)."""
    for name, roots in PROGRAMS.items():
        if any(module == r or module.startswith(r + ".") for r in roots):
            return name
    return None


def cross_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import, anywhere in a module, from one program into another."""
    return sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if program(name) and program(target) and program(name) != program(target)
    )


def test_the_cross_import_finder_finds_one():
    graph = {"harness.runner.command": {"harness.models.check", "harness.engine.args"}, "harness.micro.bank": set()}
    assert cross_imports(graph) == [("harness.runner.command", "harness.engine.args")]
    assert cross_imports({"harness.bench": {"harness.micro"}}) == [("harness.bench", "harness.micro")]
    assert cross_imports({"harness.engine.service": {"harness.models.real", "harness.verify"}}) == []


def test_the_three_programs_never_import_each_other():
    """The runner, the embedded server and the microbenchmark share harness.models (what --model-path names),
    harness.verify, harness.host and the top-level helpers; none imports another, not even inside a function.
    The runner starts the embedded server as a process and runs its argv check (harness/engine/argv_probe.py)
    by path, in the server's own interpreter."""
    assert cross_imports(import_graph()) == []


def unit(module: str) -> str:
    """The part of the project a module belongs to: one of UNITS, a top-level module of harness on its own
    (harness.contract, harness.bench, ...), or its top-level package (analysis, workloads)."""
    for u in UNITS:
        if module == u or module.startswith(u + "."):
            return u
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "harness" else parts[0]


def test_the_parts_import_each_other_without_a_loop():
    """Between the parts (the runner, the embedded server, the microbenchmark, the verification core, the host, each
    top-level module of harness, analysis, workloads) the imports run one way. At the level of the top packages the
    design card forces one loop, harness <-> analysis: the contract lives in harness/ and the analysis reads it,
    while the runner's report step calls the analysis; that loop is the only one."""
    graph = import_graph()
    parts: dict[str, set[str]] = {}
    for name, targets in graph.items():
        parts.setdefault(unit(name), set()).update(unit(t) for t in targets if unit(t) != unit(name))
    assert cycles(parts) == []
    packages: dict[str, set[str]] = {}
    for name, targets in graph.items():
        top = name.split(".")[0]
        packages.setdefault(top, set()).update(t.split(".")[0] for t in targets if t.split(".")[0] != top)
    assert cycles(packages) == [["analysis", "harness"]]


# a comparison against an engine's name (the team's pre-stop hook greps the same)
BACKEND_BRANCH = re.compile(r"(==|!=) *[\"'](llamacpp|sglang|embedded|openai)[\"']")


def test_no_code_asks_which_engine_it_is_outside_the_backends():
    """Every fact about an engine lives in its module of harness/backends/ (harness.backends.get(name)); elsewhere no
    code compares a name against an engine's."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for package in ("harness", "analysis")
        for path in sorted((ROOT / package).rglob("*.py"))
        if "backends" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if BACKEND_BRANCH.search(line)
    ]
    assert found == []
    assert BACKEND_BRANCH.search('if server.backend == "llamacpp":')  # (the pattern finds what it is for)


def test_the_backends_import_no_runner_and_the_shared_parts_no_backend():
    """The backends stand on the shared parts (server, client, contract, validation, host); the runner calls them;
    the server and client packages know no engine; analysis reads the manifests they fill, not their code."""
    graph = import_graph()

    def reached(prefix: str) -> set[str]:
        return {unit(t) for name, targets in graph.items() if unit(name) == prefix for t in targets} - {prefix}

    assert "harness.runner" not in reached("harness.backends")
    assert "harness.backends" not in reached("harness.server") | reached("harness.client")
    assert "harness.runner" not in reached("harness.server") | reached("harness.client")


def test_the_layout_answers_where_things_are():
    """The four questions, answered by names (README "Where things are")."""
    assert (ROOT / "harness" / "server" / "process.py").is_file()  # where the server is launched
    assert (ROOT / "harness" / "client" / "drive.py").is_file()  # where requests are sent
    assert "acceptance length" in (ROOT / "analysis" / "metrics.py").read_text()  # where it is computed
    assert "def write_report" in (ROOT / "analysis" / "report.py").read_text()  # where the report is written


def loaded_after(statement: str) -> set[str]:
    """The heavy libraries of interest that a fresh interpreter has imported after `statement`."""
    probe = (
        "import sys; " + statement + "; print(' '.join(sorted(m for m in ('hydra', 'omegaconf', 'aiohttp', "
        "'math_verify', 'sympy', 'matplotlib', 'pandas', 'torch') if m in sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


@pytest.mark.parametrize(
    ("statement", "uses"),
    [
        ("import harness.engine.server", {"aiohttp", "torch"}),  # the embedded server serves HTTP with aiohttp
        ("import harness.micro.app, harness.micro.writeup", {"torch"}),  # the microbenchmark proper
        ("import harness.micro.__main__", {"hydra", "omegaconf", "torch"}),  # its command line composes with Hydra
        ("import harness.contract", set()),
        # the runner, its manifests' versions read too: torch's CUDA build comes from torch's version file
        (
            "import harness.runner.command; from harness.host import envinfo; envinfo.versions()",
            {"hydra", "omegaconf", "aiohttp"},
        ),
    ],
)
def test_entry_points_load_only_what_they_use(statement, uses):
    assert loaded_after(statement) == uses


def test_the_cuda_build_of_torch_is_read_without_importing_it():
    import torch  # noqa: PLC0415

    from harness.host import envinfo  # noqa: PLC0415

    probe = "from harness.host import envinfo; import sys; print(envinfo._torch_cuda(), 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.split() == [str(torch.version.cuda), "False"], proc.stderr
    assert envinfo._torch_cuda() == torch.version.cuda  # torch imported: read from it


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_metrics_stand_on_the_selection_not_on_the_audit():
    """The figures and the checks read the same selection (analysis.selection) side by side: the metrics never
    reach the audit, not even through another module, and the audit's checks can change without them."""
    graph = import_graph()
    assert "analysis.selection" in graph["analysis.metrics"]
    assert "analysis.audit" not in reached(graph, "analysis.metrics"), sorted(reached(graph, "analysis.metrics"))
    assert reached({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == {"a", "b", "c"}
