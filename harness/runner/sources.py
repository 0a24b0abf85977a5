"""Arms whose server code comes from a git ref (`experiment.arms[i].source`): each ref is resolved to a commit
once per campaign, the commit is materialised once into a cache folder keyed by commit (`git archive`, never
the user's checkout), and the arm's server runs with `<snapshot>/<package_dir>` first on its PYTHONPATH and
the snapshot as its working directory (harness.server.launch.build_spec).

A snapshot is checked before every campaign that uses it: its files (bytecode folders aside) must be exactly
the commit's, as `git archive` gives them, or the campaign is refused naming the files that differ; a new
snapshot is written read-only. Each server's interpreter hashes the snapshot again just before the server
starts (the manifest's server_code.checkout.content_sha256), and a run whose snapshot changed fails there.

`WORKTREE` is the checkout as it is now: its files (untracked ones that git does not ignore included) are
written as a commit object through a temporary index, with a fixed author and date, so that the same files
give the same commit; the checkout, its index and its refs are not touched. An unchanged checkout is its HEAD.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import IO

from harness.contract import SourceDoc
from harness.runner.config import BenchConfig
from harness.server.config import WORKTREE, SourceConfig
from harness.server.provenance_probe import SNAPSHOT_MARK, content_sha256, snapshot_files
from harness.validation import ConfigError

# a WORKTREE commit's identity: fixed, so that equal files make an equal commit (a resume can tell)
SNAPSHOT_IDENTITY = {
    "GIT_AUTHOR_NAME": "specbench",
    "GIT_AUTHOR_EMAIL": "specbench@localhost",
    "GIT_COMMITTER_NAME": "specbench",
    "GIT_COMMITTER_EMAIL": "specbench@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """stdout of `git -C repo ARGS`; ConfigError with git's message when it fails."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **(env or {})},
            timeout=300,
        )
    except FileNotFoundError:
        raise ConfigError("git is not installed; an arm with a source needs it") from None
    if proc.returncode != 0:
        raise ConfigError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def repo_root(path: str, where: str = "source") -> Path:
    """The top folder of the git repository at `path`; ConfigError naming the key and the path otherwise."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(f"{where}.repo={path!r}: no such folder; give the path of a git repository")
    try:
        return Path(git(folder, "rev-parse", "--show-toplevel"))
    except ConfigError:
        raise ConfigError(
            f"{where}.repo={path!r} ({folder}) is not a git repository; give the path of a checkout (git clone ...)"
        ) from None


def worktree_commit(repo: Path) -> str:
    """The checkout's current files as a commit (HEAD when nothing differs), without touching it."""
    head = git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}") if has_head(repo) else None
    with tempfile.TemporaryDirectory(prefix="specbench-index-") as tmp:
        index = Path(tmp) / "index"
        real = Path(git(repo, "rev-parse", "--absolute-git-dir")) / "index"
        if real.is_file():
            # a warm start: git add rehashes only what changed. copy2 keeps the index's mtime, which git's check for
            # "racily clean" entries needs: a file edited in the second the index was written, to the same size,
            # looks unchanged by its stat data, and git compares its content only when the index is not newer
            shutil.copy2(real, index)
        env = {"GIT_INDEX_FILE": str(index), **SNAPSHOT_IDENTITY}
        git(repo, "add", "--all", env=env)
        tree = git(repo, "write-tree", env=env)
    if head is not None and git(repo, "rev-parse", f"{head}^{{tree}}") == tree:
        return head
    parent = ["-p", head] if head else []
    return git(repo, "commit-tree", tree, *parent, "-m", "specbench: WORKTREE snapshot", env=SNAPSHOT_IDENTITY)


def has_head(repo: Path) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "HEAD"], capture_output=True, check=False
        ).returncode
        == 0
    )


def resolve(repo: Path, ref: str, where: str = "source") -> str:
    """The commit `ref` names in `repo`; ConfigError naming the ref when it names none."""
    if ref == WORKTREE:
        return worktree_commit(repo)
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except ConfigError:
        raise ConfigError(
            f"{where}.ref={ref!r} names no commit in {repo}; give a commit, branch or tag "
            f"(git -C {repo} branch -a lists the branches), or {WORKTREE} for the checkout "
            "as it is now"
        ) from None


