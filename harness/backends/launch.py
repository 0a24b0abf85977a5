"""The exact command and environment of one run of an arm, from its backend: planned once with its port left open
(`launch_template`, a PORT_FIELD in the argv) and filled in when the run starts (`build_launch` does both at once);
and the config key each of its flags comes from (`flag_keys`)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.backends import get
from harness.contract import SourceDoc
from harness.server.config import ArmConfig, ServerConfig
from harness.server.launch import PORT_FIELD, PORT_PLACEHOLDER, Launch, fill_port, merge_log_checks


def build_launch(
    server: ServerConfig,
    arm: ArmConfig,
    *,
    port: int,
    base_seed: int | None,
    gpu: int | None,
    log_path: Path,
    source: SourceDoc | None = None,
    slots: int = 1,
) -> Launch:
    """The launch of one run of one arm at `port` (launch_template, its port filled in)."""
    template = launch_template(server, arm, base_seed=base_seed, gpu=gpu, log_path=log_path, source=source, slots=slots)
    return fill_port(template, port)


def launch_template(
    server: ServerConfig,
    arm: ArmConfig,
    *,
    base_seed: int | None,
    gpu: int | None,
    log_path: Path,
    source: SourceDoc | None = None,
    slots: int = 1,
) -> Launch:
    """The exact command and environment of one run of one arm, its port a PORT_FIELD: the backend's command, then the seed flag,
    server.args and the arm's args; an arm with a source runs from its snapshot (first on PYTHONPATH, and the working
    directory, which `python -m` puts first on sys.path). `slots`: the requests the server must hold at once
    (client.concurrency)."""
    backend = get(server.backend)
    argv = backend.launch_argv(server, arm, PORT_FIELD, slots)
    if server.seed_arg and base_seed is not None:
        argv += [server.seed_arg, str(base_seed)]
    argv += [str(a) for a in server.args] + [str(a) for a in arm.args]
    env = {**{k: str(v) for k, v in server.env.items()}, **{k: str(v) for k, v in arm.env.items()}}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if source is not None:
        first = str(Path(source.snapshot) / source.package_dir)
        rest = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (first, rest) if p)
    return Launch(
        argv=argv,
        env_overrides=env,
        host=server.host,
        port=PORT_PLACEHOLDER,
        log_path=log_path,
        log_checks=merge_log_checks(server.log_checks, arm.log_checks),
        ready_timeout_s=server.ready_timeout_s,
        stop_timeout_s=server.stop_timeout_s,
        health_timeout_s=server.health_timeout_s,
        cpus=list(server.cpus),
        cwd=Path(source.snapshot) if source else None,
        module=server.module,
        backend=server.backend,
        ready_path=backend.ready_path,
        info_path=backend.info_path,
        native=backend.native,
        url=arm.url or server.url,
    )


def flag_keys(server: ServerConfig, arm: ArmConfig, arm_index: int) -> tuple[tuple[str, str], ...]:
    """(flag, config key) for the flags of one arm's command; later keys win (the arm's over the server's)."""
    pairs = get(server.backend).flag_keys()
    pairs += [(server.seed_arg, "server.seed_arg")] if server.seed_arg else []
    pairs += [(str(t).split("=", 1)[0], "server.args") for t in server.args]
    pairs += [(str(t).split("=", 1)[0], f"experiment.arms.{arm_index}.args") for t in arm.args]
    return tuple(dict(pairs).items())
