"""The verifiers of a speculative step: token-wise (chain) verification and block verification, and the
sampling helpers they share (per-row uniforms, inverse-CDF sampling). Shapes: B = requests, G = gamma
(draft tokens per step), V = vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.verify.checks import (
    check_draft_probs,
    check_drafts,
    check_target_probs,
    check_tensor,
    check_uniforms,
    check_vocab,
)


def draw_uniforms(generators: list[torch.Generator], n: int, device: torch.device | str) -> Tensor:
    """n uniforms in [0, 1) per row, row b drawn from generators[b] (on its own device). -> [B, n]."""
    rows = [torch.rand(n, generator=g, device=g.device, dtype=torch.float32) for g in generators]
    if not rows:
        return torch.empty(0, n, device=device)
    return torch.stack(rows).to(device=device, dtype=torch.float32)


def sample_from_probs(probs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sample of each row of probs [B, V] (need not be normalised) with u [B] in [0, 1).

    Never returns a zero-probability token: searchsorted(right=True) skips flat stretches of the CDF,
    and a row whose u * total rounds up to the total takes its last token with mass. A row without mass (zeros or
    NaN) is a ValueError (no_mass).
    """
    check_vocab("probs", check_tensor("probs", probs).shape[-1])
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # float64: rounding cannot shift a token's mass
    target = (u.double() * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    over = idx >= probs.shape[-1]
    if bool(over.any()):
        rows = over.nonzero().squeeze(-1)
        idx[rows] = last_with_mass(probs[rows])
    return idx


def last_with_mass(probs: Tensor) -> Tensor:
    """The last index with mass of each row of `probs` [B, N]; ValueError when a row has none (zeros or NaN: no
    token can be sampled, and any index would be made up)."""
    mass = (probs > 0).long()
    if not bool(mass.any(dim=-1).all()):
        raise ValueError(
            "a row of the target distribution has no probability mass: non-finite logits, or "
            "sampling parameters that keep no token (top_p <= 0, a NaN temperature); no token can be "
            "sampled from it"
        )
    return mass.cumsum(dim=-1).argmax(dim=-1)


def _uniforms(
    uniforms: Tensor | None, generators: list[torch.Generator] | None, shape: tuple[int, int], device: torch.device
) -> Tensor:
    if (uniforms is None) == (generators is None):
        raise ValueError("give exactly one of `uniforms` or `generators`")
    if uniforms is None:
        assert generators is not None  # exactly one of the two (checked above)
        if len(generators) != shape[0]:
            raise ValueError(f"{len(generators)} generators for {shape[0]} rows")
        return draw_uniforms(generators, shape[1], device)
    if tuple(check_tensor("uniforms", uniforms).shape) != shape:
        raise ValueError(f"uniforms has shape {tuple(uniforms.shape)}, expected {shape} (B, gamma + 1)")
    check_uniforms(uniforms)
    return uniforms.to(device=device, dtype=torch.float32)


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


def _final_token(
    target_probs: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    stop: Tensor,
    p_scale: Tensor,
    u_last: Tensor,
) -> Tensor:
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
    """The entry checks of the dense verifiers (harness.verify.checks: what each costs, where it runs)."""
    check_target_probs(target_probs)
    check_drafts(draft_tokens, target_probs.shape[2], target_probs.device, "target_probs")
    check_draft_probs(draft_probs, target_probs.device, "target_probs")
    bsz, gamma = draft_tokens.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (bsz, gamma + 1):
        raise ValueError(f"target_probs {tuple(target_probs.shape)} must be [B, G+1, V] for drafts [{bsz}, {gamma}]")
    if draft_probs is not None and tuple(draft_probs.shape) != (bsz, gamma, target_probs.shape[2]):
        raise ValueError(
            f"draft_probs {tuple(draft_probs.shape)} must be [B, G, V] = [{bsz}, {gamma}, {target_probs.shape[2]}]"
        )


def verify_tokenwise(
    target_probs: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    *,
    uniforms: Tensor | None = None,
    generators: list[torch.Generator] | None = None,
) -> VerifyOutput:
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
    """Sun et al.'s p_i (i = 0..G) and h_i (i = 1..G) for each row. -> ([B, G+1], [B, G]). The arguments are
    verify_block's, checked as there."""
    _check_shapes(target_probs, draft_tokens, draft_probs)
    return _block_weights(target_probs, draft_tokens, draft_probs)


def _block_weights(target_probs: Tensor, draft_tokens: Tensor, draft_probs: Tensor | None) -> tuple[Tensor, Tensor]:
    """block_weights without its checks (verify_block made them).

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


def verify_block(
    target_probs: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    *,
    uniforms: Tensor | None = None,
    generators: list[torch.Generator] | None = None,
) -> VerifyOutput:
    """Block verification (Sun et al., ICLR 2025): draw eta_i ~ U(0,1) for i = 1..G, tau = the largest i
    with eta_i < h_i (0 if none), no early stop; emit x_1..x_tau and one token from p_G (tau = G) or
    from norm(max(p_tau p(.|prefix_tau) - q(.|prefix_tau), 0)). Same arguments as verify_tokenwise.
    """
    _check_shapes(target_probs, draft_tokens, draft_probs)
    bsz, gamma = draft_tokens.shape
    u = _uniforms(uniforms, generators, (bsz, gamma + 1), target_probs.device)
    p_acc, h = _block_weights(target_probs, draft_tokens, draft_probs)
    hit = u[:, :gamma] < h  # [B, G], column i-1 is position i
    positions = torch.arange(1, gamma + 1, device=u.device).unsqueeze(0)
    tau = torch.where(hit, positions, torch.zeros_like(positions)).max(dim=1).values  # [B]
    p_tau = p_acc.gather(1, tau.unsqueeze(-1)).squeeze(-1)
    last = _final_token(target_probs, draft_tokens, draft_probs, tau, p_tau, u[:, gamma])
    return _emit(draft_tokens, tau, last)
