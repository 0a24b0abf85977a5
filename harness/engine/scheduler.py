"""Continuous batching: every iteration admits queued requests up to `--max-running-requests`,
prefills the new ones (their first token), then runs one decode step over all the others together.

The scheduler is an asyncio task; the model work runs in a single worker thread (torch releases the
GIL), so the HTTP server keeps answering while a step computes. Request state is only touched on the
event loop, between steps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from harness.engine.metrics import EngineMetrics
from harness.engine.request import Request
from harness.engine.worker import StepOutput, Worker

log = logging.getLogger("harness.engine")


@dataclass
class LifetimeStats:
    """Counters since start or the last /flush_cache (what SGLang's server_info reports)."""

    verify_steps: int = 0  # request-steps of verification
    verify_tokens: int = 0  # tokens those steps emitted (accepted drafts + 1 each)
    generated_tokens: int = 0
    decode_iterations: int = 0
    window_start: float = 0.0  # monotonic start of the current log window
    window_tokens: int = 0

    @property
    def avg_accept_length(self) -> float:
        return self.verify_tokens / self.verify_steps if self.verify_steps else 0.0


class Scheduler:
    """Owns the waiting queue and the running batch; `submit`, `abort`, `flush`, `run`."""

    def __init__(self, worker: Worker, max_running: int, decode_log_interval: int) -> None:
        self.worker = worker
        self.max_running = max_running
        self.decode_log_interval = decode_log_interval
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = LifetimeStats(window_start=time.monotonic())
        self.metrics = EngineMetrics()  # cumulative, never reset: GET /metrics
        self.reported_accept_length = 0.0  # refreshed every decode_log_interval iterations, like SGLang
        self.last_gen_throughput = 0.0
        self.last_progress = time.monotonic()
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-worker")

    # ------------------------------------------------------------------ control

    def submit(self, request: Request) -> None:
        if request.params.max_new_tokens == 0:
            request.finish_now({"type": "length", "length": 0})
            request.publish()
            return
        self.waiting.append(request)
        self._wake.set()

    def abort(self, request: Request, message: str) -> None:
        """Finish a request without more tokens; its slot is freed at the next iteration."""
        if not request.finished:
            request.aborted = True
            request.finish_now({"type": "abort", "message": message})
            self._wake.set()

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def flush(self) -> bool:
        """Reset the lifetime counters when idle (SGLang's flush_cache); False when busy."""
        if self.busy:
            return False
        self.stats = LifetimeStats(window_start=time.monotonic())
        self.reported_accept_length = 0.0
        self.last_gen_throughput = 0.0
        return True

    def shutdown(self) -> None:
        for r in list(self.waiting) + self.running:
            self.abort(r, "server shutting down")
            r.publish()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        while True:
            if not self.busy:
                self._wake.clear()
                await self._wake.wait()
            self._drop_aborted()
            new = self._admit()
            if new:
                await self._step(new, prefill=True)
            ongoing = [r for r in self.running if not r.finished and all(r is not n for n in new)]
            if ongoing:
                await self._step(ongoing, prefill=False)
                self._count_iteration()
            self.running = [r for r in self.running if not r.finished]

    def _drop_aborted(self) -> None:
        self.waiting = deque(r for r in self.waiting if not r.finished)
        self.running = [r for r in self.running if not r.finished]

    def _admit(self) -> list[Request]:
        new = []
        while self.waiting and len(self.running) < self.max_running:
            r = self.waiting.popleft()
            r.t_scheduled = time.time()
            self.running.append(r)
            new.append(r)
        return new

    async def _step(self, requests: list[Request], prefill: bool) -> None:
        """One step over `requests`. When it fails, the requests are run again one by one from the same
        generator states, so a request that cannot be computed is aborted alone and its batch neighbours
        go on (with the draws they would have had)."""
        states = [r.generator.get_state() for r in requests]
        fn = self.worker.prefill if prefill else self.worker.decode
        try:
            out = await asyncio.get_running_loop().run_in_executor(
                self._executor, fn, self.worker.batch_input(requests)
            )
        except Exception as e:  # noqa: BLE001  (a failed step fails its request, not the server or the batch)
            if len(requests) == 1:
                log.exception(f"step failed for request {requests[0].rid}; aborting it")
                self.abort(requests[0], f"internal error: {type(e).__name__}: {e}")
                requests[0].publish()
                return
            log.warning(
                f"a step over {len(requests)} requests failed ({type(e).__name__}: {e}); running them one by one"
            )
            for r, state in zip(requests, states, strict=True):
                r.generator.set_state(state)
            for r in requests:
                await self._step([r], prefill)
            return
        self._apply(requests, out, prefill)

    def _apply(self, requests: list[Request], out: StepOutput, prefill: bool) -> None:
        for i, r in enumerate(requests):
            if r.finished:  # aborted while the step ran
                continue
            tokens = out.tokens[i]
            if out.num_accepted is not None and r.spec is not None:
                r.spec.record(out.num_accepted[i])
                self.stats.verify_steps += 1
                self.stats.verify_tokens += len(tokens)
                drafted = out.num_drafted[i] if out.num_drafted is not None else 0
                self.metrics.verify_step(drafted, out.num_accepted[i])
            before = len(r.output_ids)
            r.extend(tokens)
            self.stats.generated_tokens += len(r.output_ids) - before
            self.stats.window_tokens += len(r.output_ids) - before
            self.metrics.output_tokens.inc(len(r.output_ids) - before)
            if r.finished:
                self.metrics.requests.inc()
            r.publish()
        self.last_progress = time.monotonic()

    def _count_iteration(self) -> None:
        self.stats.decode_iterations += 1
        if self.stats.decode_iterations % self.decode_log_interval:
            return
        now = time.monotonic()
        self.last_gen_throughput = self.stats.window_tokens / max(now - self.stats.window_start, 1e-9)
        self.reported_accept_length = self.stats.avg_accept_length
        spec = f"accept len: {self.reported_accept_length:.2f}, " if self.stats.verify_steps else ""
        log.info(
            f"Decode batch. #running-req: {len(self.running)}, {spec}"
            f"gen throughput (token/s): {self.last_gen_throughput:.2f}, #queue-req: {len(self.waiting)}"
        )
        self.stats.window_start, self.stats.window_tokens = now, 0
