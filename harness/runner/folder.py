"""A campaign's folder, results/<experiment>/<campaign_id>/: campaign.json (written once, then `order_run`
appended by every run), the slot locks that keep two runners off one shard, the resume check (an existing
campaign must have been made by the same config), and the runs' folders (an unfinished run is set aside
under attempts/ before it runs again).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from rich.console import Console

from harness.contract import (
    SCHEMA_VERSION,
    ArmDoc,
    CampaignDoc,
    ItemDoc,
    OrderEntry,
    PlannedRun,
    RunStatus,
    SourceDoc,
    WorkloadDoc,
    read_json,
    seal_file,
    to_json,
    unmeasured,
    with_added_keys,
    write_json,
)
from harness.host.machine import CpuPin
from harness.runner.config import BenchConfig
from harness.runner.plan import check_request_seeds, check_shard
from harness.runner.sources import diff_stats, moved_refs
from harness.runner.stopping import StopSignals
from harness.runner.storage import writing
from harness.server.launch import PlannedLaunch
from harness.server.redact import Secrets, redact, redact_argv
from harness.validation import ConfigError
from workloads.base import Workload


@dataclass
class Campaign:
    """A campaign directory: results/<experiment>/<campaign_id>/."""

    cfg: BenchConfig
    config_dict: dict[str, Any]
    workload: Workload
    plan: list[PlannedRun]
    root: Path
    console: Console = field(default_factory=Console)
    pin: CpuPin = field(default_factory=lambda: CpuPin([]))  # the runner's own pinning (client.cpus)
    shard: int | None = None  # run only this slot of the plan (None: every slot)
    stops: StopSignals | None = (
        None  # the command's stop-signal handler, when it has one (a run's error names the signal)
    )
    sources: dict[str, SourceDoc] = field(default_factory=dict)  # arm -> its resolved source (arms that have one)
    secrets: Secrets = field(default_factory=Secrets)  # masked in everything the campaign writes (campaign_secrets)
    launches: list[PlannedLaunch] = field(default_factory=list)  # the plan's runs with their commands (plan.py)
    _locks: list[Any] = field(default_factory=list, repr=False)

    @property
    def campaign_id(self) -> str:
        return self.root.name

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def planned_launch(self, run_id: str) -> PlannedLaunch:
        """The planned command of a run of the plan (what the dry run shows): KeyError for a run not planned."""
        found = [launch for launch in self.launches if launch.run.run_id == run_id]
        if not found:
            raise KeyError(f"run {run_id} has no planned launch in campaign {self.root}")
        return found[0]

    def campaign_doc(self) -> CampaignDoc:
        exp, cfg = self.cfg.experiment, self.cfg
        return CampaignDoc(
            schema_version=SCHEMA_VERSION,
            campaign_id=self.campaign_id,
            experiment=exp.name,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            config=self.config_dict,
            arms=[
                ArmDoc(
                    name=a.name,
                    args=redact_argv([str(t) for t in a.args]),
                    env=redact(dict(a.env)),
                    python=a.python,
                    seed_stream=a.seed_stream,
                    source=self.sources.get(a.name),
                    url=a.url,
                )
                for a in exp.arms
            ],
            baseline=exp.baseline,
            declared_difference=exp.declared_difference,
            concurrency=cfg.client.concurrency,
            request_rate=cfg.client.request_rate,
            max_new_tokens=cfg.sampling.max_new_tokens,
            workload=workload_doc(self.workload),
            plan=list(self.plan),
            source_diff_stat=diff_stats(self.sources, exp.baseline),
            input_files=input_hashes(cfg.server.model_path),
        )

    @property
    def todo(self) -> list[PlannedRun]:
        """The runs this runner does: the whole plan, or the slot of its shard."""
        return [r for r in self.plan if self.shard is None or r.slot == self.shard]

    def open(self) -> None:
        """Lock the campaign (the shard's slot, or every slot), then create campaign.json or check that an
        existing campaign was made by the same config. Raises ConfigError when the folder cannot be written
        or another runner holds a slot this one needs."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._locks = lock_slots(self.root, sorted({r.slot for r in self.todo}))
            with campaign_file_lock(self.root):
                path = self.root / "campaign.json"
                if not path.exists():
                    write_json(path, self.secrets.scrub_json(to_json(self.campaign_doc())))
                    if self.cfg.campaign:  # a name that was meant to resume one would be mistyped
                        self.console.print(
                            f"[bold]new[/] campaign {self.root} (campaign={self.cfg.campaign} named "
                            "no campaign there: to resume one, give a folder name of "
                            f"{self.root.parent})",
                            soft_wrap=True,
                        )
                    return
                old = read_doc(path, STOP_CAMPAIGN)
        except OSError as exc:
            raise ConfigError(
                f"cannot write the campaign folder {self.root} ({exc.strerror or exc}); "
                "choose a writable results_dir=..."
            ) from None
        self.check_readable(old)
        diffs = config_differences(with_added_keys(old.get("config", {})), self.config_dict)
        if diffs:
            raise ConfigError(
                f"campaign {self.root} was created with a different config (differs at: {', '.join(diffs[:10])}); "
                "resume it with the same overrides, or start a new campaign (leave out `campaign=`)"
            )
        self.check_inputs(old)
        if moved := moved_refs(old.get("arms") or [], self.sources):
            raise ConfigError(
                f"campaign {self.root}: an arm's source ref now names another commit ({'; '.join(moved)}); "
                "a campaign compares one commit per arm: give the recorded commit as the ref, or start "
                "a new campaign (leave out `campaign=`)"
            )
        self.console.print(f"[bold]{'joining' if self.shard is not None else 'resuming'}[/] campaign {self.root}")

    def check_inputs(self, old: dict[str, Any]) -> None:
        """ConfigError (nothing launched) when an input changed since the campaign was created: the workload's rows
        (its SHA-256 in campaign.json) or a model file (input_files), named with both hashes; the runs done so far
        used the old ones."""
        fix = "put back the original, or start a new campaign (leave out campaign=)"
        then = (old.get("workload") or {}).get("sha256")  # (None: a campaign that recorded none)
        if then is not None and then != self.workload.sha256:
            where = self.workload.origin.removeprefix("file:") or self.workload.dataset_id
            raise ConfigError(
                f"campaign {self.root}: the workload {where} changed since the campaign was created (the SHA-256 of "
                f"its rows was {then}, it is {self.workload.sha256} now); the runs done so far used the old rows: {fix}"
            )
        recorded = old.get("input_files") or {}
        now = input_hashes(self.cfg.server.model_path) if recorded else {}
        for path, sha in recorded.items():
            if now.get(path) != sha:
                got = now.get(path) or "(no such file now)"
                raise ConfigError(
                    f"campaign {self.root}: the model file {path} changed since the campaign was created (its "
                    f"SHA-256 was {sha}, it is {got} now); the runs done so far loaded the old one: {fix}"
                )

    def check_readable(self, doc: dict[str, Any]) -> None:
        """ConfigError (nothing changed) unless the existing campaign.json and the manifests of its runs can
        be read as what they claim to be: a resume decides from them what to keep and what to redo."""
        path = self.root / "campaign.json"
        for key, kind in (("config", dict), ("order_run", list)):
            if not isinstance(doc.get(key), kind):
                raise ConfigError(f"{path} has no {key} {kind.__name__}: {STOP_CAMPAIGN}")
        for run in self.plan:
            manifest = self.run_dir(run.run_id) / "manifest.json"
            if manifest.exists():
                read_doc(
                    manifest,
                    STOP_RUN.format(run=run.run_id, run_dir=self.run_dir(run.run_id), attempts=self.root / "attempts"),
                )

    def close(self) -> None:
        """Release the slot locks (the process's exit does it too)."""
        for handle in self._locks:
            handle.close()
        self._locks = []

    def run_status(self, run_id: str) -> str | None:
        path = self.run_dir(run_id) / "manifest.json"
        return read_doc(path).get("status") if path.exists() else None

    def set_aside(self, run_id: str) -> Path | None:
        """Move an unfinished run's files to attempts/<run_id>.<n> so a rerun starts clean."""
        src = self.run_dir(run_id)
        if not src.exists():
            return None
        n = 1
        while (dst := self.root / "attempts" / f"{run_id}.{n}").exists():
            n += 1
        with writing(dst):
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dst))
        return dst

    def log_order(self, run_id: str, status: RunStatus, t_start: float, t_end: float) -> None:
        path = self.root / "campaign.json"
        with writing(path), campaign_file_lock(self.root):  # shards append to the same list
            doc = read_json(path)
            doc["order_run"].append(
                to_json(
                    OrderEntry(
                        run_id=run_id, status=status, t_start_unix=t_start, t_end_unix=t_end, host=socket.gethostname()
                    )
                )
            )
            write_json(path, doc)


