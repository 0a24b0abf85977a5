"""What code a server will run, asked of its own interpreter: `provenance_probe.py` in a subprocess with the
server's argv[0], environment (PYTHONPATH included) and working directory, just before the server starts.
The answer is the manifest's `server_code`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from harness.schema import CheckoutState, ServerCode
from harness.server.provenance_probe import RESULT_MARK
from harness.server.spec import LaunchSpec

PROBE = Path(__file__).with_name("provenance_probe.py")
PROBE_TIMEOUT_S = 120.0


class ProvenanceError(RuntimeError):
    """The server's interpreter could not say what code it would run."""


def probe_server_code(spec: LaunchSpec, timeout_s: float = PROBE_TIMEOUT_S) -> ServerCode:
    """ServerCode of the server `spec` starts; ProvenanceError naming the interpreter and why not."""
    python = spec.argv[0]
    try:
        proc = subprocess.run([python, str(PROBE), spec.module], capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **spec.env_overrides}, cwd=spec.cwd, check=False)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise ProvenanceError(f"the server interpreter {python} cannot be run ({exc.strerror or exc})") from None
    except subprocess.TimeoutExpired:
        raise ProvenanceError(f"the provenance probe in {python} did not answer within {timeout_s:.0f} s") from None
    marked = [ln[len(RESULT_MARK):] for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if not marked:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise ProvenanceError(f"the provenance probe in {python} exited with code {proc.returncode} without an "
                              f"answer:\n{tail}")
    answer = json.loads(marked[-1])
    if "error" in answer:
        raise ProvenanceError(f"{python} cannot say where {spec.module} comes from: {answer['error']}")
    checkout = answer.pop("checkout")
    return ServerCode(**answer, checkout=CheckoutState(**checkout) if checkout else None)
