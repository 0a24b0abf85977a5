"""Facts about the code and the machine, for manifests: git state, package versions, GPUs, host.

Plain functions, each tolerant of a missing tool (no git, no nvidia-smi, no psutil, a package that is
not installed): what cannot be found is reported as None, never raised. Shared by the microbenchmark
and the runner's run manifests.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from harness.contract import GpuInfo, HarnessVersion, HostInfo, Versions

REPO_ROOT = Path(__file__).resolve().parents[2]
DIST_NAME = "specbench"
_NVIDIA_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm")
_NVIDIA_SMI_KEYS = ("name", "driver_version", "clocks_sm_mhz", "clocks_mem_mhz", "clocks_max_sm_mhz")


def run_tool(cmd: list[str], cwd: Path | None = None, timeout: float = 10.0) -> str | None:
    """stdout of `cmd` stripped, or None when the tool is missing, fails or times out."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def dist_version(*names: str) -> str | None:
    """Installed version of the first distribution in `names` that is found, else None.

    A module importable without distribution metadata reports 'unknown' (found, version unknown).
    """
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    for name in names:
        try:
            if importlib.util.find_spec(name.replace("-python", "").replace("-", "_")) is not None:
                return "unknown"
        except (ImportError, ValueError):
            continue
    return None


def git_info(repo: Path = REPO_ROOT) -> HarnessVersion:
    """The harness's version and checkout state.

    version: the installed specbench distribution's version; git_sha: HEAD of the checkout the code runs
    from (None for an installed wheel); dirty: whether anything is
    uncommitted (tracked changes or untracked files that git does not ignore). None where unknown.
    """
    # an installed wheel has no checkout: never report the git state of whatever repository holds the venv
    sha = run_tool(["git", "rev-parse", "HEAD"], cwd=repo) if (repo / ".git").exists() else None
    status = run_tool(["git", "status", "--porcelain"], cwd=repo) if sha else None
    return HarnessVersion(version=dist_version(DIST_NAME), git_sha=sha, dirty=None if status is None else bool(status))


def _torch_cuda() -> str | None:
    """The CUDA version torch was built with (None for a CPU build, or without torch). Read from torch's own
    version file when torch is not imported yet: the runner never imports torch (2 s of CPU) for one string."""
    if (torch := sys.modules.get("torch")) is not None:
        return torch.version.cuda
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text())
    except (OSError, SyntaxError, StopIteration):
        return None
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target: ast.expr = node.target
            value = node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "cuda":
            found = ast.literal_eval(value)
            return found if isinstance(found, str) else None
    return None


def versions() -> Versions:
    """The harness's git state and the versions of Python, torch, sglang, flashinfer, triton and torch's CUDA
    in this interpreter: None for what is not installed (cuda: None for a CPU build of torch)."""
    return Versions(
        harness=git_info(),
        python=platform.python_version(),
        torch=dist_version("torch"),
        sglang=dist_version("sglang"),
        flashinfer=dist_version("flashinfer-python", "flashinfer"),
        triton=dist_version("triton", "pytorch-triton"),
        cuda=_torch_cuda(),
    )


def _mhz(value: str) -> int | str | None:
    """'1980 MHz' -> 1980; '[N/A]' -> None; anything else is kept as text."""
    text = value.strip()
    if not text or text.startswith("[") or text.upper() == "N/A":
        return None
    number = text.removesuffix("MHz").strip()
    return int(number) if number.isdigit() else text


def parse_nvidia_smi(csv_text: str) -> list[dict]:
    """Rows of `nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm
    --format=csv,noheader` -> one dict per GPU (clocks in MHz as ints)."""
    gpus = []
    for index, line in enumerate(x for x in csv_text.splitlines() if x.strip()):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(_NVIDIA_SMI_KEYS):
            continue
        gpu = {"index": index, "name": cells[0], "driver_version": cells[1]}
        gpu.update({key: _mhz(cell) for key, cell in zip(_NVIDIA_SMI_KEYS[2:], cells[2:], strict=True)})
        gpus.append(gpu)
    return gpus


def gpu_info() -> GpuInfo | None:
    """The machine's GPUs as nvidia-smi sees them, or None.

    None when nvidia-smi is missing or fails. name / driver_version are the first GPU's; `gpus` lists
    every GPU nvidia-smi sees (its numbering, which CUDA_VISIBLE_DEVICES may remap).
    """
    query = "--query-gpu=" + ",".join(_NVIDIA_SMI_FIELDS)
    out = run_tool(["nvidia-smi", query, "--format=csv,noheader"])
    gpus = parse_nvidia_smi(out) if out else []
    if not gpus:
        return None
    return GpuInfo(
        name=gpus[0]["name"],
        driver_version=gpus[0]["driver_version"],
        count=len(gpus),
        gpus=gpus,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        import psutil  # noqa: PLC0415  (optional)

        return round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def host_info() -> HostInfo:
    """The machine: cores = logical CPUs this process may use."""
    cores: int | None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return HostInfo(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        cpu=_cpu_model(),
        cores=cores,
        memory_gib=_memory_gib(),
    )
