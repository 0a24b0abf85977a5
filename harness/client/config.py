"""Typed config of the client group (`configs/client/`) and of the sampling parameters it sends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.validation import ConfigError, check_choice, check_cpus, check_range

MAX_TOP_K = 2**31 - 1  # a 32-bit int, as SGLang's sampling tensors hold it; -1 means the whole vocabulary


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 256
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_range("sampling.temperature", self.temperature, 0)  # 0 = greedy
        check_range("sampling.top_p", self.top_p, 0, 1, low_open=True)
        check_range("sampling.min_p", self.min_p, 0, 1)
        if self.top_k == 0 or self.top_k < -1 or self.top_k > MAX_TOP_K:
            raise ConfigError(f"sampling.top_k={self.top_k} must be -1 (whole vocabulary) or in [1, {MAX_TOP_K}]")
        if self.max_new_tokens < 1:
            raise ConfigError(f"sampling.max_new_tokens={self.max_new_tokens} must be >= 1")


@dataclass
class ClientConfig:
    route: str = "generate"  # generate (SGLang's native) | chat (OpenAI chat completions) | completions (llama.cpp)
    stream: bool = True
    concurrency: int = 8
    request_rate: float | None = None  # requests/s, Poisson arrivals; None = closed loop
    timeout_s: float = 7200.0
    store_output_text: bool = True
    store_output_ids: bool = True  # each response's token ids (the routes that return them): output identity
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # JSON fields added to every request's body, for a server that takes more than the harness sends (e.g.
    # cache_prompt: false for llama-server behind server=openai); a field the harness writes itself is refused
    extra_body: dict[str, Any] = field(default_factory=dict)
    cpus: list[int] = field(default_factory=list)  # pin the runner to these CPUs while it drives; [] = no pinning

    def __post_init__(self) -> None:
        check_choice("client.route", self.route, ("generate", "chat", "completions"))
        check_cpus("client.cpus", self.cpus)
        if self.concurrency < 1:
            raise ConfigError(f"client.concurrency={self.concurrency} must be >= 1")
        if self.request_rate is not None:
            check_range("client.request_rate (requests/s; null for closed loop)", self.request_rate, 0, low_open=True)
        check_range("client.timeout_s", self.timeout_s, 0, low_open=True)
