"""The plan of a campaign: which runs (arm x base seed x repeat), in which order, on which GPU."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from harness.config import ExperimentConfig


@dataclass(frozen=True)
class PlannedRun:
    run_id: str
    arm: str
    base_seed: int
    repeat: int
    index: int  # position in the order of execution
    slot: int  # runs sharing a slot run at the same time (parallel placement)
    gpu: int | None  # GPU index given through CUDA_VISIBLE_DEVICES (parallel placement only)

    def to_dict(self) -> dict:
        return asdict(self)


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
