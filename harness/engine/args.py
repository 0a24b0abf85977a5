"""Command-line flags of `python -m harness.engine`: SGLang's names for what it implements, plus its own.

Unknown flags, abbreviations and invalid values fail at start with a message (exit status 2).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass

import torch

from harness.models.files import SHIPPED
from harness.models.presets import PresetError, get_preset, preset_names
from harness.models.real import DTYPES, is_real
from harness.verify import BUILDERS

ALGORITHMS = ("NONE", "DFLASH", "DSPARK")
SGLANG_ONLY_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
DRAFT_MODES = ("greedy", "sampled")
VERIFY_PATHS = ("dense", "sparse")
DEFAULT_NUM_DRAFT_TOKENS = 8  # gamma = 7, the block of the seed experiments' DFlash drafter


@dataclass(frozen=True)
class ServerArgs:
    """The resolved server arguments; `/server_info` returns them under these (SGLang) names."""

    model_path: str
    host: str
    port: int
    speculative_algorithm: str | None  # None = no speculative decoding (NONE)
    speculative_num_draft_tokens: int | None  # gamma + 1; None without an algorithm
    speculative_draft_model_path: str | None
    speculative_use_block_verification: bool
    max_running_requests: int
    random_seed: int
    enable_deterministic_inference: bool
    enable_metrics: bool
    decode_log_interval: int
    disable_radix_cache: bool
    tp_size: int
    device: str  # auto | cpu | cuda (auto is resolved when the model is built)
    log_level: str
    incremental_streaming_output: bool
    draft_mode: str  # greedy | sampled
    draft_divergence: float
    verify_probs_builder: str
    verify_path: str  # dense | sparse
    vocab_size: int | None  # the preset's; None for a real model (its config says)
    num_threads: int | None
    draft_layers: int | None = None  # a real model's early-exit draft depth (None: all layers but 2, or a preset)
    dtype: str = "auto"

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def gamma(self) -> int:
        """Draft tokens per verify step (0 without speculative decoding)."""
        return self.speculative_num_draft_tokens - 1 if self.speculative_num_draft_tokens else 0

    @property
    def sampling_enabled(self) -> bool:
        """True when the drafts are sampled from the draft distribution (not argmax)."""
        return self.speculative and self.draft_mode == "sampled"

    @property
    def block_verification(self) -> bool:
        return self.speculative and self.speculative_use_block_verification

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sampling_backend"] = "pytorch"
        d["sampling_enabled"] = self.sampling_enabled
        return d

    def describe(self) -> str:
        """One line with every resolved value (the start-up log line log checks look at)."""
        items = {**self.to_dict(), "gamma": self.gamma}
        return " ".join(f"{k}={v}" for k, v in items.items())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.engine",
        allow_abbrev=False,
        description="Embedded reference speculative-decoding server speaking SGLang's HTTP protocol.",
    )
    p.add_argument(
        "--model-path",
        required=True,
        help=f"an embedded preset ({', '.join(preset_names())}), a real model ({', '.join(SHIPPED)}), "
        "a .gguf file or a Hugging Face model folder",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", default=None, help=f"one of {', '.join(ALGORITHMS)}")
    p.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        help=f"tokens per verify step, gamma + 1 (default {DEFAULT_NUM_DRAFT_TOKENS})",
    )
    p.add_argument(
        "--speculative-dflash-block-size",
        type=int,
        default=None,
        help="DFLASH only (as SGLang: ignored for another algorithm): the verify window, an alias of the above",
    )
    p.add_argument(
        "--speculative-dspark-block-size",
        type=int,
        default=None,
        help="DSPARK only (as SGLang: ignored for another algorithm): gamma, the draft tokens; the verify "
        "window is gamma + 1",
    )
    p.add_argument(
        "--speculative-draft-model-path",
        default=None,
        help="the draft is part of each preset: if given, the same preset as --model-path",
    )
    p.add_argument(
        "--speculative-use-block-verification",
        action="store_true",
        help="block verification (Sun et al.) instead of token-wise",
    )
    p.add_argument("--max-running-requests", type=int, default=32)
    p.add_argument("--random-seed", type=int, default=None, help="server RNG seed (default: random)")
    p.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="honour sampling_seed; batch-invariant computation",
    )
    p.add_argument("--enable-metrics", action="store_true", help="queue_time and timestamps in meta_info")
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--disable-radix-cache", action="store_true", help="accepted; there is no prefix cache")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument(
        "--incremental-streaming-output", action="store_true", help="stream chunks carry only the new text/output_ids"
    )
    p.add_argument(
        "--draft-mode",
        default="greedy",
        choices=DRAFT_MODES,
        help="greedy: argmax drafts (point masses); sampled: drawn from the draft distribution",
    )
    p.add_argument(
        "--draft-divergence",
        type=float,
        default=None,
        help="std (nats) of the draft's own logit noise; higher = lower acceptance (default: the preset's)",
    )
    p.add_argument(
        "--verify-probs-builder",
        default="full_vocab",
        choices=tuple(BUILDERS),
        help="how temperature/top-k/top-p turn target logits into probabilities",
    )
    p.add_argument(
        "--verify-path",
        default="dense",
        choices=VERIFY_PATHS,
        help="dense: the builder's [rows, V] target probabilities and the dense verifiers; sparse: "
        "each row's top-k entries only (harness.verify.sparse.verify_step), the sparse verifiers "
        "(with --verify-probs-builder topk_fused on CUDA: the fused kernels and the verify kernel)",
    )
    p.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary size")
    p.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument(
        "--draft-layers",
        type=int,
        default=None,
        help="a real model's draft: its first L layers, final norm and LM head (default: all but the last "
        "2; `python -m harness.engine.draft_depth` measures the acceptance per depth)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=tuple(DTYPES),
        help="a real model's weights: auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16",
    )
    return p


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    """Parse and resolve the flags; argparse exits with status 2 and a message on any error."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return _resolve(ns)
    except (ValueError, PresetError) as e:
        parser.error(str(e))
    raise AssertionError("unreachable")


