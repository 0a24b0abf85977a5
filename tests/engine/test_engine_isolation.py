"""A request that makes a step fail is aborted alone: its batch neighbours finish, with the very tokens
they get when the failing request is not there (the failed step's draws are rolled back)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from harness.engine.model import SyntheticLM
from harness.engine.params import SamplingParams
from harness.engine.request import Request, SpecCounters
from harness.engine.scheduler import Scheduler
from harness.engine.tokenizer import Tokenizer
from harness.engine.worker import BatchInput, StepOutput, Worker, WorkerConfig
from harness.models.presets import get_preset

POISON = 0.123  # a temperature that makes FailingWorker's steps raise whenever it is in the batch
GAMMA = 4


class FailingWorker(Worker):
    """The real worker, except that a step whose batch holds a poisoned row raises at its end, after every
    row has drawn its random numbers (a fault injector)."""

    def _maybe_fail(self, batch: BatchInput, out: StepOutput) -> StepOutput:
        if POISON in batch.temperature:
            raise RuntimeError("poisoned row in the batch")
        return out

    def prefill(self, batch: BatchInput) -> StepOutput:
        return self._maybe_fail(batch, super().prefill(batch))

    def decode(self, batch: BatchInput) -> StepOutput:
        return self._maybe_fail(batch, super().decode(batch))


@pytest.fixture(scope="module")
def model() -> SyntheticLM:
    return SyntheticLM.build(get_preset("embedded:mini"), 1.0)


def serve(model: SyntheticLM, temperatures: list[float], failing_from: int) -> list[Request]:
    """Run requests (seed i, prompt [i+5, 7]) through a real Scheduler; the poison applies from the
    `failing_from`-th decode step on (the poisoned request first runs normally)."""
    worker = FailingWorker(model, WorkerConfig(GAMMA, "sampled", False, "full_vocab", deterministic=True))
    tokenizer = Tokenizer(model.vocab_size)

    async def main() -> list[Request]:
        scheduler = Scheduler(worker, max_running=8, decode_log_interval=40)
        reqs = [
            Request(
                rid=f"r{i}",
                prompt_ids=[i + 5, 7],
                params=SamplingParams(max_new_tokens=40, temperature=1.0, top_k=20, ignore_eos=True),
                generator=torch.Generator().manual_seed(i),
                tokenizer=tokenizer,
                spec=SpecCounters(GAMMA),
                stream=False,
            )
            for i in range(len(temperatures))
        ]
        for r in reqs:
            scheduler.submit(r)
        task = asyncio.create_task(scheduler.run())
        steps = 0
        while not all(r.finished for r in reqs):
            await asyncio.sleep(0.005)
            steps = scheduler.stats.decode_iterations
            if steps >= failing_from:  # from now on the poisoned rows carry the poison
                for r, t in zip(reqs, temperatures, strict=True):
                    if t == POISON and r.params.temperature != POISON:
                        object.__setattr__(r.params, "temperature", POISON)
        task.cancel()
        scheduler.shutdown()
        return reqs

    return asyncio.run(main())


@pytest.mark.parametrize("failing_from", [0, 3])
def test_a_failing_request_is_aborted_alone_and_neighbours_keep_their_tokens(model, failing_from):
    clean = serve(model, [1.0, 1.0, 1.0, 1.0], failing_from)
    mixed = serve(model, [1.0, POISON, 1.0, 1.0], failing_from)
    bad = mixed[1]
    assert bad.finish_reason["type"] == "abort"
    assert "internal error: RuntimeError: poisoned row in the batch" in bad.finish_reason["message"]
    for i in (0, 2, 3):
        assert mixed[i].finish_reason == {"type": "length", "length": 40}, mixed[i].finish_reason
        assert mixed[i].output_ids == clean[i].output_ids  # same draws as without the failing neighbour