STOP_CAMPAIGN = (
    "the campaign cannot be resumed from it. Nothing was changed. Put back a good copy of the file, or move "
    "the campaign folder aside and start a new campaign (leave out campaign=)"
)
STOP_RUN = (
    "the state of run {run} is unknown. Nothing was changed. Move {run_dir} into {attempts}/ (the run is then done "
    "again), or start a new campaign (leave out campaign=)"
)


def read_doc(
    path: Path, what_to_do: str = "move it aside, or start a new campaign (leave out campaign=)"
) -> dict[str, Any]:
    """A campaign file that must hold a JSON object; ConfigError naming the file, what is wrong with it and
    `what_to_do` when it is empty, not JSON or not an object."""
    try:
        text = path.read_text(encoding="utf-8")
        problem = "is empty" if not text.strip() else None
        doc = json.loads(text) if problem is None else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        problem = f"is not valid JSON ({exc})"
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or exc})"
    if problem is None and not isinstance(doc, dict):
        problem = f"holds a {type(doc).__name__}, not an object"
    if problem is not None:
        raise ConfigError(f"{path} {problem}: {what_to_do}")
    return cast(dict[str, Any], doc)


def slot_lock_name(slot: int) -> str:
    return f".lock.shard-{slot}"


def lock_slots(root: Path, slot_ids: list[int]) -> list[Any]:
    """Hold an exclusive lock on each slot (shard) of the campaign for as long as the returned files stay
    open (the process's life: the kernel drops them even on SIGKILL, so a crashed runner never leaves a
    stale lock). Shards of one campaign run side by side; two runners on one slot never do.

    A runner that finds a slot held gets a ConfigError naming the holder (its own locks are released).
    """
    held: list[Any] = []
    for slot in slot_ids:
        handle = open(root / slot_lock_name(slot), "a+")  # noqa: SIM115  (kept open: the lock lives with it)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            for h in [handle, *held]:
                h.close()
            raise ConfigError(
                f"campaign {root} (shard {slot}) is being run by {holder}; wait for it to finish, "
                "or start a new campaign (leave out campaign=)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(
            f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(UTC).isoformat(timespec='seconds')}\n"
        )
        handle.flush()
        held.append(handle)
    return held


