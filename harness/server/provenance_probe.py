"""Says what code a server will run: executed by the server's own interpreter, with the server's environment
and working directory, just before the server starts (harness.server.provenance runs it).

Standard library only, and nothing of the served module or its packages is executed (the `__init__` of a
package only where its `__path__` is not where the files are): the interpreter may be another install than
the harness's. Reads the
served module's name from argv[1] and prints one JSON line after RESULT_MARK: the Python, the versions of the
packages that decide what a speculative-decoding server computes, where the module is imported from (as
`python -m MODULE` would import it: the working directory first), the git state of the checkout or the
harness snapshot that holds it, the owning distribution's direct_url.json, and every installed distribution.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

RESULT_MARK = "SPECBENCH-PROVENANCE "
SNAPSHOT_MARK = ".specbench-source.json"  # written by harness.runner.sources into every snapshot it makes
PYCACHE = "__pycache__"  # what Python writes beside the sources it imports: left out of a snapshot's content
MAX_UNTRACKED = 50
SUFFIXES = sorted(
    importlib.machinery.all_suffixes(), key=len, reverse=True
)  # longest first: .cpython-311-x86_64-linux-gnu.so before .so
# name in the manifest -> distributions that provide it, first found wins
TRACKED = {
    "torch": ("torch",),
    "sglang": ("sglang",),
    "sgl_kernel": ("sgl-kernel", "sglang-kernel"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "triton": ("triton", "pytorch-triton"),
    "transformers": ("transformers",),
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# an installed distribution: (normalised name, version, the distribution)
Installed = tuple[str, str, importlib.metadata.Distribution]


def header(dist: importlib.metadata.Distribution) -> tuple[str | None, str | None]:
    """(Name, Version) from the distribution's METADATA headers. The headers end at the first blank line;
    reading only them skips the email parser's pass over every long description (most of the probe's time)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version"):
            fields.setdefault(key, value.strip())
    return fields.get("Name"), fields.get("Version")


def installed() -> list[Installed]:
    """Every distribution this interpreter sees (site-packages and PYTHONPATH) as (normalised name, version,
    distribution), in sys.path order."""
    found = []
    for dist in importlib.metadata.distributions():
        name, version = header(dist)
        if name:
            found.append((norm(name), version or "", dist))
    return found


def packages(dists: list[Installed]) -> dict[str, str]:
    """name -> version; where two hold one name the first on sys.path wins, as it does for imports."""
    out: dict[str, str] = {}
    for name, version, _ in dists:
        out.setdefault(name, version)
    return dict(sorted(out.items()))


def torch_cuda(pkgs: dict[str, str]) -> str | None:
    """torch.version.cuda, read from torch's version file (importing torch costs seconds)."""
    if "torch" not in pkgs:
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    found = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return found.group(1) if found else None


def git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def snapshot_files(root: Path) -> dict[str, str]:
    """Every file and symbolic link under a snapshot folder: relative path -> "f SHA" (a file), "x SHA" (an
    executable file), "l SHA" (a link: the SHA-256 of its target's path) or "? KIND" (anything else), without
    the folders Python writes its bytecode into and without the snapshot's mark. harness.runner.sources
    computes the same from `git archive` of the commit: equal maps, equal code."""
    out: dict[str, str] = {}
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                rel = os.path.relpath(entry.path, root).replace(os.sep, "/")
                if entry.is_symlink():
                    out[rel] = "l " + hashlib.sha256(os.readlink(entry.path).encode()).hexdigest()
                elif entry.is_dir():
                    if entry.name != PYCACHE:
                        stack.append(entry.path)
                elif entry.is_file():
                    if rel != SNAPSHOT_MARK:
                        executable = entry.stat().st_mode & 0o100
                        out[rel] = ("x " if executable else "f ") + file_sha256(entry.path)
                else:
                    out[rel] = "? not a file, folder or link"
    return out


def content_sha256(files: dict[str, str]) -> str:
    """One SHA-256 over a snapshot_files() map (sorted by path)."""
    return hashlib.sha256("".join(f"{v} {k}\n" for k, v in sorted(files.items())).encode()).hexdigest()


def checkout(origin: Path) -> dict | None:
    """The git checkout or harness snapshot holding `origin`, or None. A snapshot's content is hashed as it
    is now (the campaign compares it with its commit's)."""
    for folder in (origin, *origin.parents):
        mark = folder / SNAPSHOT_MARK
        if mark.is_file():
            made = json.loads(mark.read_text())
            return {
                "kind": "snapshot",
                "root": str(folder),
                "repo": made.get("repo"),
                "commit": made.get("commit"),
                "branch": None,
                "dirty": False,
                "diff_sha256": None,
                "untracked": [],
                "content_sha256": content_sha256(snapshot_files(folder)),
            }
        if (folder / ".git").exists():
            # a venv inside a checkout is not that checkout's code: git ignores it
            ignored = git(folder, "check-ignore", "-q", str(origin)) is not None
            return None if ignored else git_checkout(folder)
    return None


