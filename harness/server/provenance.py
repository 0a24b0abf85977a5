"""What code a server will run, asked of its own interpreter: `provenance_probe.py` in a subprocess with the
server's argv[0], environment (PYTHONPATH included) and working directory, just before the server starts.
The answer is the manifest's `server_code`."""

from __future__ import annotations

from pathlib import Path

from harness.contract import CheckoutState, ServerCode
from harness.server.ask import AskError, ask
from harness.server.launch import Launch
from harness.server.provenance_probe import RESULT_MARK

PROBE = Path(__file__).with_name("provenance_probe.py")
PROBE_TIMEOUT_S = 120.0


class ProvenanceError(RuntimeError):
    """The server's interpreter could not say what code it would run."""


def probe_server_code(launch: Launch, timeout_s: float = PROBE_TIMEOUT_S) -> ServerCode:
    """ServerCode of the server `launch` starts; ProvenanceError naming the interpreter and why not. The wait is
    bounded by `timeout_s` and by the server's own start limit (server.ready_timeout_s), whichever is shorter."""
    python = launch.argv[0]
    timeout_s = min(timeout_s, launch.ready_timeout_s)
    try:
        answer = ask(
            python,
            PROBE,
            [launch.module],
            mark=RESULT_MARK,
            env=launch.env_overrides,
            timeout_s=timeout_s,
            cwd=launch.cwd,
            what="the provenance probe",
        )
    except AskError as err:
        raise ProvenanceError(str(err)) from None
    if "error" in answer:
        raise ProvenanceError(f"{python} cannot say where {launch.module} comes from: {answer['error']}")
    checkout = answer.pop("checkout")
    return ServerCode(**answer, checkout=CheckoutState(**checkout) if checkout else None)
