"""A runner killed at the moment it forks its server leaves no server behind (harness.server.process: the
parent-death signal, and the child's check that its parent is still the runner).

`python spawn_race.py N LOGDIR` forks N short-lived "runners", each of which starts a server with the
harness's own launcher (Server.start) and is SIGKILLed after a random 0-4 ms, around its fork; then counts
the servers still alive (their command line carries this race's marker) and prints `left behind: K`."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
import uuid
from pathlib import Path

import psutil

from harness.server.config import LogChecks
from harness.server.launch import Launch
from harness.server.process import Server


def main() -> None:
    n, logs = int(sys.argv[1]), Path(sys.argv[2])
    marker = f"spawn-race-{uuid.uuid4().hex[:8]}"
    rng = random.Random(0)
    for i in range(n):
        spec = Launch(
            argv=["/bin/sh", "-c", "sleep 60", marker],
            env_overrides={},
            host="127.0.0.1",
            port=0,
            log_path=logs / f"server-{i}.log",
            log_checks=LogChecks(),
            ready_timeout_s=5,
            stop_timeout_s=5,
        )
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the runner
            os.close(ready_r)
            os.write(ready_w, b"x")
            Server(spec).start()
            time.sleep(60)
            os._exit(0)
        os.close(ready_w)
        os.read(ready_r, 1)
        os.close(ready_r)
        time.sleep(rng.uniform(0, 0.004))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    time.sleep(1.0)  # the death signal's SIGTERM takes effect
    left = [
        p
        for p in psutil.process_iter(["cmdline", "status"])
        if marker in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
    ]
    for proc in left:
        proc.kill()
    print(f"left behind: {len(left)}")


if __name__ == "__main__":
    main()
