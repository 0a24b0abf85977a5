"""Check SGLang server argvs with SGLang's own code, INSIDE the interpreter that will run the server.

Self-contained on purpose (standard library + the installed `sglang`, nothing of the harness):
`harness.backends.python_preflight` runs `PYTHON sglang_argv_probe.py` with `{"argvs": [[...], ...]}` on stdin
(each argv is what follows `-m sglang.launch_server`) and reads one line `SPECBENCH_PREFLIGHT {json}`
from stdout. SGLang's plugins are loaded first (stage `plugins`, as the launcher does), then each argv
goes through three stages, each of them SGLang's code:

1. `parse`: `sglang.srt.server_args.prepare_server_args`, the first thing `python -m
   sglang.launch_server` does (argparse: unknown flags, choices, types, `--config`).
2. `model_independent`: `ServerArgs.resolve_once()` with the model path declared "dummy": SGLang's own
   short cut that runs only the validation needing no checkpoint, then returns.
3. `speculative`: `speculative_hook.handle_speculative_decoding`, SGLang's speculative-decoding gate
   (which algorithms --speculative-use-block-verification supports and on which device, the draft
   path, block sizes, ...), with every read of a checkpoint replaced by a stop: the stage then reports
   where it stopped, and what comes after that point is not checked. The draft's architecture is not
   read (SGLang reads it only to turn EAGLE/NEXTN into FROZEN_KV_MTP for Gemma4 assistant drafts).

Where the argv gives no --device, "cuda" is declared: the harness launches SGLang on CUDA hosts, and
SGLang refuses DFLASH, DSPARK and block verification elsewhere. Nothing here touches a GPU.
A stage's status: passed | refused (SGLang raised: the server would not start) | stopped (reached a
checkpoint read) | unavailable (this SGLang lacks what the stage calls) | error (the stage crashed).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# Run as a script, this file's folder (harness/server/) would shadow top-level modules of the same names.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import traceback  # noqa: E402

RESULT_MARK = "SPECBENCH_PREFLIGHT "
SOURCE = "specbench.preflight"
REFUSALS = (ValueError, NotImplementedError, AssertionError)


class CheckpointRead(BaseException):
    """Raised where SGLang would read a checkpoint (BaseException: SGLang's `except Exception`
    fallbacks must not turn it into a default value)."""


def stage(name, status, message="", where=None):
    return {"stage": name, "status": status, "message": message, "where": where}


def parse(argv):
    """(record, stage result): SGLang's own argv parsing; argparse's error names the flag."""
    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return prepare_server_args(list(argv)), stage("parse", "passed")
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        errors = [ln.split("error:", 1)[1].strip() for ln in lines if "error:" in ln]
        return None, stage("parse", "refused", errors[-1] if errors else (lines[-1] if lines else "argparse exited"))
    except Exception as exc:  # e.g. a --config file that cannot be read: the launcher dies the same way
        return None, stage("parse", "refused", f"{type(exc).__name__}: {exc}")


def declare_target(record, **fields):
    """Declare `fields` (and device=cuda when the argv gives none) without touching the raw input."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    if getattr(record, "device", None) is None:
        fields["device"] = "cuda"
    declare_resolution(record, SOURCE, **fields)


def model_independent(argv):
    record, _ = parse(argv)
    try:
        declare_target(record, model_path="dummy")
    except (ImportError, AttributeError) as exc:
        return stage("model_independent", "unavailable", f"{type(exc).__name__}: {exc}")
    return run_stage("model_independent", record.resolve_once)


def run_stage(name, call):
    try:
        call()
    except CheckpointRead as exc:
        return stage(name, "stopped", str(exc), hook_frame(exc))
    except REFUSALS as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{frame.name} ({os.path.basename(frame.filename)}:{frame.lineno})"
        return stage(name, "refused", str(exc) or type(exc).__name__, where)
    except Exception as exc:
        return stage(name, "error", f"{type(exc).__name__}: {exc}")
    return stage(name, "passed")


def hook_frame(exc):
    """Where in SGLang's resolution hooks the checkpoint read happens (the innermost hook frame)."""
    frames = traceback.extract_tb(exc.__traceback__)[:-1]  # the last one is the stop itself
    hooks = [f for f in frames if "arg_groups" in f.filename] or frames
    f = hooks[-1]
    return f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})"


def checkpoint_stops():
    """(object, attribute, replacement) for every way the speculative gate reads a checkpoint."""
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.configs import model_config
    from sglang.srt.utils import hf_transformers_utils

    def read_config(path, *args, **kwargs):
        raise CheckpointRead(f"the config of {path}")

    def read_target(*args, **kwargs):
        raise CheckpointRead("the target checkpoint's config (ModelConfig)")

    def read_subfolder(model_path, *args, **kwargs):
        raise CheckpointRead(f"the target checkpoint {model_path} (looking for a bundled draft)")

    alias = speculative_hook._resolve_speculative_algorithm_alias

    def alias_without_reading_the_draft(algorithm, draft_path, *args, **kwargs):
        return alias(algorithm, None)

    return [
        (hf_transformers_utils, "get_config", read_config),
        (model_config.ModelConfig, "from_server_args", staticmethod(read_target)),
        (speculative_hook, "_target_checkpoint_dspark_subfolder", read_subfolder),
        (speculative_hook, "_resolve_speculative_algorithm_alias", alias_without_reading_the_draft),
    ]


@contextlib.contextmanager
def replaced(targets):
    saved = [(obj, name, obj.__dict__[name]) for obj, name, _ in targets]
    for obj, name, value in targets:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def speculative(argv):
    record, _ = parse(argv)
    try:
        from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding

        stops = checkpoint_stops()
        declare_target(record)
    except (ImportError, AttributeError, KeyError) as exc:
        return stage("speculative", "unavailable", f"{type(exc).__name__}: {exc}")
    with replaced(stops):
        return run_stage("speculative", lambda: handle_speculative_decoding(record))


def load_plugins():
    """What `python -m sglang.launch_server` does before parsing: plugins may add hooks and flags."""
    try:
        from sglang.srt.plugins import load_plugins as load
    except ImportError as exc:
        return stage("plugins", "unavailable", f"{type(exc).__name__}: {exc}")
    return run_stage("plugins", load)


def check(argv, plugins):
    """The stages of one argv, stopping at the first refusal (SGLang would not start past it)."""
    _, parsed = parse(argv)
    results = [plugins, parsed]
    for step in (model_independent, speculative):
        if results[-1]["status"] == "refused":
            break
        results.append(step(argv))
    return {"argv": list(argv), "stages": results}


def main():
    request = json.load(sys.stdin)
    try:
        import sglang
    except Exception as exc:
        answer = {"python": sys.executable, "error": f"no SGLang here: {type(exc).__name__}: {exc}"}
    else:
        plugins = load_plugins()
        answer = {
            "python": sys.executable,
            "sglang_version": getattr(sglang, "__version__", "unknown"),
            "results": [check(argv, plugins) for argv in request["argvs"]],
        }
    sys.stdout.write("\n" + RESULT_MARK + json.dumps(answer) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
