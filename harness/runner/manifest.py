"""A run's manifest as the runner starts it: identity, the exact command and environment (secrets
redacted), versions, hardware, dataset and client settings (docs/records.md); the runner fills in the rest
as the run goes."""

from __future__ import annotations

import hashlib
import json
import os
import time

from harness.backends import get as get_backend
from harness.contract import SCHEMA_VERSION, ClientInfo, DatasetRef, Manifest, PlannedRun, ScorerInfo
from harness.host import envinfo
from harness.runner.folder import Campaign
from harness.server.launch import Launch
from harness.server.redact import redact, redact_argv


def server_env(env_overrides: dict[str, str]) -> dict[str, str]:
    """The server's whole environment, secrets redacted."""
    return redact({**os.environ, **env_overrides})


def env_sha256(env_overrides: dict[str, str]) -> str:
    """Hash of the server's whole environment (secrets redacted): equal hashes, equal environments."""
    return hashlib.sha256(json.dumps(server_env(env_overrides), sort_keys=True).encode()).hexdigest()


def start_manifest(c: Campaign, run: PlannedRun, launch: Launch) -> Manifest:
    cfg = c.cfg
    mono, unix = time.monotonic(), time.time()
    return Manifest(
        schema_version=SCHEMA_VERSION,
        campaign_id=c.campaign_id,
        run_id=run.run_id,
        arm=run.arm,
        base_seed=run.base_seed,
        repeat=run.repeat,
        gpu=run.gpu,
        command=redact_argv(launch.argv),
        env=redact(launch.env_overrides),
        env_full=server_env(launch.env_overrides),
        env_full_sha256=env_sha256(launch.env_overrides),
        versions=envinfo.versions(),
        server_code=None,  # the runner asks the server's interpreter next
        gpu_info=envinfo.gpu_info(),
        host=envinfo.host_info(),
        dataset=DatasetRef(id=c.workload.dataset_id, revision=c.workload.revision, sha256=c.workload.sha256),
        model_path=cfg.server.model_path,
        wall_anchor={"monotonic": mono, "unix": unix},
        t_start_unix=unix,
        concurrency=cfg.client.concurrency,
        request_rate=cfg.client.request_rate,
        max_new_tokens=cfg.sampling.max_new_tokens,
        client=ClientInfo(
            stream_mode=None,
            arrival="open" if cfg.client.request_rate else "closed",
            cpus=list(cfg.client.cpus) or None,
        ),
        server_cpus=list(launch.cpus) or None,
        server_url=None if launch.launched else launch.base_url,
        declared_draft_length=get_backend(launch.backend).declared_draft_length(launch.argv),
        scorer=ScorerInfo(name=c.workload.scorer.name, version=c.workload.scorer.version),
    )