@contextlib.contextmanager
def campaign_file_lock(root: Path) -> Iterator[None]:
    """A short exclusive lock around reading and rewriting campaign.json (shards share it)."""
    with open(root / ".lock.campaign-json", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config as campaign.json stores it: env values and secret flags of the server and
    of each arm redacted (launcher.redact, redact_argv)."""
    out = copy.deepcopy(config)
    parts = [out.get("server") or {}] + list((out.get("experiment") or {}).get("arms") or [])
    for part in parts:
        if isinstance(part.get("env"), dict):
            part["env"] = redact(part["env"])
        if isinstance(part.get("args"), list):
            part["args"] = redact_argv([str(a) for a in part["args"]])
    return out


def input_hashes(model_path: str) -> dict[str, str]:
    """SHA-256 of each local file of the model (the file `model_path` names, or every file under the folder it
    names), path -> hash; {} for a model that is no local path (embedded:mini, a hub id)."""
    path = Path(model_path).expanduser()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    return {str(p.resolve()): seal.sha256 for p in files if (seal := seal_file(p)) is not None}


def workload_doc(workload: Workload) -> WorkloadDoc:
    return WorkloadDoc(
        name=workload.name,
        dataset_id=workload.dataset_id,
        revision=workload.revision,
        sha256=workload.sha256,
        skipped_placeholders=workload.skipped_placeholders,
        items=[
            ItemDoc(item_id=i.item_id, seed_offset=i.seed_offset, category=i.category, answer=i.answer)
            for i in workload.items
        ],
    )


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, ignoring the keys that do not change what is measured."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            if unmeasured(f"{prefix}{key}"):
                continue
            out += config_differences(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [prefix.rstrip(".")]


def new_campaign_id(cfg: BenchConfig) -> str:
    """Time, concurrency and a random suffix: jobs started in the same second (a sweep, a cluster array)
    never share a campaign folder."""
    return datetime.now().strftime("%Y%m%d-%H%M%S") + f"-c{cfg.client.concurrency}-{secrets.token_hex(3)}"


def campaign_root(cfg: BenchConfig) -> Path:
    return Path(cfg.results_dir) / cfg.experiment.name / (cfg.campaign or new_campaign_id(cfg))


def build_campaign(
    cfg: BenchConfig,
    config_dict: dict,
    workload: Workload,
    launches: list[PlannedLaunch],
    console: Console,
    stops: StopSignals | None = None,
    sources: dict[str, SourceDoc] | None = None,
) -> Campaign:
    """The campaign of a config and its plan (`launches`: harness.runner.plan.planned_launches, built once by the
    command); ConfigError (nothing launched) when a planned request seed is out of range or the shard does not
    exist."""
    check_request_seeds(cfg, workload)
    plan = [launch.run for launch in launches]
    check_shard(cfg.shard, plan)
    return Campaign(
        cfg=cfg,
        config_dict=redact_config(config_dict),
        workload=workload,
        plan=plan,
        root=campaign_root(cfg),
        console=console,
        pin=CpuPin(list(cfg.client.cpus)),
        shard=cfg.shard,
        stops=stops,
        sources=dict(sources or {}),
        secrets=campaign_secrets(cfg),
        launches=list(launches),
    )


def campaign_secrets(cfg: BenchConfig) -> Secrets:
    """The secret values of the runner's environment and of every server and arm setting (by name, by flag)."""
    arms = cfg.experiment.arms
    env = {**os.environ, **cfg.server.env, **{k: v for a in arms for k, v in a.env.items()}}
    return Secrets.of(env, [[str(t) for t in cfg.server.args], *([str(t) for t in a.args] for a in arms)])