def _resolve(ns: argparse.Namespace) -> ServerArgs:
    real = is_real(ns.model_path)
    preset = None if real else get_preset(ns.model_path, ns.vocab_size)
    draft_layers = _real_flags(ns, real)
    algorithm = _algorithm(ns.speculative_algorithm)
    num_draft = _num_draft_tokens(ns, algorithm)
    if ns.speculative_use_block_verification and algorithm is None:
        raise ValueError(
            "--speculative-use-block-verification needs --speculative-algorithm DFLASH or DSPARK "
            "(SGLang refuses it without one)"
        )
    if ns.speculative_draft_model_path not in (None, ns.model_path):
        raise ValueError(
            f"--speculative-draft-model-path {ns.speculative_draft_model_path!r}: the embedded server "
            f"drafts with the model itself; give {ns.model_path!r} or leave it out"
        )
    _check_positive(max_running_requests=ns.max_running_requests, decode_log_interval=ns.decode_log_interval)
    if ns.tp_size != 1:
        raise ValueError(f"--tp-size {ns.tp_size}: the embedded server runs on one device (use 1)")
    if not 0 <= ns.port < 65536:
        raise ValueError(f"--port {ns.port} is out of range")
    divergence = ns.draft_divergence if ns.draft_divergence is not None else preset.draft_divergence if preset else 0.0
    if not 0 <= divergence <= MAX_DIVERGENCE:  # (NaN fails both; infinity would make the draft's logits NaN)
        raise ValueError(
            f"--draft-divergence {divergence} must be in [0, {MAX_DIVERGENCE:g}] (nats of the draft's "
            "noise; the presets use 0.5 to 1.5)"
        )
    if ns.num_threads is not None:
        _check_positive(num_threads=ns.num_threads)
    if ns.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (use --device cpu or auto)")
    seed = ns.random_seed if ns.random_seed is not None else int.from_bytes(os.urandom(4), "little") >> 1
    return ServerArgs(
        model_path=ns.model_path,
        host=ns.host,
        port=ns.port,
        speculative_algorithm=algorithm,
        speculative_num_draft_tokens=num_draft,
        speculative_draft_model_path=ns.speculative_draft_model_path,
        speculative_use_block_verification=ns.speculative_use_block_verification,
        max_running_requests=ns.max_running_requests,
        random_seed=seed,
        enable_deterministic_inference=ns.enable_deterministic_inference,
        enable_metrics=ns.enable_metrics,
        decode_log_interval=ns.decode_log_interval,
        disable_radix_cache=ns.disable_radix_cache,
        tp_size=ns.tp_size,
        device=ns.device,
        log_level=ns.log_level,
        incremental_streaming_output=ns.incremental_streaming_output,
        draft_mode=ns.draft_mode,
        draft_divergence=divergence,
        verify_probs_builder=ns.verify_probs_builder,
        verify_path=ns.verify_path,
        vocab_size=preset.vocab_size if preset else None,
        num_threads=ns.num_threads,
        draft_layers=draft_layers,
        dtype=ns.dtype,
    )


