"""The checks at the entry of the verify API's public functions: a bad argument is a ValueError naming it,
never an error from deep inside torch (or, on CUDA, a device-side assert that ends the process's CUDA context).

What they cost, and so where they run:
- shapes, dtypes, devices, B >= 1 and V >= 1: metadata only, every call, on every device;
- values (draft ids in [0, V), coins in [0, 1), a sparse target's ids in [0, V]): one pass over the small
  [B, G] / [B, G+1] / [B, G+1, K] tensors, and its answer read on the host. On a CPU that is the whole cost;
  on a GPU the read is a synchronisation before any kernel of the step is queued (the host would wait for
  every queued forward), so there they are NOT checked: the caller's contract (docs/verify_api.md). The torch
  sparse verifiers still never emit a draft id outside [0, V) on any device (a draft outside the vocabulary
  is never accepted, whatever its coin); the dense verifiers index with the ids (on CUDA an id outside
  [0, V) is torch's device-side assert).
"""

from __future__ import annotations

import torch
from torch import Tensor


def values_checked(t: Tensor) -> bool:
    """Whether value checks run for tensors on t's device: on a CPU, where reading the answer costs no
    synchronisation."""
    return t.device.type == "cpu"


def check_tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch tensor, got {type(x).__name__}")
    return x


def check_vocab(name: str, vocab: int) -> None:
    if vocab < 1:
        raise ValueError(f"{name} has a vocabulary of {vocab} ids: a distribution needs at least one token")


def check_logits(logits: object) -> Tensor:
    """logits [rows, V], V >= 1 (rows may be 0: an empty batch gives an empty result)."""
    x = check_tensor("logits", logits)
    if x.dim() != 2:
        raise ValueError(f"logits has shape {tuple(x.shape)}; expected [rows, V]")
    check_vocab("logits", x.shape[1])
    return x


def check_same_device(name: str, x: Tensor, where: torch.device, of: str) -> None:
    if x.device != where:
        raise ValueError(
            f"{name} is on {x.device} but {of} on {where}: every tensor of a verify step must be on one "
            f"device (move it with .to({str(where)!r}))"
        )


def check_drafts(draft_tokens: object, vocab: int, device: torch.device, of: str) -> Tensor:
    """draft_tokens [B, G]: an integer tensor on `device` (that of `of`), B >= 1; on a CPU each id in [0, vocab)."""
    d = check_tensor("draft_tokens", draft_tokens)
    if d.dim() != 2:
        raise ValueError(f"draft_tokens has shape {tuple(d.shape)}; expected [B, G] (requests x draft tokens)")
    if d.dtype.is_floating_point or d.dtype.is_complex or d.dtype == torch.bool:
        raise ValueError(f"draft_tokens has dtype {d.dtype}: token ids are an integer tensor (torch.long)")
    if d.shape[0] == 0:
        raise ValueError("draft_tokens has B = 0 rows: a verify step needs at least one request")
    check_same_device("draft_tokens", d, device, of)
    check_vocab(of, vocab)
    if values_checked(d) and d.numel():
        bad = (d < 0) | (d >= vocab)
        if bool(bad.any()):
            b, j = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"draft_tokens[{b}, {j}] = {int(d[b, j])} is outside the vocabulary [0, {vocab}) of {of}")
    return d


def check_draft_probs(draft_probs: object, device: torch.device, of: str) -> None:
    """A dense q [B, G, V] on `device` (its shape is checked by the verifier beside the target's)."""
    if isinstance(draft_probs, Tensor):
        if not draft_probs.dtype.is_floating_point:
            raise ValueError(f"draft_probs has dtype {draft_probs.dtype}; expected probabilities (float32)")
        check_same_device("draft_probs", draft_probs, device, of)


def check_uniforms(u: Tensor) -> None:
    """On a CPU, each coin in [0, 1) (a coin outside it accepts drafts of probability 0)."""
    if values_checked(u) and u.numel():
        bad = ~((u >= 0) & (u < 1))  # NaN fails both
        if bool(bad.any()):
            b, j = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"uniforms[{b}, {j}] = {float(u[b, j])} is outside [0, 1): the coins are U[0, 1) draws")


def check_target_probs(target_probs: object) -> Tensor:
    """A dense target [B, G+1, V] of probabilities, V >= 1."""
    p = check_tensor("target_probs", target_probs)
    if p.dim() != 3:
        raise ValueError(f"target_probs has shape {tuple(p.shape)}; expected [B, G+1, V]")
    if not p.dtype.is_floating_point:
        raise ValueError(f"target_probs has dtype {p.dtype}; expected probabilities (float32)")
    check_vocab("target_probs", p.shape[2])
    return p


def check_sparse_ids(ids: Tensor, values: Tensor, vocab: int) -> None:
    """A sparse target's entries: integer ids on the values' device; on a CPU each id in [0, vocab] (vocab:
    padding)."""
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"target.ids has dtype {ids.dtype}; expected token ids (torch.long)")
    check_same_device("target.ids", ids, values.device, "target.values")
    check_vocab("target", vocab)
    if values_checked(ids) and ids.numel():
        bad = (ids < 0) | (ids > vocab)
        if bool(bad.any()):
            raise ValueError(
                f"target.ids holds {int(ids[bad][0])}, outside [0, {vocab}] (the vocabulary, and {vocab} for padding)"
            )
