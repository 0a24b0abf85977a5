"""The implementations the microbenchmark can time: a registry whose error lists the valid names.

Every implementation is prepared once per batch (its per-row sampling parameters bound outside the
timed region) into a call `logits [rows, vocab] -> probs [rows, vocab] fp32`:
- `full_vocab`, `topk_first`, `topk_first_torch`: the project's builders (`harness.verify`);
- `sglang`: SGLang's own builder through a small adapter, when sglang imports; otherwise it is
  reported as skipped with the reason.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
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


def sglang_sampling_info(p: RowParams) -> SimpleNamespace:
    """The fields of SGLang's SamplingBatchInfo that its verify-probability builder reads, filled as
    SGLang 0.5.23 fills them for one request per entry of `p`.

    Normalisation (SamplingParams.__post_init__): temperature < 1e-6 becomes temperature 1, top_k 1;
    top_k -1 becomes 1 << 30 (the project also reads 0 as the whole vocabulary; SGLang refuses it);
    any other top_k is kept as it is, even when >= the vocabulary. Flags (from_schedule_batch):
    need_top_k_sampling = any top_k != 1 << 30, need_top_p_sampling = any top_p != 1,
    is_all_greedy = every top_k <= 1, max_top_k = the largest top_k when every one is in
    [1, 1 << 30), else None. temperatures: [bs, 1] fp32; top_ks: [bs] int32; top_ps: [bs] fp32.
    """
    greedy = p.temperature < verify.GREEDY_TEMPERATURE  # [bs]
    top_k = torch.where(p.top_k <= 0, SGLANG_TOP_K_ALL, p.top_k.long())
    top_k = torch.where(greedy, torch.ones_like(top_k), top_k)
    temperature = torch.where(greedy, torch.ones_like(p.temperature), p.temperature)
    bounded = bool(((top_k >= 1) & (top_k < SGLANG_TOP_K_ALL)).all())
    return SimpleNamespace(
        temperatures=temperature.float().reshape(-1, 1),
        top_ks=top_k.to(torch.int32),
        top_ps=p.top_p.float(),
        is_all_greedy=bool((top_k <= 1).all()),
        need_top_p_sampling=bool((p.top_p != 1.0).any()),
        need_top_k_sampling=bool((top_k != SGLANG_TOP_K_ALL).any()),
        need_min_p_sampling=False,
        max_top_k=int(top_k.max()) if bounded and top_k.numel() else None,
    )


def dflash_top_k_hints(top_ks: Tensor) -> tuple[int, int | None]:
    """(max_top_k, uniform_top_k_value) as SGLang's DFLASH verify step computes them from the
    normalised per-request top_k (dflash_info_v2): the largest (at least 1, not clamped to the
    vocabulary), and the common value when every request has the same one, else None."""
    values = [int(k) for k in top_ks.tolist()]
    uniform = values[0] if values and all(k == values[0] for k in values) else None
    return max([1, *values]), uniform


def sglang_kwargs(fn: Callable, logits: Tensor, p: RowParams, draft_token_num: int = 1) -> dict[str, Any]:
    """Keyword arguments for SGLang's builder, chosen by its signature.

    logits: [bs * draft_token_num, V]; p: one entry per request ([bs] each), which SGLang repeats
    draft_token_num times per request. Raises TypeError when the signature has a required parameter
    this adapter does not know, ValueError when the shapes do not fit.
    """
    rows = logits.shape[0]
    bs = p.temperature.shape[0]
    if draft_token_num < 1 or bs * draft_token_num != rows:
        raise ValueError(f"{rows} logit rows for {bs} requests x draft_token_num={draft_token_num}")
    info = sglang_sampling_info(p)
    max_top_k, uniform = dflash_top_k_hints(info.top_ks)
    known = {
        "next_token_logits": logits,
        "sampling_info": info,
        "draft_token_num": draft_token_num,
        "bs": bs,
        "max_top_k": max_top_k,
        "uniform_top_k_value": uniform,
        "use_sparse_topk": True,
    }
    params = inspect.signature(fn).parameters
    unknown = [
        n
        for n, q in params.items()
        if n not in known and q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)
    ]
    if unknown:
        raise TypeError(f"{fn.__qualname__}{inspect.signature(fn)}: the adapter does not know {unknown}")
    return {n: v for n, v in known.items() if n in params}


def sglang_call(fn: Callable, p: RowParams, draft_token_num: int = 1) -> Call:
    """Bind SGLang's builder to the request parameters: logits [bs * draft_token_num, V] -> probs
    [bs * draft_token_num, V] fp32 (SGLang returns [bs, draft_token_num, V]).

    The sampling_info and keyword arguments are built once per input shape, outside the timed calls.
    """
    cache: dict[tuple, dict[str, Any]] = {}

    def call(logits: Tensor) -> Tensor:
        key = (tuple(logits.shape), logits.device)
        if key not in cache:
            cache[key] = sglang_kwargs(fn, logits, p, draft_token_num)
        kwargs = dict(cache[key], next_token_logits=logits)
        return fn(**kwargs).reshape(logits.shape)

    return call


def _sglang_skipped(note: str, **info: Any) -> Impl:
    return Impl(name="sglang", prepare=None, note=note, external=True, info=info)


# What a missing module is, for the skip note (a CUDA host imports these where a CPU one does not)
MISSING_MODULE_HINTS = {"sgl_kernel": "SGLang's compiled CUDA kernel wheel"}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _import_failure(what: str, exc: BaseException) -> str:
    """Why `what` does not import, in one line: the missing module by name, else the first line."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        hint = MISSING_MODULE_HINTS.get(top)
        return f"{what} needs the module {exc.name!r}, which is not installed" + (f" ({hint})" if hint else "")
    return f"{what} does not import ({_first_line(exc)})"


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_sglang_builder() -> tuple[Callable | None, str]:
    """SGLang's verify-probability builder and its qualified name, or (None, why it is skipped)."""
    version, sglang_module = _installed_version("sglang"), "sglang"
    try:
        sglang = importlib.import_module(sglang_module)
    except ImportError as exc:
        if version is None or isinstance(exc, ModuleNotFoundError) and exc.name == sglang_module:
            return None, "sglang not installed: skipped"
        return None, f"sglang {version} installed but {_import_failure('sglang', exc)}: skipped"
    except Exception as exc:  # noqa: BLE001  (SGLang's import probes the device: any failure means skipped)
        return None, f"sglang {version or '?'} installed but {_import_failure('sglang', exc)}: skipped"
    version = getattr(sglang, "__version__", version or "?")
    try:
        module = importlib.import_module(SGLANG_MODULE)
    except Exception as exc:  # noqa: BLE001  (any failure to import means: cannot benchmark it)
        return None, f"sglang {version} installed but {_import_failure(SGLANG_MODULE, exc)}: skipped"
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
    **{name: functools.partial(_project_impl, name) for name in verify.BUILDERS},
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
