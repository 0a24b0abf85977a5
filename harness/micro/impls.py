"""The implementations the microbenchmark can time: a registry whose error lists the valid names.

Every implementation is prepared once per batch (its per-row sampling parameters bound outside the
timed region) into a call `logits [rows, vocab] -> probs [rows, vocab] fp32`:
- `full_vocab`, `topk_first`, `topk_first_torch`: the project's builders (`harness.verify`);
- `sglang`: SGLang's own builder through a small adapter, when sglang imports; otherwise it is
  reported as skipped with the reason.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from harness import verify
from harness.micro.inputs import RowParams

Call = Callable[[Tensor], Tensor]
Prepare = Callable[[RowParams], Call]

SGLANG_MODULE = "sglang.srt.speculative.dflash_utils"
SGLANG_FUNCTIONS = ("build_speculative_verify_target_probs", "build_dflash_verify_target_probs")
SGLANG_TOP_K_ALL = 1 << 30  # SGLang's top_k for "the whole vocabulary"


class ImplError(ValueError):
    """An unknown implementation name; the message lists the valid ones."""


@dataclass(frozen=True)
class Impl:
    """One implementation: `prepare` binds the per-row parameters; None when unavailable (skipped)."""

    name: str
    prepare: Prepare | None
    note: str = ""
    external: bool = False  # not the project's code: its failures are recorded, not raised
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return self.prepare is not None


def _project_impl(name: str) -> Impl:
    builder = verify.get_builder(name)

    def prepare(p: RowParams) -> Call:
        return lambda logits: builder(logits, p.temperature, p.top_k, p.top_p)

    return Impl(name=name, prepare=prepare)


# ---------------------------------------------------------------------------------------------
# SGLang adapter
# ---------------------------------------------------------------------------------------------


def sglang_sampling_info(p: RowParams, vocab: int) -> SimpleNamespace:
    """The fields of SGLang's SamplingBatchInfo that its verify-probability builder reads.

    Greedy rows become temperature 1, top_k 1 (as SGLang normalises them); top_k <= 0 or >= vocab
    becomes SGLang's "whole vocabulary" value. temperatures: [bs, 1]; top_ks, top_ps: [bs].
    """
    greedy = (p.temperature <= verify.GREEDY_TEMPERATURE) | (p.top_k == 1)
    top_k = torch.where((p.top_k <= 0) | (p.top_k >= vocab), SGLANG_TOP_K_ALL, p.top_k)
    top_k = torch.where(greedy, torch.ones_like(top_k), top_k)
    temperature = torch.where(greedy, torch.ones_like(p.temperature), p.temperature)
    return SimpleNamespace(
        temperatures=temperature.float().unsqueeze(-1),
        top_ks=top_k.to(torch.int32),
        top_ps=p.top_p.float(),
        need_top_k_sampling=bool((top_k < vocab).any()),
        need_top_p_sampling=bool((p.top_p < 1.0).any()),
        need_min_p_sampling=False,
        is_all_greedy=bool(greedy.all()),
    )


def sglang_kwargs(fn: Callable, logits: Tensor, p: RowParams) -> dict[str, Any]:
    """Keyword arguments for SGLang's builder, chosen by its signature (draft_token_num = 1).

    Raises TypeError when the signature has a required parameter this adapter does not know.
    """
    rows, vocab = logits.shape
    info = sglang_sampling_info(p, vocab)
    k = info.top_ks.clamp(max=vocab)
    known = {
        "next_token_logits": logits,
        "sampling_info": info,
        "draft_token_num": 1,
        "bs": rows,
        "max_top_k": int(k.max()),
        "uniform_top_k_value": int(k[0]) if bool((k == k[0]).all()) else None,
        "use_sparse_topk": True,
    }
    params = inspect.signature(fn).parameters
    unknown = [n for n, q in params.items() if n not in known and q.default is inspect.Parameter.empty
               and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
    if unknown:
        raise TypeError(f"{fn.__qualname__}{inspect.signature(fn)}: the adapter does not know {unknown}")
    return {n: v for n, v in known.items() if n in params}


def sglang_call(fn: Callable, p: RowParams) -> Call:
    """Bind SGLang's builder to the row parameters: logits [rows, V] -> probs [rows, V].

    The sampling_info and keyword arguments are built once per batch size, outside the timed calls.
    """
    cache: dict[tuple, dict[str, Any]] = {}

    def call(logits: Tensor) -> Tensor:
        key = (tuple(logits.shape), logits.device)
        if key not in cache:
            cache[key] = sglang_kwargs(fn, logits, p)
        kwargs = dict(cache[key], next_token_logits=logits)
        return fn(**kwargs).reshape(logits.shape)

    return call


def _sglang_skipped(note: str, **info: Any) -> Impl:
    return Impl(name="sglang", prepare=None, note=note, external=True, info=info)


def load_sglang_builder() -> tuple[Callable | None, str]:
    """SGLang's verify-probability builder and its qualified name, or (None, why it is skipped)."""
    try:
        sglang = importlib.import_module("sglang")
    except ImportError:
        return None, "sglang not installed: skipped"
    version = getattr(sglang, "__version__", "?")
    try:
        module = importlib.import_module(SGLANG_MODULE)
    except Exception as exc:  # noqa: BLE001  (any failure to import means: cannot benchmark it)
        return None, f"sglang {version} installed but {SGLANG_MODULE} does not import ({type(exc).__name__}: {exc}): skipped"
    for name in SGLANG_FUNCTIONS:
        fn = getattr(module, name, None)
        if callable(fn):
            return fn, f"{SGLANG_MODULE}.{name}"
    return None, f"sglang {version}: {SGLANG_MODULE} has none of {', '.join(SGLANG_FUNCTIONS)}: skipped"


def _sglang_impl() -> Impl:
    fn, what = load_sglang_builder()
    if fn is None:
        return _sglang_skipped(what)
    info = {"function": what, "signature": str(inspect.signature(fn))}
    return Impl(name="sglang", prepare=lambda p: sglang_call(fn, p), note=what, external=True, info=info)


REGISTRY: dict[str, Callable[[], Impl]] = {
    **{name: (lambda n=name: _project_impl(n)) for name in verify.BUILDERS},
    "sglang": _sglang_impl,
}


def check_names(names: list[str]) -> None:
    """Raise ImplError naming the first unknown implementation and listing the valid names."""
    for name in names:
        if name not in REGISTRY:
            raise ImplError(f"unknown micro implementation {name!r}; valid: {', '.join(REGISTRY)}")


def resolve_impls(names: list[str]) -> list[Impl]:
    """The implementations called `names`, in order; unavailable ones come back with prepare=None."""
    check_names(names)
    return [REGISTRY[name]() for name in names]