def _link_leaves(name: str, target: str) -> bool:
    """Whether a symbolic link `name` -> `target` (paths inside the archive) points outside the archive."""
    if posixpath.isabs(target):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    return resolved == ".." or resolved.startswith("../")


def _archive(repo: Path, commit: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _finish(proc: subprocess.Popen, repo: Path, commit: str) -> None:
    """Wait for `git archive`; ConfigError with its message when it failed."""
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read()  # the archive's padding after its end marker: git must not die writing it (SIGPIPE)
    proc.stdout.close()
    if proc.wait() != 0:
        raise ConfigError(f"git archive {commit} in {repo} failed: {proc.stderr.read().decode().strip()}")


def _sha256(data: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: data.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def archive_files(repo: Path, commit: str) -> dict[str, str]:
    """What a snapshot of `commit` must hold, as provenance_probe.snapshot_files maps it, read from `git archive`
    without writing anything. ConfigError naming a symbolic link that points outside the repository (a
    snapshot holds only the commit's own files: such a link would read whatever is there when a server runs)."""
    proc = _archive(repo, commit)
    assert proc.stdout is not None
    out: dict[str, str] = {}
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if member.issym():
                    if _link_leaves(name, member.linkname):
                        raise ConfigError(
                            f"commit {commit[:12]} of {repo} holds the symbolic link {name} -> {member.linkname}, "
                            "which points outside the repository: a snapshot holds only the commit's own files, so "
                            "its server would read whatever that path holds when it runs. Remove the link or commit "
                            "the file itself (an untracked link of a WORKTREE ref: delete it, or list it in "
                            ".gitignore)"
                        )
                    out[name] = "l " + hashlib.sha256(member.linkname.encode()).hexdigest()
                elif member.isfile():
                    data = tar.extractfile(member)
                    assert data is not None  # a regular file
                    out[name] = ("x " if member.mode & 0o100 else "f ") + _sha256(data)
                elif not member.isdir():
                    out[name] = "? not a file, folder or link"
    except tarfile.TarError as exc:
        proc.kill()
        _finish(proc, repo, commit)  # git's own message first, when it failed
        raise ConfigError(f"git archive {commit} in {repo} gave an unreadable archive ({exc})") from None
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    _finish(proc, repo, commit)
    return out


def snapshot_differences(folder: Path, expected: dict[str, str]) -> list[str]:
    """How the files in `folder` differ from `expected` (archive_files), in words; empty when they do not."""
    found = snapshot_files(folder)
    if found == expected:
        return []

    def few(paths: list[str]) -> str:
        return ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")

    edited = sorted(p for p in expected.keys() & found.keys() if expected[p] != found[p])
    missing, added = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    return [
        f"{what}: {few(paths)}" for what, paths in (("edited", edited), ("missing", missing), ("added", added)) if paths
    ]


def check_snapshot(dest: Path, expected: dict[str, str], repo: Path, commit: str) -> None:
    """ConfigError naming the files when the snapshot `dest` does not hold exactly `commit`'s files."""
    differ = snapshot_differences(dest, expected)
    if differ:
        raise ConfigError(
            f"the snapshot {dest} no longer holds commit {commit} of {repo}: {'; '.join(differ)}. An "
            "arm must run exactly the commit its campaign names; remove the snapshot (rm -rf "
            f"{dest}: the next campaign makes it again from the commit), and commit the change you "
            f"meant to run (or name ref {WORKTREE} for uncommitted changes)"
        )


def _read_only(folder: Path) -> None:
    """Every file of the snapshot without write permission (its folders stay writable: Python writes its
    bytecode there, and rm -rf works): an editor refuses or warns before it changes a snapshot."""
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)


def _extract(repo: Path, commit: str, into: Path) -> None:
    proc = _archive(repo, commit)
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            tar.extractall(into, filter="data")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    _finish(proc, repo, commit)


def cache_problem(cache: Path, commit: str, exc: OSError) -> ConfigError:
    """The message for a source_cache that cannot hold a snapshot (read-only, a file, full)."""
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(cache) else ""
    return ConfigError(
        f"source_cache={cache}: cannot write the snapshot of commit {commit[:12]} there: "
        f"{exc.strerror or exc}{where}. Give a writable folder with room for the repository's files "
        "(source_cache=PATH), or free space there; nothing was launched"
    )


def materialise(repo: Path, commit: str, cache: Path) -> tuple[Path, str]:
    """The snapshot of `commit` in `cache` (made once: later campaigns, shards and arms reuse it) and the SHA-256
    of its files. An existing snapshot is checked file by file against the commit first (ConfigError naming
    what differs); a new one is written read-only. ConfigError naming the folder when the cache cannot take it."""
    expected = archive_files(repo, commit)
    digest = content_sha256(expected)
    dest = cache / commit
    if (dest / SNAPSHOT_MARK).is_file():
        check_snapshot(dest, expected, repo, commit)
        return dest, digest
    if cache.exists() and not cache.is_dir():
        raise ConfigError(
            f"source_cache={cache} is a file, not a folder: give a folder for the snapshots of the "
            "arms' commits (source_cache=PATH); nothing was launched"
        )
    tmp: Path | None = None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}.", dir=cache))
        _extract(repo, commit, tmp)
        check_snapshot(tmp, expected, repo, commit)  # what was written is the commit (a full disk may cut it short)
        _read_only(tmp)
        mark = {"repo": str(repo), "commit": commit, "content_sha256": digest}
        (tmp / SNAPSHOT_MARK).write_text(json.dumps(mark) + "\n")
        try:
            tmp.rename(dest)
        except OSError:  # another runner made it meanwhile
            if not (dest / SNAPSHOT_MARK).is_file():
                raise
            check_snapshot(dest, expected, repo, commit)
    except OSError as exc:
        raise cache_problem(cache, commit, exc) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest, digest


