"""The verification core: verify-probability builders, radix top-k, token-wise and block verifiers.

One module, used by the embedded server (`harness.engine`) and the microbenchmark (`harness.micro`).
Shapes: B = requests, G = gamma (draft tokens per step), V = vocabulary, rows = any batch of rows.

Builders turn target logits into the distribution that sampled drafts are verified against
(temperature, then top-k, then top-p; min_p is not applied on this path, as in SGLang):
- `full_vocab` ("before"): divide the whole [rows, V] matrix by the temperature, then top-k.
- `topk_first` ("after"): top-k on the raw logits (radix top-k), then divide only the k values.
Dividing by a positive temperature keeps the order, so both give bitwise the same probabilities
(ties aside: which of several tied logits is kept may differ, the values may not).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

GREEDY_TEMPERATURE = 1e-6  # SGLang: a temperature strictly below this means greedy

BuilderFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
TopkFn = Callable[[Tensor, int], tuple[Tensor, Tensor]]


# ---------------------------------------------------------------------------------------------
# top-k
# ---------------------------------------------------------------------------------------------


def torch_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """torch.topk, sorted descending. x: [rows, V] -> ([rows, k], [rows, k] int64)."""
    return torch.topk(x, k, dim=-1, largest=True, sorted=True)


@functools.cache
def _flashinfer_top_k() -> Callable | None:
    """FlashInfer's radix top-k function, or None when FlashInfer does not import (resolved once)."""
    try:
        import flashinfer  # noqa: PLC0415
    except Exception:  # noqa: BLE001  (any import failure means: not available)
        return None
    fn = getattr(flashinfer, "top_k", None)
    return fn if callable(fn) else None


def radix_topk_backend(device: torch.device | str) -> str:
    """Which implementation `radix_topk` uses for tensors on `device`: 'flashinfer' or 'torch'."""
    is_cuda = torch.device(device).type == "cuda"
    return "flashinfer" if is_cuda and _flashinfer_top_k() is not None else "torch"


