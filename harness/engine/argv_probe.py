"""Check embedded-server argvs with the embedded server's own parser, INSIDE the interpreter, environment and
working directory that will run it (a source arm's snapshot puts its own `harness.engine` first).

`harness.backends.python_preflight` runs `PYTHON argv_probe.py` (this file, by its path: the runner
never imports the engine) with `{"argvs": [[...], ...]}` on stdin (each
argv is what follows `-m harness.engine`) and reads one line `SPECBENCH_PREFLIGHT {json}` from stdout. One stage
per argv, `parse`: `harness.engine.args.parse_args`, the first thing `python -m harness.engine` does (argparse:
unknown flags, choices, types; then the checks that need no model loaded: algorithms, windows, ranges, the
device). Its status: passed | refused (the server would exit 2 at start) | error (the parser crashed).
Standard library plus the harness the interpreter imports from its working directory first (as `-m` does);
nothing is loaded, nothing listens.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# Run as a script, this file's folder (harness/engine/) would shadow top-level modules of the same names; the
# server, `python -m harness.engine`, starts with its working directory first instead: so does this probe, which then
# imports the harness that server would (a checkout that is not installed too), as provenance_probe.py does.
sys.path[:] = [os.getcwd(), *(p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE)]

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import traceback  # noqa: E402

RESULT_MARK = "SPECBENCH_PREFLIGHT "


def stage(status, message=""):
    return {"stage": "parse", "status": status, "message": message, "where": None}


def check(parse_args, argv):
    """The parse stage of one argv: argparse's and the resolver's own message when refused."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse_args(list(argv))
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        if exc.code in (0, None):  # --help or --version: it would not serve
            return stage("refused", "the argv asks for help or a version, not a server")
        return stage("refused", lines[-1] if lines else f"exit {exc.code}")
    except Exception as exc:  # noqa: BLE001  (reported, not raised: the runner says what broke)
        return stage("error", f"{type(exc).__name__}: {exc} ({traceback.format_exc(limit=-1).strip().splitlines()[0]})")
    return stage("passed")


def main():
    argvs = json.loads(sys.stdin.read() or "{}").get("argvs", [])
    try:
        import harness.engine as engine
        from harness.engine.args import parse_args
    except Exception as exc:  # noqa: BLE001
        answer = {"error": f"cannot import harness.engine's parser: {type(exc).__name__}: {exc}"}
    else:
        origin = os.path.dirname(os.path.dirname(os.path.abspath(engine.__file__)))
        answer = {
            "checker": "the embedded server's parser",
            "version": f"harness.engine from {origin}",
            "results": [{"stages": [check(parse_args, a)]} for a in argvs],
        }
    sys.stdout.write("\n" + RESULT_MARK + json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
