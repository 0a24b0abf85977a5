"""Run the runner on a small filesystem of its own, and break that filesystem while a run measures.

`run_in_mount_namespace(...)` starts `python -m harness.bench` inside a private mount namespace
(`unshare --mount --map-root-user`, so nothing is mounted on the host and no root is needed where user
namespaces are allowed), on a fresh tmpfs of the given size. The runner holds at the start of its first
measured window (SPECBENCH_HOLD_AT=measure, for SPECBENCH_HOLD_S seconds); meanwhile this helper, in the same
namespace, injects the fault:
- "full": fills the tmpfs with a file until the kernel answers ENOSPC;
- "readonly": bind-mounts the campaign folder read-only over itself (files already open stay writable, as
  on a file system remounted read-only under a running program; every new file or rename fails EROFS).
Then it waits for the runner, optionally frees the space and runs it again (a resume), and copies the
tmpfs out (it disappears with the namespace). Run as `python mountns.py SPEC_JSON`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOLD = "specbench: holding at measure"


def can_unshare() -> str | None:
    """None when a private mount namespace with a tmpfs can be made here, else why not."""
    probe = subprocess.run(
        [
            "unshare",
            "--mount",
            "--map-root-user",
            "sh",
            "-c",
            "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d && rmdir $d",
        ],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else f"no private mount namespace here: {probe.stderr.strip()[:200]}"


def run_in_mount_namespace(spec: dict, timeout: float = 300) -> dict:
    """spec: {"out": DIR, "size": "8m", "fault": "full"|"readonly", "campaign": NAME, "experiment": NAME,
    "args": [overrides], "resume": bool}. Returns {"rc": [..], "log": [..]} (one per runner call); the
    tmpfs's files end up in DIR/results."""
    proc = subprocess.run(
        ["unshare", "--mount", "--map-root-user", sys.executable, __file__, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((Path(spec["out"]) / "outcome.json").read_text())


def fill(root: Path) -> None:
    """Write zeros until the tmpfs is full, to the last byte."""
    fd = os.open(root / "fill", os.O_WRONLY | os.O_CREAT, 0o644)
    for size in (65536, 4096, 1):
        block = b"\0" * size
        try:
            while True:
                os.write(fd, block)
        except OSError:
            pass
    os.close(fd)


def runner(mount: Path, spec: dict, log: Path, hold: bool) -> subprocess.Popen:
    env = {**os.environ, **({"SPECBENCH_HOLD_AT": "measure", "SPECBENCH_HOLD_S": "2"} if hold else {})}
    cmd = [
        sys.executable,
        "-m",
        "harness.bench",
        f"results_dir={mount}",
        f"campaign={spec['campaign']}",
        f"experiment={spec['experiment']}",
        *spec["args"],
    ]
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def main() -> None:
    spec = json.loads(sys.argv[1])
    out = Path(spec["out"])
    mount = Path(tempfile.mkdtemp(prefix="specbench-tmpfs-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={spec['size']}", "tmpfs", str(mount)], check=True)
    outcome: dict = {"rc": [], "log": []}
    log = out / "runner-1.log"
    proc = runner(mount, spec, log, hold=True)
    deadline = time.monotonic() + 240
    while HOLD not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    root = mount / spec["experiment"] / spec["campaign"]
    if spec["fault"] == "full":
        fill(mount)
    else:
        subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], check=True)
    outcome["rc"].append(proc.wait(timeout=240))
    outcome["log"].append(log.read_text())
    if spec.get("resume"):
        (mount / "fill").unlink()
        log = out / "runner-2.log"
        outcome["rc"].append(runner(mount, spec, log, hold=False).wait(timeout=240))
        outcome["log"].append(log.read_text())
    shutil.copytree(mount, out / "results", symlinks=True)
    (out / "outcome.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