def radix_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k values and indices of each row, sorted descending; any k up to the vocabulary.

    FlashInfer's radix top-k (`sorted=True, deterministic=True`) for CUDA tensors when FlashInfer
    imports, `torch.topk` otherwise. x: [rows, V] -> ([rows, k], [rows, k] int64).
    """
    if not 1 <= k <= x.shape[-1]:
        raise ValueError(f"radix_topk: k={k} must be in [1, {x.shape[-1]}] (the row length)")
    if radix_topk_backend(x.device) == "torch":
        return torch_topk(x, k)
    fi_top_k = _flashinfer_top_k()
    assert fi_top_k is not None  # the backend is flashinfer: it imported (resolved once)
    values, indices = fi_top_k(x.contiguous(), k, sorted=True, deterministic=True)
    return values, indices.long()


# ---------------------------------------------------------------------------------------------
# verify-probability builders
# ---------------------------------------------------------------------------------------------


def _greedy_rows(temperature: Tensor, top_k: Tensor) -> Tensor:
    """Greedy rows: temperature strictly below 1e-6 (SGLang's `0 <= temperature < 1e-6`), or top_k 1."""
    return (temperature < GREEDY_TEMPERATURE) | (top_k == 1)


def _effective_top_k(top_k: Tensor, vocab: int) -> Tensor:
    """top_k <= 0 (SGLang's -1) or >= V means the whole vocabulary."""
    return torch.where((top_k <= 0) | (top_k >= vocab), torch.full_like(top_k, vocab), top_k)


def top_p_renorm_sorted(probs: Tensor, top_p: Tensor) -> Tensor:
    """Keep the smallest set of most probable tokens whose mass reaches top_p, renormalise.

    probs: [rows, k] sorted descending along the last dim; top_p: [rows]. Returns [rows, k] fp32.
    The threshold is the probability of the token at which the descending mass reaches top_p (the
    last one whose mass before it is below top_p); every token at least that probable is kept, so
    tokens of equal probability are kept or dropped together, whatever their order. This is the rule
    of FlashInfer's top_p_renorm_probs, SGLang's CUDA path; SGLang's CPU fallback drops by position
    the tokens whose mass before them is > top_p. Rows with top_p >= 1 come back untouched, not
    divided by their own sum: as SGLang, which renormalises nothing when no row of the batch uses
    top-p, and so that a row never depends on the other rows of its batch.
    """
    active = (top_p < 1.0).unsqueeze(-1)  # [rows, 1]
    below = torch.cumsum(probs, dim=-1) - probs < top_p.unsqueeze(-1)  # mass before the token < top_p
    threshold = probs.masked_fill(~below, float("inf")).amin(dim=-1, keepdim=True)  # [rows, 1]
    kept = probs.masked_fill((probs < threshold) & active, 0.0)
    return torch.where(active, kept / kept.sum(dim=-1, keepdim=True), probs)


def _sparse_probs_into(out: Tensor, rows: Tensor | None, vals: Tensor, idx: Tensor, k_eff: Tensor,
                       top_p: Tensor) -> None:
    """Mask ranks >= top_k, softmax, top-p, and scatter into `out` (rows `rows`, or all when None).

    vals: [n, kmax] fp32 sorted descending (already divided by the temperature); idx: [n, kmax];
    out: [rows_total, V] fp32 zeros. Writes in place: no dense temporary.
    """
    ranks = torch.arange(vals.shape[-1], device=vals.device)
    vals = vals.masked_fill(ranks.unsqueeze(0) >= k_eff.unsqueeze(-1), float("-inf"))
    probs = top_p_renorm_sorted(torch.softmax(vals, dim=-1), top_p)
    if rows is None:
        out.scatter_(1, idx, probs)
    else:
        out.index_put_((rows.unsqueeze(-1).expand_as(idx), idx), probs)


def _dense_probs(scaled: Tensor, top_p: Tensor) -> Tensor:
    """Rows whose top-k covers the vocabulary: softmax then top-p (top-k renorm is the identity).

    scaled: [rows, V] fp32 already divided by the temperature.
    """
    probs = torch.softmax(scaled, dim=-1)
    if not bool((top_p < 1.0).any()):
        return probs
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    return torch.empty_like(probs).scatter_(1, order, top_p_renorm_sorted(sorted_probs, top_p))


def _subset(x: Tensor, rows: Tensor, n_total: int) -> Tensor:
    """x[rows] without a copy when `rows` is every row."""
    return x if rows.numel() == n_total else x[rows]


def _row_params(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The per-row parameters as the builders use them: [rows] each, on the logits' device; temperature and
    top_p fp32, top_k int64."""
    n, device = logits.shape[0], logits.device
    return (temperature.to(device=device, dtype=torch.float32).reshape(n),
            top_k.to(device=device, dtype=torch.int64).reshape(n),
            top_p.to(device=device, dtype=torch.float32).reshape(n))


def _build(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor,
           topk_fn: TopkFn, scale_first: bool) -> Tensor:
    """Shared skeleton of the builders; only where the temperature is applied differs.

    logits: [rows, V]; temperature, top_k, top_p: [rows]. -> [rows, V] fp32.
    """
    n, vocab = logits.shape
    temperature, top_k, top_p = _row_params(logits, temperature, top_k, top_p)
    out = torch.zeros(n, vocab, dtype=torch.float32, device=logits.device)

    greedy = _greedy_rows(temperature, top_k)
    k_eff = _effective_top_k(top_k, vocab)
    dense = ~greedy & (k_eff >= vocab)
    sparse = ~greedy & (k_eff < vocab)

    if bool(greedy.any()):
        g = greedy.nonzero().squeeze(-1)
        out[g, _subset(logits, g, n).argmax(dim=-1)] = 1.0
    if bool(dense.any()):
        d = dense.nonzero().squeeze(-1)
        out[d] = _dense_probs(_subset(logits, d, n).float() / temperature[d].unsqueeze(-1), top_p[d])
    if bool(sparse.any()):
        s = sparse.nonzero().squeeze(-1)
        kmax = int(k_eff[s].max())
        t = temperature[s].unsqueeze(-1)
        x = _subset(logits, s, n)
        if scale_first:  # "before": an fp32 temporary of the full [rows, V] size
            vals, idx = topk_fn(x.float() / t, kmax)
        else:  # "after": top-k of the raw logits, scale only the k values of each row
            vals, idx = topk_fn(x, kmax)
            vals = vals.float() / t
        _sparse_probs_into(out, None if s.numel() == n else s, vals, idx, k_eff[s], top_p[s])
    return out


def full_vocab_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """"before": scale the whole logits matrix by the temperature, then torch.topk. -> [rows, V] fp32."""
    return _build(logits, temperature, top_k, top_p, torch_topk, scale_first=True)


def topk_first_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """"after": radix top-k on the raw logits, then scale the k values. -> [rows, V] fp32."""
    return _build(logits, temperature, top_k, top_p, radix_topk, scale_first=False)


def topk_first_torch_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """"after" with torch.topk forced (the fallback path on every device). -> [rows, V] fp32."""
    return _build(logits, temperature, top_k, top_p, torch_topk, scale_first=False)


def topk_fused_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """One read of the logits, one write of the output: the Triton kernels of harness.verify.topk_fused on CUDA for
    the rows they take (top_k up to its FAST_K, greedy rows), topk_first for the others (and for the rare
    row whose thresholds all missed); off CUDA or without Triton, topk_first for every row. -> [rows, V] fp32.

    The kept tokens are those of full_vocab, except where logits tie at a row's k-th value: the kernel
    keeps the lowest indices (torch.topk and FlashInfer may keep others of equal value). The probabilities
    agree with full_vocab's to float32 rounding (another order of the softmax sums), not bitwise."""
    from harness.verify import topk_fused  # noqa: PLC0415  (imports Triton)

    if logits.device.type != "cuda" or not topk_fused.available():
        return topk_first_probs(logits, temperature, top_k, top_p)
    return fused_build(logits, temperature, top_k, top_p)


def fused_build(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """topk_fused on any device Triton runs on (CUDA; a CPU under TRITON_INTERPRET=1, for tests)."""
    from harness.verify import topk_fused  # noqa: PLC0415  (imports Triton)

    temperature, top_k, top_p = _row_params(logits, temperature, top_k, top_p)
    out, left = topk_fused.run(logits, temperature, top_k, top_p)
    if left is not None:  # rows the kernels did not take (top_k above FAST_K, the whole vocabulary) or missed
        out[left] = topk_first_probs(logits[left], temperature[left], top_k[left], top_p[left])
    return out


BUILDERS: dict[str, BuilderFn] = {
    "full_vocab": full_vocab_probs,
    "topk_first": topk_first_probs,
    "topk_first_torch": topk_first_torch_probs,
    "topk_fused": topk_fused_probs,
}


def get_builder(name: str) -> BuilderFn:
    """The builder called `name`; a ValueError lists the valid names."""
    try:
        return BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown verify-probability builder {name!r}; valid: {', '.join(BUILDERS)}") from None


# ---------------------------------------------------------------------------------------------
# sampling helpers
# ---------------------------------------------------------------------------------------------


def draw_uniforms(generators: list[torch.Generator], n: int, device: torch.device | str) -> Tensor:
    """n uniforms in [0, 1) per row, row b drawn from generators[b] (on its own device). -> [B, n]."""
    rows = [torch.rand(n, generator=g, device=g.device, dtype=torch.float32) for g in generators]
    if not rows:
        return torch.empty(0, n, device=device)
    return torch.stack(rows).to(device=device, dtype=torch.float32)


def sample_from_probs(probs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sample of each row of probs [B, V] (need not be normalised) with u [B] in [0, 1).

    Never returns a zero-probability token: searchsorted(right=True) skips flat stretches of the CDF,
    and a row whose u * total rounds up to the total takes its last token with mass.
    """
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # float64: rounding cannot shift a token's mass
    target = (u.double() * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    over = idx >= probs.shape[-1]
    if bool(over.any()):
        rows = over.nonzero().squeeze(-1)
        idx[rows] = (probs[rows] > 0).long().cumsum(dim=-1).argmax(dim=-1)  # the last token with mass
    return idx


def _uniforms(uniforms: Tensor | None, generators: list[torch.Generator] | None, shape: tuple[int, int],
              device: torch.device) -> Tensor:
    if (uniforms is None) == (generators is None):
        raise ValueError("give exactly one of `uniforms` or `generators`")
    if uniforms is None:
        assert generators is not None  # exactly one of the two (checked above)
        if len(generators) != shape[0]:
            raise ValueError(f"{len(generators)} generators for {shape[0]} rows")
        return draw_uniforms(generators, shape[1], device)
    if tuple(uniforms.shape) != shape:
        raise ValueError(f"uniforms has shape {tuple(uniforms.shape)}, expected {shape} (B, gamma + 1)")
    return uniforms.to(device=device, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# verifiers
# ---------------------------------------------------------------------------------------------


@dataclass
class VerifyOutput:
    """Per row: accepted drafts and the emitted tokens (accepted prefix + one token, padded -1)."""

    num_accepted: Tensor  # [B] int64, 0..G
    tokens: Tensor  # [B, G+1] int64

    @property
    def num_emitted(self) -> Tensor:
        return self.num_accepted + 1


def _draft_prob_of_token(draft_tokens: Tensor, draft_probs: Tensor | None) -> Tensor:
    """q_j(x_{j+1}) for j = 0..G-1 -> [B, G]; 1 for point-mass drafts."""
    if draft_probs is None:
        return torch.ones(draft_tokens.shape, dtype=torch.float32, device=draft_tokens.device)
    return draft_probs.gather(2, draft_tokens.unsqueeze(-1)).squeeze(-1)


def _residual(p_scale: Tensor, p_row: Tensor, q_row: Tensor | None, q_token: Tensor) -> Tensor:
    """max(p_scale * p - q, 0) per row. p_row: [B, V]; q_row: [B, V] or None for a point mass at q_token."""
    scaled = p_scale.unsqueeze(-1) * p_row
    if q_row is not None:
        return torch.clamp(scaled - q_row, min=0.0)
    # point mass: subtract 1 at the draft token (a row whose position has no draft, q_token = -1, keeps p)
    one_hot = torch.zeros_like(scaled)
    has = q_token >= 0
    one_hot[has.nonzero().squeeze(-1), q_token[has]] = 1.0
    return torch.clamp(scaled - one_hot, min=0.0)


def _emit(draft_tokens: Tensor, n_acc: Tensor, last: Tensor) -> VerifyOutput:
    """Tokens = drafts[:n_acc] + [last], padded with -1. draft_tokens: [B, G]; n_acc, last: [B]."""
    bsz, gamma = draft_tokens.shape
    pos = torch.arange(gamma + 1, device=draft_tokens.device).unsqueeze(0)
    padded = torch.cat([draft_tokens, torch.full((bsz, 1), -1, device=draft_tokens.device)], dim=1)
    tokens = torch.where(pos < n_acc.unsqueeze(-1), padded, torch.full_like(padded, -1))
    tokens.scatter_(1, n_acc.unsqueeze(-1), last.unsqueeze(-1))
    return VerifyOutput(num_accepted=n_acc, tokens=tokens)


def _final_token(target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None, stop: Tensor,
                 p_scale: Tensor, u_last: Tensor) -> Tensor:
    """Sample the token after `stop` accepted drafts: from the residual where stop < G, else the bonus.

    Residual = norm(max(p_scale * p(.|prefix_stop) - q(.|prefix_stop), 0)); falls back to p where the
    residual has no mass (only reachable through rounding).
    """
    bsz, gamma = draft_tokens.shape
    rows = torch.arange(bsz, device=target_probs.device)
    p_row = target_probs[rows, stop]  # [B, V]
    is_bonus = stop >= gamma
    at = stop.clamp(max=gamma - 1)
    q_row = None if draft_probs is None else draft_probs[rows, at]
    q_token = torch.where(is_bonus, torch.full_like(stop, -1), draft_tokens[rows, at])
    if q_row is not None:
        q_row = torch.where(is_bonus.unsqueeze(-1), torch.zeros_like(q_row), q_row)
    scale = torch.where(is_bonus, torch.ones_like(p_scale), p_scale)
    dist = _residual(scale, p_row, q_row, q_token)
    empty = dist.sum(dim=-1) <= 0
    dist = torch.where(empty.unsqueeze(-1), p_row, dist)
    return sample_from_probs(dist, u_last)


def _check_shapes(target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None) -> None:
    bsz, gamma = draft_tokens.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (bsz, gamma + 1):
        raise ValueError(f"target_probs {tuple(target_probs.shape)} must be [B, G+1, V] for drafts [{bsz}, {gamma}]")
    if draft_probs is not None and tuple(draft_probs.shape) != (bsz, gamma, target_probs.shape[2]):
        raise ValueError(f"draft_probs {tuple(draft_probs.shape)} must be [B, G, V] = [{bsz}, {gamma}, {target_probs.shape[2]}]")


def verify_tokenwise(target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None, *,
                     uniforms: Tensor | None = None,
                     generators: list[torch.Generator] | None = None) -> VerifyOutput:
    """Chain verification (Leviathan et al.): accept x_i with probability min(1, p/q), stop at the first
    rejection and sample from norm(max(p - q, 0)); when all G are accepted, sample a bonus from p_G.

    target_probs: [B, G+1, V]; draft_tokens: [B, G]; draft_probs: [B, G, V] or None (point masses).
    """
    _check_shapes(target_probs, draft_tokens, draft_probs)
    bsz, gamma = draft_tokens.shape
    u = _uniforms(uniforms, generators, (bsz, gamma + 1), target_probs.device)
    p_tok = target_probs[:, :gamma].gather(2, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, G]
    q_tok = _draft_prob_of_token(draft_tokens, draft_probs)  # [B, G]
    accept = u[:, :gamma] * q_tok < p_tok  # P(accept) = min(1, p/q)
    n_acc = accept.long().cumprod(dim=1).sum(dim=1)
    last = _final_token(target_probs, draft_tokens, draft_probs, n_acc, torch.ones(bsz, device=u.device), u[:, gamma])
    return _emit(draft_tokens, n_acc, last)


def block_weights(target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None) -> tuple[Tensor, Tensor]:
    """Sun et al.'s p_i (i = 0..G) and h_i (i = 1..G) for each row. -> ([B, G+1], [B, G]).

    p_0 = 1, p_i = min(1, p_{i-1} p(x_i)/q(x_i)); for i < G h_i = r_i / (r_i + 1 - p_i) with
    r_i = sum_x max(p_i p(x|prefix_i) - q(x|prefix_i), 0); h_G = p_G. A 0/0 (r_i = 0, p_i = 1) is 0:
    stopping there would leave an empty residual.
    """
    bsz, gamma = draft_tokens.shape
    p_tok = target_probs[:, :gamma].gather(2, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, G]
    q_tok = _draft_prob_of_token(draft_tokens, draft_probs).clamp(min=1e-30)  # q > 0 for a draft; guard 0/0
    p_acc = [torch.ones(bsz, dtype=torch.float32, device=target_probs.device)]
    for i in range(gamma):
        # (p_{i-1} * p) / q, in this order: SGLang's kernel rounds the same way (p_{i-1} * (p / q) does not)
        p_acc.append(torch.clamp(p_acc[-1] * p_tok[:, i] / q_tok[:, i], max=1.0))
    p_acc_t = torch.stack(p_acc, dim=1)  # [B, G+1]
    h = torch.empty(bsz, gamma, dtype=torch.float32, device=target_probs.device)
    for i in range(1, gamma):
        q_row = None if draft_probs is None else draft_probs[:, i]
        r = _residual(p_acc_t[:, i], target_probs[:, i], q_row, draft_tokens[:, i]).sum(dim=-1)
        denom = r + 1.0 - p_acc_t[:, i]
        h[:, i - 1] = torch.where(denom > 0, r / denom.clamp(min=1e-30), torch.zeros_like(r))
    h[:, gamma - 1] = p_acc_t[:, gamma]
    return p_acc_t, h


def verify_block(target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None, *,
                 uniforms: Tensor | None = None,
                 generators: list[torch.Generator] | None = None) -> VerifyOutput:
    """Block verification (Sun et al., ICLR 2025): draw eta_i ~ U(0,1) for i = 1..G, tau = the largest i
    with eta_i < h_i (0 if none), no early stop; emit x_1..x_tau and one token from p_G (tau = G) or
    from norm(max(p_tau p(.|prefix_tau) - q(.|prefix_tau), 0)). Same arguments as verify_tokenwise.
    """
    _check_shapes(target_probs, draft_tokens, draft_probs)
    bsz, gamma = draft_tokens.shape
    u = _uniforms(uniforms, generators, (bsz, gamma + 1), target_probs.device)
    p_acc, h = block_weights(target_probs, draft_tokens, draft_probs)
    hit = u[:, :gamma] < h  # [B, G], column i-1 is position i
    positions = torch.arange(1, gamma + 1, device=u.device).unsqueeze(0)
    tau = torch.where(hit, positions, torch.zeros_like(positions)).max(dim=1).values  # [B]
    p_tau = p_acc.gather(1, tau.unsqueeze(-1)).squeeze(-1)
    last = _final_token(target_probs, draft_tokens, draft_probs, tau, p_tau, u[:, gamma])
    return _emit(draft_tokens, tau, last)