def git_checkout(root: Path) -> dict:
    head = (git(root, "rev-parse", "HEAD") or "").strip() or None
    branch = (git(root, "rev-parse", "--abbrev-ref", "HEAD") or "").strip() or None
    diff = git(root, "diff", "HEAD", "--binary")
    untracked = (git(root, "ls-files", "--others", "--exclude-standard") or "").splitlines()
    dirty = None if diff is None else bool(diff or untracked)
    return {
        "kind": "git",
        "root": str(root),
        "repo": str(root),
        "commit": head,
        "branch": None if branch == "HEAD" else branch,
        "dirty": dirty,
        "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
        "untracked": untracked[:MAX_UNTRACKED],
    }


def within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def provides(dist: importlib.metadata.Distribution, origin: Path) -> bool:
    """Whether the files at `origin` are the distribution's own: under its install folder, or under the
    folder of its editable install (a package of that name imported from elsewhere is not)."""
    if within(origin, Path(str(dist.locate_file(""))).resolve()):
        return True
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    url = str(direct.get("url") or "")
    editable = bool((direct.get("dir_info") or {}).get("editable"))
    return editable and url.startswith("file://") and within(origin, Path(url.removeprefix("file://")).resolve())


def tops(dist: importlib.metadata.Distribution) -> set[str]:
    """The top-level names a distribution installs: its top_level.txt, else the first part of each path in its
    RECORD (as importlib.metadata.packages_distributions infers them, without building a path object per file)."""
    listed = (dist.read_text("top_level.txt") or "").split()
    if listed:
        return set(listed)
    names = set()
    for line in (dist.read_text("RECORD") or "").splitlines():
        path = line.split(",", 1)[0]
        if "/" in path:
            names.add(path.split("/", 1)[0])
        else:  # a module file at the top (.py, or an extension module's .so / .pyd)
            names.add(next((path[: -len(s)] for s in SUFFIXES if path.endswith(s)), path))
    return names


def owner(top: str, origin: Path, dists: list[Installed]) -> Installed | None:
    """The installed distribution that provides the top-level package `top` as imported from `origin`."""
    for found in dists:
        if top in tops(found[2]) and provides(found[2], origin):
            return found
    return None


def find_spec(module: str) -> importlib.machinery.ModuleSpec | None:
    """The spec `python -m module` would import, found without executing the parent packages' `__init__`
    (SGLang's takes 11 s of CPU: it imports torch and transformers): each submodule is looked up on its
    parent's search path, as the import system does. Only where that finds nothing (a package whose
    `__init__` extends its own `__path__`, a namespace package on the way) are the parents imported."""
    parts = module.split(".")
    spec = importlib.util.find_spec(parts[0])
    try:
        for depth in range(2, len(parts) + 1):
            if spec is None or not spec.submodule_search_locations:
                break
            where = list(spec.submodule_search_locations)
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth]), where)
        else:
            if spec is not None:
                return spec
    except (ImportError, KeyError):  # a namespace package on the way wants its parent imported
        pass
    return importlib.util.find_spec(module)


def module_facts(module: str, dists: list[Installed]) -> dict:
    """Where `python -m module` imports the module from, and what holds it."""
    spec = find_spec(module)
    if spec is None:
        raise ModuleNotFoundError(f"no module named {module!r} in {sys.executable}")
    top = module.split(".")[0]
    top_spec = importlib.util.find_spec(top)
    locations = list(top_spec.submodule_search_locations or []) if top_spec else []
    where = locations[0] if locations else (top_spec.origin if top_spec else None) or spec.origin or "."
    origin = Path(where).resolve()
    found = owner(top, origin, dists)
    direct = found[2].read_text("direct_url.json") if found is not None else None
    return {
        "module": module,
        "module_file": spec.origin,
        "module_origin": str(origin),
        "distribution": found[0] if found is not None else None,
        "distribution_version": found[1] if found is not None else None,
        "direct_url": json.loads(direct) if direct else None,
        "checkout": checkout(origin),
    }


def main() -> None:
    module = sys.argv[1]
    sys.path[0] = os.getcwd()  # as `python -m MODULE` starts: the working directory, not this script's folder
    try:
        dists = installed()
        pkgs = packages(dists)
        answer = {
            "python": platform.python_version(),
            "executable": sys.executable,
            **{key: next((pkgs[norm(d)] for d in names if norm(d) in pkgs), None) for key, names in TRACKED.items()},
            "torch_cuda": torch_cuda(pkgs),
            **module_facts(module, dists),
            "packages": pkgs,
            "packages_sha256": hashlib.sha256("\n".join(f"{k}=={v}" for k, v in pkgs.items()).encode()).hexdigest(),
        }
    except Exception as exc:  # noqa: BLE001  (any failure is the answer, named)
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    print(RESULT_MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
