"""The plan of a campaign: which runs (arm x base seed x repeat), in which order, on which GPU, the
server command each of them will launch, and the requests each of them sends (seeded).

`planned_launches` builds the plan once (harness.runner.command); the dry run prints it, the argv preflights check it
and the campaign's runs launch it (`PlannedLaunch.at`: the port filled in), so what is shown is what is checked is
what the runner launches (but for the port and the log's folder).
"""

from __future__ import annotations

from pathlib import Path

from harness.backends import get as get_backend
from harness.backends.launch import flag_keys, launch_template
from harness.client.requests import RequestPlan
from harness.contract import PlannedRun, SourceDoc
from harness.runner.config import BenchConfig, ExperimentConfig, request_seed
from harness.server.launch import PORT_PLACEHOLDER, PlannedLaunch
from harness.validation import ConfigError
from workloads.base import Workload


def arm_order(arm_names: list[str], slot: int, order: str) -> list[str]:
    """`alternate`: slot 0 A,B; slot 1 B,A; ... (reversed on odd slots); `fixed`: always as declared."""
    return list(reversed(arm_names)) if order == "alternate" and slot % 2 == 1 else list(arm_names)


def make_plan(exp: ExperimentConfig) -> list[PlannedRun]:
    """Every (base seed, repeat) is a slot holding one run per arm; arms alternate by slot.

    With parallel placement the runs of a slot start together, the i-th of the slot's order on
    `exp.gpus[i]`, so alternation also swaps the GPUs between arms.
    """
    names = [a.name for a in exp.arms]
    runs: list[PlannedRun] = []
    slot = 0
    for base_seed in exp.base_seeds:
        for repeat in range(exp.repeats):
            for pos, arm in enumerate(arm_order(names, slot, exp.order)):
                gpu = exp.gpus[pos] if exp.placement == "parallel" else None
                index = len(runs)
                run_id = f"{index:03d}-{arm}-s{base_seed}-r{repeat}"
                runs.append(PlannedRun(run_id, arm, base_seed, repeat, index, slot, gpu))
            slot += 1
    return runs


def slots(plan: list[PlannedRun]) -> list[list[PlannedRun]]:
    """The plan grouped by slot, in order."""
    grouped: dict[int, list[PlannedRun]] = {}
    for run in plan:
        grouped.setdefault(run.slot, []).append(run)
    return [grouped[k] for k in sorted(grouped)]


def check_shard(shard: int | None, plan: list[PlannedRun]) -> None:
    """ConfigError when `shard` names no slot of the plan."""
    count = len(slots(plan))
    if shard is not None and not 0 <= shard < count:
        raise ConfigError(
            f"shard={shard} does not exist: this campaign has {count} shard(s), shard=0 to "
            f"shard={count - 1}, one per (base seed, repeat); e.g. -m shard='range(0,{count})'"
        )


def planned_launches(cfg: BenchConfig, sources: dict[str, SourceDoc] | None = None) -> list[PlannedLaunch]:
    """Every planned run with the command that will start its server (port PORT_PLACEHOLDER unless
    server.port is fixed; log path relative) and the config key of each of its flags; `sources`: the
    resolved source of each arm that has one (harness.runner.sources). Built once per command and handed on."""
    arms = cfg.experiment.arms
    out = []
    for run in make_plan(cfg.experiment):
        index = next(i for i, a in enumerate(arms) if a.name == run.arm)
        template = launch_template(
            cfg.server,
            arms[index],
            base_seed=run.base_seed,
            gpu=run.gpu,
            log_path=Path("server.log"),
            source=(sources or {}).get(run.arm),
            slots=cfg.client.concurrency,
        )
        out.append(
            PlannedLaunch(run, template, flag_keys(cfg.server, arms[index], index), cfg.server.port or PORT_PLACEHOLDER)
        )
    return out


def planned_requests(
    cfg: BenchConfig, workload: Workload, base_seed: int, seed_stream: int = 0
) -> tuple[list[RequestPlan], list[RequestPlan]]:
    """(warmup requests, measured requests) of one run. Request seed = base seed + the item's numeric id +
    the arm's seed_stream * 2**32."""

    def seed(offset: int) -> int | None:
        return request_seed(base_seed, offset, seed_stream) if cfg.experiment.seeded_requests else None

    items = workload.items
    warm = [
        RequestPlan(
            items[i % len(items)], seed(items[i % len(items)].seed_offset), True, cfg.experiment.warmup.max_new_tokens
        )
        for i in range(cfg.experiment.warmup.requests)
    ]
    measured = [RequestPlan(it, seed(it.seed_offset), False, cfg.sampling.max_new_tokens) for it in items]
    return warm, measured


def check_request_seeds(cfg: BenchConfig, workload: Workload) -> None:
    """ConfigError (before anything launches) when a planned request seed does not fit 64 bits, or, for
    llama-server, its 32-bit seed (never truncated: a stream stride of 2**32 would give every stream the same
    seeds)."""
    if not cfg.experiment.seeded_requests:
        return
    backend = get_backend(cfg.server.backend)
    limit = backend.seed_max
    for arm in cfg.experiment.arms:
        for base_seed in cfg.experiment.base_seeds:
            for item in workload.items:
                seed = request_seed(base_seed, item.seed_offset, arm.seed_stream)
                if limit is not None and not 0 <= seed <= limit:
                    raise ConfigError(
                        f"request seed {base_seed} + {item.seed_offset} + {arm.seed_stream} * 2**32 = {seed} (arm "
                        f"{arm.name}, item {item.item_id}) does not fit {backend.title}'s {limit.bit_length()}-bit seed (0 to {limit}; "
                        f"{limit + 1} means 'random'): it would be truncated. Use experiment.base_seeds below "
                        f"{limit + 1 - max(i.seed_offset for i in workload.items)} and seed_stream 0 for every arm"
                    )
