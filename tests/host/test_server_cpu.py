"""The server's process-tree CPU time (harness.host.machine.tree_times / server_cpu, manifest `server_cpu`): a child
that burns a fixed amount of CPU time and is reaped inside the window counts with its parent; nothing here depends on
getting a free core (the child stops on its own CPU clock, not on the wall clock)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from harness.host import machine

BURN_S = 0.3
PARENT = textwrap.dedent(
    f"""
    import subprocess, sys
    sys.stdin.readline()  # the window opens
    child = "import time\\nwhile time.process_time() < {BURN_S}: pass"
    subprocess.run([sys.executable, "-c", child], check=True)
    print("done", flush=True)
    sys.stdin.readline()  # the window closes
    """
)


def test_a_reaped_childs_cpu_time_counts_with_the_tree():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before = machine.tree_times(proc.pid)
        assert before is not None and before.pid == proc.pid
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        doc = machine.server_cpu(before, machine.tree_times(proc.pid))
        assert doc is not None and doc.pid == proc.pid
        assert doc.cpu_s >= BURN_S and abs(doc.cpu_s - (doc.user_s + doc.system_s)) < 0.002
        assert doc.processes >= 1 and doc.wall_s > 0
    finally:
        proc.stdin.write("end\n")
        proc.stdin.flush()
        proc.wait(timeout=30)


def test_a_tree_that_cannot_be_read_gives_none():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    assert machine.tree_times(proc.pid) is None
    assert machine.server_cpu(None, None) is None