def cache_dir(cfg: BenchConfig) -> Path:
    if cfg.source_cache:
        return Path(cfg.source_cache).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specbench" / "sources"


def resolve_source(source: SourceConfig, cache: Path, where: str) -> SourceDoc:
    repo = repo_root(source.repo, where)
    commit = resolve(repo, source.ref, where)
    snapshot, digest = materialise(repo, commit, cache)
    if not (snapshot / source.package_dir).is_dir():
        raise ConfigError(
            f"{where}.package_dir={source.package_dir!r}: commit {commit[:12]} of {repo} has no such "
            "folder (SGLang's package is under python/, this project's at the top: .)"
        )
    return SourceDoc(
        repo=str(repo),
        ref=source.ref,
        commit=commit,
        package_dir=source.package_dir,
        snapshot=str(snapshot),
        content_sha256=digest,
    )


def resolve_sources(cfg: BenchConfig) -> dict[str, SourceDoc]:
    """Each arm with a source -> its resolved, materialised source (each ref resolved once)."""
    out: dict[str, SourceDoc] = {}
    for i, arm in enumerate(cfg.experiment.arms):
        if arm.source.given:
            out[arm.name] = resolve_source(arm.source, cache_dir(cfg), f"experiment.arms.{i}.source")
    return out


def diff_stats(sources: dict[str, SourceDoc], baseline: str) -> dict[str, str]:
    """Per arm with a source, `git diff --stat` from the baseline arm's commit (same repository only)."""
    base = sources.get(baseline)
    if base is None:
        return {}
    out = {}
    for arm, src in sources.items():
        if arm != baseline and src.repo == base.repo:
            out[arm] = git(Path(src.repo), "diff", "--stat", base.commit, src.commit) or "(no change)"
    return out


def moved_refs(old_arms: list[dict], sources: dict[str, SourceDoc]) -> list[str]:
    """For a resume: each arm whose ref resolves to another commit than the campaign recorded, in words."""
    out = []
    for arm in old_arms:
        old = arm.get("source") or None
        new = sources.get(arm.get("name", ""))
        if old is None and new is None:
            continue
        if old is None or new is None or old.get("commit") != new.commit:
            out.append(
                f"arm {arm.get('name')}: ref {(old or {}).get('ref') or (new.ref if new else None)!r} was "
                f"{(old or {}).get('commit') or 'no source'} when the campaign was made, now "
                f"{new.commit if new else 'no source'}"
            )
    return out
