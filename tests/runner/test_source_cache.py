"""The snapshots of the arms' git refs (`source_cache`) are checked, not trusted: an edited snapshot never runs
under the commit it names, and a cache that cannot hold a snapshot (read-only, a file, full) or a commit whose
links point out of the repository is refused before anything launches, in one line, exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from code_repos import SERVICE, arms, git, make_repo, squash
from mountns import can_unshare

from configs import composed
from harness.backends.launch import build_launch
from harness.runner.runs import RunFailed, check_snapshot_unchanged
from harness.runner.sources import materialise, resolve_sources
from harness.server.config import ArmConfig, ServerConfig
from harness.server.provenance import probe_server_code

NO_NAMESPACE = can_unshare()


def writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | 0o200)


def dry_run(run_bench, repo: Path, cache: Path, *more: str):
    return run_bench("experiment=embedded_code_ab", *arms(repo), "dry_run=true", f"source_cache={cache}", *more)


def test_an_edited_snapshot_is_refused_naming_the_file_and_a_new_one_is_read_only(run_bench, tmp_path):
    repo = make_repo(tmp_path)
    cache = tmp_path / "cache"
    assert dry_run(run_bench, repo, cache).returncode == 0
    snapshot = cache / git(repo, "rev-parse", "change")
    service = snapshot / SERVICE
    read_only = not service.stat().st_mode & 0o222  # written read-only: an editor refuses or warns
    writable(service)
    service.write_text(service.read_text() + "EDITED = True\n")
    for more in ((), ("dry_run=false", "report=false")):  # the dry run and a real run: refused before any launch
        proc = dry_run(run_bench, repo, cache, *more)
        said = squash(proc.stdout + proc.stderr)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert (
            squash(f"the snapshot {snapshot} no longer holds commit") in said
            and squash(f"edited: {SERVICE}") in said
            and squash(f"rm -rf {snapshot}") in said
        ), said[-2000:]
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "embedded_code_ab").exists()  # nothing was written: no campaign folder
    assert read_only
    (snapshot / "harness" / "planted.py").write_text("X = 1\n")
    said = squash(dry_run(run_bench, repo, cache).stdout)
    assert squash("added: harness/planted.py") in said and squash(f"edited: {SERVICE}") in said
    shutil.rmtree(snapshot)  # as the message says: the next campaign makes it again
    assert dry_run(run_bench, repo, cache).returncode == 0 and "EDITED" not in service.read_text()


def test_bytecode_written_beside_the_sources_is_not_an_edit(tmp_path):
    repo = make_repo(tmp_path)
    commit = git(repo, "rev-parse", "main")
    snapshot, digest = materialise(repo, commit, tmp_path / "cache")
    (snapshot / "harness" / "__pycache__").mkdir(exist_ok=True)
    (snapshot / "harness" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert materialise(repo, commit, tmp_path / "cache") == (snapshot, digest)


def test_a_snapshot_edited_after_the_campaign_checked_it_fails_the_run(tmp_path):
    """Edited between the campaign's check and a server's start: the run fails before its server starts (the
    server's interpreter hashed the snapshot). (A manifest whose snapshot differed fails the audit:
    tests/runner/test_code_under_test.py.)"""
    repo = make_repo(tmp_path)
    cfg = composed("experiment=embedded_code_ab", *arms(repo), f"source_cache={tmp_path / 'cache'}")
    source = resolve_sources(cfg)["change"]
    spec = build_launch(
        ServerConfig(model_path="embedded:mini"),
        ArmConfig(name="change"),
        port=1,
        base_seed=None,
        gpu=None,
        log_path=tmp_path / "l",
        source=source,
    )
    check_snapshot_unchanged(source, probe_server_code(spec))  # as checked: the run goes on
    service = Path(source.snapshot) / SERVICE
    writable(service)
    service.write_text(service.read_text() + "EDITED = True\n")
    with pytest.raises(RunFailed, match=f"no longer holds commit {source.commit}.*edited: {SERVICE}"):
        check_snapshot_unchanged(source, probe_server_code(spec))


def test_links_out_of_the_repository_are_refused_naming_them(run_bench, tmp_path):
    repo = make_repo(tmp_path)
    (repo / "harness" / "inside.txt").symlink_to("engine/service.py")  # a relative link inside: kept as a link
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a link inside")
    cache = tmp_path / "cache"
    proc = run_bench("experiment=embedded_code_ab", *arms(repo), "dry_run=true", f"source_cache={cache}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (cache / git(repo, "rev-parse", "main") / "harness" / "inside.txt").is_symlink()
    for name, target in (("abs_link", "/etc/hostname"), ("rel_link", "../../outside.py")):
        link = repo / "harness" / name
        link.symlink_to(target)  # untracked: WORKTREE holds it
        proc = run_bench(
            "experiment=embedded_code_ab", *arms(repo, change="WORKTREE"), "dry_run=true", f"source_cache={cache}"
        )
        said = squash(proc.stdout + proc.stderr)
        assert proc.returncode == 2 and squash(f"symbolic link harness/{name} -> {target}") in said, said[-2000:]
        assert squash("points outside the repository") in said and "Traceback" not in proc.stderr
        link.unlink()


def test_a_source_cache_that_is_a_file_is_refused_in_one_line(run_bench, tmp_path):
    repo = make_repo(tmp_path)
    cache = tmp_path / "cache"
    cache.write_text("not a folder\n")
    proc = dry_run(run_bench, repo, cache)
    said = squash(proc.stdout + proc.stderr)
    assert proc.returncode == 2 and squash(f"source_cache={cache} is a file, not a folder") in said, said[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(NO_NAMESPACE is not None, reason=str(NO_NAMESPACE))
@pytest.mark.parametrize(
    ("mount", "reason"),
    [
        ("mount --bind {d} {d} && mount -o remount,bind,ro {d}", "Read-only file system"),
        ("mount -t tmpfs -o size=64k tmpfs {d}", "No space left on device"),
    ],
)
def test_a_source_cache_that_cannot_take_the_snapshot_is_refused_naming_it(tmp_path, mount, reason):
    """A read-only file system, and one too small for the repository's files (64 KiB: the disk fills while the
    snapshot is written), in a private mount namespace."""
    repo = make_repo(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    bench = [
        sys.executable,
        "-m",
        "harness.bench",
        f"results_dir={tmp_path / 'results'}",
        "experiment=embedded_code_ab",
        *arms(repo),
        "dry_run=true",
        f"source_cache={cache}",
    ]
    script = mount.format(d=cache) + " && exec " + " ".join(f"'{a}'" for a in bench)
    proc = subprocess.run(
        ["unshare", "--mount", "--map-root-user", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    said = squash(proc.stdout + proc.stderr)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert squash(f"source_cache={cache}: cannot write the snapshot of commit") in said and squash(reason) in said
    assert "Traceback" not in proc.stderr
    assert list(cache.iterdir()) == []  # (outside the namespace: nothing was left there)
