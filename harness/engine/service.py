"""The engine as the HTTP layer sees it: start-up, request creation, health, server and model info."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from harness.engine.args import ServerArgs
from harness.engine.hf_tokenizer import publish_tokenizer
from harness.engine.model import SyntheticLM
from harness.engine.params import BadRequest, PromptSpec, SamplingParams
from harness.engine.request import Request, SpecCounters
from harness.engine.scheduler import Scheduler
from harness.engine.tokenizer import TextTokenizer, Tokenizer
from harness.engine.worker import Worker, WorkerConfig
from harness.host.devices import resolve_device
from harness.models.presets import ModelPreset, get_preset
from harness.models.real import RealLM, is_real

log = logging.getLogger("harness.engine")

READY_LINE = "The server is fired up and ready to roll!"
VERSION = "specbench-embedded 0.1.0"
HEALTH_TIMEOUT_S = 20.0


OFF_LOOP_CHARS = 1 << 16  # a prompt longer than this is tokenized off the event loop


class EngineService:
    """Everything behind the routes. `status` is 'starting' until `start` has built and warmed up."""

    def __init__(self, args: ServerArgs) -> None:
        self.args = args
        self.preset: ModelPreset | None = (
            None if is_real(args.model_path) else get_preset(args.model_path, args.vocab_size)
        )
        self.real: RealLM | None = None  # the real model, once loaded
        # a real model's tokenizer comes with the model (start); until then nothing is served but health and info
        self.tokenizer: TextTokenizer = Tokenizer(self.preset.vocab_size if self.preset else 3)
        self.status = "starting"
        self.device: torch.device | None = None
        self.scheduler: Scheduler | None = None
        self.tokenizer_dir: Path | None = None  # the Hugging Face tokenizer folder, once published
        self._seeds = random.Random(args.random_seed)
        self._loop_task: asyncio.Task | None = None

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def running(self) -> Scheduler:
        """The scheduler: set in `start` before the warm-up, so whenever the service is ready."""
        assert self.scheduler is not None, "EngineService.start() first"
        return self.scheduler

    # ------------------------------------------------------------------ start-up

    async def start(self) -> None:
        """Build the model (in a thread, so /health_generate answers 503 meanwhile), warm up, go ready."""
        if self.args.num_threads:
            torch.set_num_threads(self.args.num_threads)
        self.device = device = resolve_device(self.args.device, "--device")
        log.info(f"Verify path {self.args.verify_path}, verify-probability builder {self.args.verify_probs_builder}")
        config = WorkerConfig(
            gamma=self.args.gamma,
            draft_mode=self.args.draft_mode,
            block_verification=self.args.block_verification,
            builder=self.args.verify_probs_builder,
            verify_path=self.args.verify_path,
            deterministic=self.args.enable_deterministic_inference,
        )
        worker = await (self._synthetic(config, device) if self.preset else self._real(config, device))
        self.scheduler = Scheduler(worker, self.args.max_running_requests, self.args.decode_log_interval)
        self._loop_task = asyncio.create_task(self.scheduler.run())
        await self._warmup()
        self.scheduler.flush()
        self.status = "ready"
        log.info(READY_LINE)

    async def _synthetic(self, config: WorkerConfig, device: torch.device) -> Worker:
        assert self.preset is not None
        self.tokenizer_dir = await asyncio.to_thread(self._publish_tokenizer, self.preset)
        t0 = time.monotonic()
        model = await asyncio.to_thread(SyntheticLM.build, self.preset, self.args.draft_divergence, device)
        log.info(
            f"Model {self.args.model_path} built in {time.monotonic() - t0:.2f}s on {device} "
            f"(vocab {self.preset.vocab_size}, hidden {self.preset.hidden}, draft hidden "
            f"{self.preset.draft_hidden}, torch threads {torch.get_num_threads()})"
        )
        return Worker(model, config)

    async def _real(self, config: WorkerConfig, device: torch.device) -> Worker:
        from harness.engine.real_worker import RealWorker  # noqa: PLC0415

        t0 = time.monotonic()
        real = await asyncio.to_thread(
            RealLM.load, self.args.model_path, self.args.dtype, device, self.args.draft_layers
        )
        self.real, self.tokenizer, self.tokenizer_dir = real, real.tokenizer, real.folder
        log.info(
            f"Model {self.args.model_path} loaded in {time.monotonic() - t0:.2f}s on {device} from "
            f"{real.folder} ({real.num_layers} layers, vocab {real.vocab_size}, {real.dtype}, draft: the first "
            f"{real.draft_layers} layers, torch threads {torch.get_num_threads()})"
        )
        return RealWorker(real, config)

    @property
    def context_length(self) -> int:
        if self.preset is not None:
            return self.preset.context_length
        assert self.real is not None, "the real model is loaded in start()"
        return self.real.context_length

    def _publish_tokenizer(self, preset: ModelPreset) -> Path | None:
        """The Hugging Face tokenizer folder for /model_info's tokenizer_path (None: none, say why)."""
        keep = f"/model_info keeps tokenizer_path={self.args.model_path}"
        stem = f"{preset.name}-v{preset.vocab_size}"
        assert isinstance(self.tokenizer, Tokenizer)
        try:
            path = publish_tokenizer(self.tokenizer, preset.context_length, stem, os.environ)
        except OSError as e:
            log.warning(f"Hugging Face tokenizer folder not written ({e}); {keep}")
            return None
        if path is None:
            log.info(
                f"No Hugging Face tokenizer folder: a vocabulary of {preset.vocab_size} (< 257) writes "
                f"each byte as several digit tokens, which tokenizer.json cannot express; {keep}"
            )
        else:
            log.info(f"Hugging Face tokenizer folder (tokenizer_path): {path}")
        return path

    @property
    def tokenizer_path(self) -> str:
        return str(self.tokenizer_dir) if self.tokenizer_dir is not None else self.args.model_path

    async def _warmup(self) -> None:
        params = SamplingParams(max_new_tokens=4, temperature=1.0, ignore_eos=True)
        req = self.new_request(self.tokenizer.encode("warm up"), params, stream=False, rid="warmup")
        self.running.submit(req)
        while not (await req.events.get()).finished:
            pass
        reason = req.finish_reason or {}
        if reason.get("type") == "abort":  # every request would fail the same way: never report ready
            raise RuntimeError(f"the warm-up request failed: {reason.get('message')}")

    async def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown()
        if self._loop_task is not None:
            self._loop_task.cancel()

    # ------------------------------------------------------------------ requests

    async def prompt_ids_async(self, prompt: PromptSpec) -> list[int]:
        """prompt_ids; a long text is tokenized in a thread, so that the server keeps answering meanwhile (a
        60-million-character prompt took 24 s, /health waiting behind it)."""
        if prompt.text is not None and len(prompt.text) > OFF_LOOP_CHARS:
            return await asyncio.to_thread(self.prompt_ids, prompt)
        return self.prompt_ids(prompt)

    def prompt_ids(self, prompt: PromptSpec) -> list[int]:
        """Token ids of a prompt, validated against the vocabulary and the context length."""
        if prompt.input_ids is not None:
            try:
                self.tokenizer.check_ids(prompt.input_ids)
            except ValueError as e:
                raise BadRequest(str(e)) from None
            ids = list(prompt.input_ids)
        else:
            assert prompt.text is not None  # PromptSpec: text or ids, exactly one
            try:
                ids = self.tokenizer.encode(prompt.text)
            except UnicodeEncodeError as e:
                raise BadRequest(f"text is not valid Unicode: {e}") from None
        limit = self.context_length
        if len(ids) + prompt.params.max_new_tokens > limit:
            raise BadRequest(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({prompt.params.max_new_tokens}) "
                f"exceeds the model's context length {limit}"
            )
        return ids

    def check_rids(self, requests: list[Request]) -> None:
        """BadRequest when a request's id is one of a request in flight, or twice in `requests` (as SGLang)."""
        taken = {r.rid for r in self.running.waiting} | {r.rid for r in self.running.running if not r.finished}
        seen: set[str] = set()
        for r in requests:
            if r.rid in taken or r.rid in seen:
                raise BadRequest(f"Duplicate request ID detected: rid {r.rid!r} is in flight")
            seen.add(r.rid)

    def new_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        stream: bool,
        rid: str | None,
        health_check: bool = False,
    ) -> Request:
        """A request with its own generator: seeded by `sampling_seed` only in deterministic mode."""
        seed = params.sampling_seed if self.args.enable_deterministic_inference else None
        if seed is None:
            seed = self._seeds.getrandbits(63)
        generator = torch.Generator(device=self.device).manual_seed(fold_seed(seed))
        spec = SpecCounters(self.args.gamma) if self.args.speculative else None
        return Request(
            rid=rid or uuid.uuid4().hex,
            prompt_ids=prompt_ids,
            params=params,
            generator=generator,
            tokenizer=self.tokenizer,
            spec=spec,
            stream=stream,
            enable_metrics=self.args.enable_metrics,
            health_check=health_check,
        )

    # ------------------------------------------------------------------ health and info

    async def health_generate(self) -> bool:
        """True when a one-token generation completes, or any request makes progress meanwhile."""
        if not self.ready:
            return False
        start = time.monotonic()
        params = SamplingParams(max_new_tokens=1, temperature=0.0)
        req = self.new_request(
            [self.tokenizer.eos_id], params, stream=False, rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", health_check=True
        )
        scheduler = self.running
        scheduler.submit(req)
        while time.monotonic() - start < HEALTH_TIMEOUT_S:
            if req.finished or scheduler.last_progress > start:
                if not req.finished:
                    scheduler.abort(req, "health check answered by other progress")
                return True
            await asyncio.sleep(0.01)
        scheduler.abort(req, "health check timed out")
        return False

    def server_info(self) -> dict[str, Any]:
        info = self.args.to_dict()
        info["device"] = str(self.device) if self.device is not None else self.args.device
        info["tokenizer_path"] = self.tokenizer_path
        info["internal_states"] = [self._internal_state()]
        info["version"] = VERSION
        info["status"] = self.status
        return info

    def _internal_state(self) -> dict[str, Any]:
        """As SGLang's scheduler: `avg_spec_accept_length` (tokens per verify step, lifetime since start or
        /flush_cache, as of the last --decode-log-interval boundary) only once an interval has closed."""
        sched = self.scheduler
        state = {
            "last_gen_throughput": sched.last_gen_throughput if sched else 0.0,
            "num_running_reqs": len(sched.running) if sched else 0,
            "num_queue_reqs": len(sched.waiting) if sched else 0,
        }
        if self.args.speculative and sched is not None and sched.reported_accept_length > 0:
            state["avg_spec_accept_length"] = sched.reported_accept_length
        return state

    @property
    def model_loaded(self) -> bool:
        """A preset is known at once; a real model once start() has loaded it (before: its sizes are null)."""
        return self.preset is not None or self.real is not None

    def model_info(self) -> dict[str, Any]:
        loaded = self.model_loaded
        info = {
            "model_path": self.args.model_path,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "vocab_size": self.tokenizer.vocab_size if loaded else None,
            "context_length": self.context_length if loaded else None,
            "eos_token_id": self.tokenizer.eos_id if loaded else None,
        }
        if self.preset is not None:
            p = self.preset
            info["embedded"] = {
                "hidden": p.hidden,
                "draft_hidden": p.draft_hidden,
                "context_window": p.context_window,
                "weight_seed": p.weight_seed,
                "draft_divergence": self.args.draft_divergence,
            }
        elif self.real is not None:
            info["real"] = {
                **self.real.provenance,
                "layers": self.real.num_layers,
                "draft_layers": self.real.draft_layers,
                "folder": str(self.real.folder),
            }
        return info

    def models_list(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.args.model_path,
                    "object": "model",
                    "created": 0,
                    "owned_by": "sglang",
                    "root": self.args.model_path,
                    "max_model_len": self.context_length if self.model_loaded else None,
                }
            ],
        }


def fold_seed(seed: int) -> int:
    """A 64-bit request seed folded to 32 bits, both halves mixed in.

    torch's CPU generator (mt19937) keeps only the low 32 bits of a seed, so seeds that differ only
    above bit 31 (an arm's `seed_stream`, 2**32 apart) would sample the same tokens; SGLang's sampling
    hash mixes both halves. Seeds in [0, 2**32) are unchanged.
    """
    u = seed & (2**64 - 1)
    return (u & 0xFFFFFFFF) ^ (((u >> 32) * 0x9E3779B1) & 0xFFFFFFFF)
