"""Arms whose server code comes from a git ref (`experiment.arms[i].source`): each ref is resolved to a commit
once per campaign, the commit is materialised once into a cache folder keyed by commit (`git archive`, never
the user's checkout), and the arm's server runs with `<snapshot>/<package_dir>` first on its PYTHONPATH and
the snapshot as its working directory (harness.server.spec.build_spec).

`WORKTREE` is the checkout as it is now: its files (untracked ones that git does not ignore included) are
written as a commit object through a temporary index, with a fixed author and date, so that the same files
give the same commit; the checkout, its index and its refs are not touched. An unchanged checkout is its HEAD.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from harness.campaign.config import BenchConfig
from harness.schema import SourceDoc
from harness.server.config import WORKTREE, SourceConfig
from harness.server.provenance_probe import SNAPSHOT_MARK
from harness.validation import ConfigError

# a WORKTREE commit's identity: fixed, so that equal files make an equal commit (a resume can tell)
SNAPSHOT_IDENTITY = {"GIT_AUTHOR_NAME": "specbench", "GIT_AUTHOR_EMAIL": "specbench@localhost",
                     "GIT_COMMITTER_NAME": "specbench", "GIT_COMMITTER_EMAIL": "specbench@localhost",
                     "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000"}


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """stdout of `git -C repo ARGS`; ConfigError with git's message when it fails."""
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False,
                              env={**os.environ, **(env or {})}, timeout=300)
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
        raise ConfigError(f"{where}.repo={path!r} ({folder}) is not a git repository; give the path of a "
                          "checkout (git clone ...)") from None


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
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "HEAD"],
                          capture_output=True, check=False).returncode == 0


def resolve(repo: Path, ref: str, where: str = "source") -> str:
    """The commit `ref` names in `repo`; ConfigError naming the ref when it names none."""
    if ref == WORKTREE:
        return worktree_commit(repo)
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except ConfigError:
        raise ConfigError(f"{where}.ref={ref!r} names no commit in {repo}; give a commit, branch or tag "
                          f"(git -C {repo} branch -a lists the branches), or {WORKTREE} for the checkout "
                          "as it is now") from None


def materialise(repo: Path, commit: str, cache: Path) -> Path:
    """The snapshot of `commit` in `cache` (made once: later campaigns, shards and arms reuse it)."""
    dest = cache / commit
    if (dest / SNAPSHOT_MARK).is_file():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}.", dir=cache))
    try:
        proc = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            tar.extractall(tmp, filter="data")
        if proc.wait() != 0:
            raise ConfigError(f"git archive {commit} in {repo} failed: {proc.stderr.read().decode().strip()}")
        (tmp / SNAPSHOT_MARK).write_text(json.dumps({"repo": str(repo), "commit": commit}) + "\n")
        try:
            tmp.rename(dest)
        except OSError:  # another runner made it meanwhile
            if not (dest / SNAPSHOT_MARK).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def cache_dir(cfg: BenchConfig) -> Path:
    if cfg.source_cache:
        return Path(cfg.source_cache).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specbench" / "sources"


def resolve_source(source: SourceConfig, cache: Path, where: str) -> SourceDoc:
    repo = repo_root(source.repo, where)
    commit = resolve(repo, source.ref, where)
    snapshot = materialise(repo, commit, cache)
    if not (snapshot / source.package_dir).is_dir():
        raise ConfigError(f"{where}.package_dir={source.package_dir!r}: commit {commit[:12]} of {repo} has no such "
                          "folder (SGLang's package is under python/, this project's at the top: .)")
    return SourceDoc(repo=str(repo), ref=source.ref, commit=commit, package_dir=source.package_dir,
                     snapshot=str(snapshot))


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
            out.append(f"arm {arm.get('name')}: ref {(old or {}).get('ref') or (new.ref if new else None)!r} was "
                       f"{(old or {}).get('commit') or 'no source'} when the campaign was made, now "
                       f"{new.commit if new else 'no source'}")
    return out