def _real_flags(ns: argparse.Namespace, real: bool) -> int | None:
    """The draft depth of a real model (None: its default); the flags only a real model takes are refused for a
    preset."""
    if not real:
        for flag, value, default in (("--draft-layers", ns.draft_layers, None), ("--dtype", ns.dtype, "auto")):
            if value != default:
                raise ValueError(
                    f"{flag} {value}: only a real model takes it; {ns.model_path} is an embedded preset "
                    f"(its weights are exact integers and it carries its own draft)"
                )
        return None
    if ns.vocab_size is not None:
        raise ValueError(f"--vocab-size {ns.vocab_size}: a real model's vocabulary is its own")
    if ns.draft_divergence is not None:
        raise ValueError("--draft-divergence tunes the synthetic draft; a real model drafts with --draft-layers")
    if ns.draft_layers is not None:
        _check_positive(draft_layers=ns.draft_layers)
    return ns.draft_layers


def _algorithm(value: str | None) -> str | None:
    if value is None or value == "NONE":
        return None
    if value in ALGORITHMS:
        return value
    if value in SGLANG_ONLY_ALGORITHMS:
        raise ValueError(
            f"--speculative-algorithm {value} is SGLang-only; the embedded server implements {', '.join(ALGORITHMS)}"
        )
    raise ValueError(f"--speculative-algorithm {value!r} is not valid; choose one of {', '.join(ALGORITHMS)}")


MAX_DIVERGENCE = 1000.0  # nats: far past any acceptance at all, and finite in float32


def _num_draft_tokens(ns: argparse.Namespace, algorithm: str | None) -> int | None:
    """gamma + 1 (the verify window), from --speculative-num-draft-tokens or the algorithm's own block-size flag,
    as SGLang reads them: DFLASH's block size is the window, DSPARK's is gamma (the window gamma + 1); the other
    algorithm's flag is ignored."""
    if algorithm is None:
        return None
    given = (
        {}
        if ns.speculative_num_draft_tokens is None
        else {"--speculative-num-draft-tokens": ns.speculative_num_draft_tokens}
    )
    if algorithm == "DFLASH" and ns.speculative_dflash_block_size is not None:
        given["--speculative-dflash-block-size"] = ns.speculative_dflash_block_size
    if algorithm == "DSPARK" and (gamma := ns.speculative_dspark_block_size) is not None:
        if gamma < 1:
            raise ValueError(f"--speculative-dspark-block-size {gamma} must be >= 1 (it is gamma, the draft tokens)")
        given["--speculative-dspark-block-size + 1"] = gamma + 1
    if len(set(given.values())) > 1:
        raise ValueError(f"conflicting verify windows: {given}")
    value = next(iter(given.values()), DEFAULT_NUM_DRAFT_TOKENS)
    if value < 2:
        raise ValueError(f"--speculative-num-draft-tokens {value} must be >= 2 (at least one draft token)")
    return value


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if v < 1:
            raise ValueError(f"--{name.replace('_', '-')} {v} must be >= 1")
