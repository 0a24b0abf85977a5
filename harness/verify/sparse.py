"""The sparse verify path: the target distribution as each row's non-zero entries (at most K: the batch's
largest top_k), never as a dense [rows, V] tensor, and token-wise and block verification on it.

Everything a verifier needs is sparse: p at a draft token (a lookup among the row's entries), and the
residual max(p_scale * p - q, 0), which is zero wherever p is, so it needs q only at p's entries. The
verifiers here take the same arguments as harness.verify.verifiers' (the draft's q as point masses, dense
[B, G, V] or SparseProbs) and make the same decisions with the same coins: the same p_i (the same float32
products), the same inverse-CDF sample (each row's entries in id order, cumulated in float64: the dense
CDF's zeros add nothing). Where they can differ: the residual's total r_i of block verification is a float32
sum over K entries instead of over V (the same terms, another order of additions), so a coin within float32
rounding of h_i may land on the other side (tests/verify/test_verify_sparse.py counts such rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.verify.builders import row_groups
from harness.verify.checks import (
    check_draft_probs,
    check_drafts,
    check_logits,
    check_same_device,
    check_sparse_ids,
)
from harness.verify.rows import row_params
from harness.verify.topk import radix_topk
from harness.verify.verifiers import VerifyOutput, _emit, _uniforms, last_with_mass


@dataclass
class SparseProbs:
    """Distributions over a vocabulary of `vocab` ids, each row by its entries: `values` [..., K] fp32 and
    `ids` [..., K] int64, ids ascending along the last dim; a row with fewer than K entries is padded at
    its end with id `vocab` (no token) and value 0."""

    values: Tensor
    ids: Tensor
    vocab: int

    @property
    def width(self) -> int:
        return self.values.shape[-1]

    def densify(self) -> Tensor:
        """[..., V] fp32, zeros where a row has no entry."""
        shape = (*self.values.shape[:-1], self.vocab + 1)
        out = torch.zeros(shape, dtype=torch.float32, device=self.values.device)
        return out.scatter_(-1, self.ids, self.values.float())[..., : self.vocab]

    def at(self, tokens: Tensor) -> Tensor:
        """p(token) per row: tokens [...] (the rows' leading shape) -> [...] fp32; 0 where the row has no
        entry for it. Exact: at most one entry matches."""
        hit = self.ids == tokens.unsqueeze(-1)
        return torch.where(hit, self.values, torch.zeros_like(self.values)).sum(dim=-1)

    def select(self, index: tuple) -> SparseProbs:
        """The rows at `index` (any indexing of the leading dims)."""
        return SparseProbs(self.values[index], self.ids[index], self.vocab)

    @staticmethod
    def from_dense(probs: Tensor, width: int | None = None) -> SparseProbs:
        """The non-zero entries of dense rows [..., V]; `width` at least the most non-zeros of a row
        (default: exactly that)."""
        vocab = probs.shape[-1]
        nonzero = probs != 0
        most = int(nonzero.sum(dim=-1).max()) if probs.numel() else 0
        width = max(1, most if width is None else width)
        if width < most:
            raise ValueError(f"width {width} is below a row's {most} non-zero entries")
        ids = torch.where(nonzero, torch.arange(vocab, device=probs.device), vocab)
        ids = ids.sort(dim=-1).values[..., :width]
        values = probs.gather(-1, ids.clamp(max=vocab - 1)).float()
        return SparseProbs(torch.where(ids < vocab, values, 0.0), ids, vocab)


def sparse_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> SparseProbs:
    """The sparse builder: the distribution of `topk_first` (the same rows, the same values: bitwise, ties
    aside), each row as its K entries, K = the batch's largest top_k (1 for greedy rows, V for rows whose
    top_k covers the vocabulary). logits: [rows, V]; temperature, top_k, top_p: [rows]."""
    n, vocab = check_logits(logits).shape
    temperature, top_k, top_p = row_params(logits, temperature, top_k, top_p)
    groups = list(row_groups(logits, temperature, top_k, top_p, radix_topk, scale_first=False))
    width = max([g.probs.shape[-1] for g in groups], default=1)
    values = torch.zeros(n, width, dtype=torch.float32, device=logits.device)
    ids = torch.full((n, width), vocab, dtype=torch.int64, device=logits.device)
    for group in groups:
        gids = group.ids
        if gids is None:  # the whole vocabulary, in id order
            gids = torch.arange(vocab, device=logits.device).expand_as(group.probs)
        order = gids.argsort(dim=-1)
        rows = slice(None) if group.rows is None else group.rows
        w = group.probs.shape[-1]
        values[rows, :w] = group.probs.gather(-1, order)
        ids[rows, :w] = gids.gather(-1, order)
    kept = values > 0  # top-k and top-p zeros leave: each row's entries first, id order kept
    ids = torch.where(kept, ids, vocab)
    order = ids.argsort(dim=-1, stable=True)
    return SparseProbs(values.gather(-1, order), ids.gather(-1, order), vocab)


def fused_sparse_probs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> SparseProbs:
    """The sparse builder on topk_fused's kernels (on CUDA with Triton; the tests run `_fused` on a CPU under
    TRITON_INTERPRET=1): one read of the logits and no dense output; rows the kernels leave (top_k above
    their FAST_K, the whole vocabulary) from sparse_probs. The kept sets and values are
    topk_fused's (full_vocab's, but the lowest ids among logits tied at the k-th value, values to float32
    rounding). Elsewhere: sparse_probs."""
    from harness.verify import topk_fused  # noqa: PLC0415  (imports Triton)

    check_logits(logits)
    if logits.device.type != "cuda" or not topk_fused.available():
        return sparse_probs(logits, temperature, top_k, top_p)
    return _fused(logits, temperature, top_k, top_p)


def _fused(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> SparseProbs:
    from harness.verify import topk_fused  # noqa: PLC0415

    temperature, top_k, top_p = row_params(logits, temperature, top_k, top_p)
    values, ids32, left = topk_fused.run_sparse(logits, temperature, top_k, top_p)
    return _merged(logits, temperature, top_k, top_p, values, ids32, left)


def _merged(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    values: Tensor,
    ids32: Tensor,
    left: Tensor | None,
) -> SparseProbs:
    """run_sparse's output (rank order, FAST_K wide) with the rows it left built by sparse_probs, as
    SparseProbs: ids ascending, as wide as the widest row."""
    vocab = logits.shape[1]
    ids = ids32.long()
    if left is not None:
        rest = sparse_probs(logits[left], temperature[left], top_k[left], top_p[left])
        if rest.width > values.shape[-1]:
            pad = rest.width - values.shape[-1]
            values = torch.nn.functional.pad(values, (0, pad))
            ids = torch.nn.functional.pad(ids, (0, pad), value=vocab)
        values[left] = 0.0
        ids[left] = vocab
        values[left, : rest.width] = rest.values
        ids[left, : rest.width] = rest.ids
    ids = torch.where(values > 0, ids, vocab)
    order = ids.argsort(dim=-1, stable=True)
    width = max(1, int((ids < vocab).sum(dim=-1).max()))  # the most entries of a row: one synchronisation
    order = order[:, :width]
    return SparseProbs(values.gather(-1, order), ids.gather(-1, order), vocab)


def verify_step(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | SparseProbs | None,
    *,
    block: bool,
    fused: bool,
    uniforms: Tensor | None = None,
    generators: list[torch.Generator] | None = None,
    max_top_k: int | None = None,
    config: dict[str, int] | None = None,
) -> VerifyOutput:
    """A whole sparse verify step: target logits -> the verifier's output, never a dense [rows, V] tensor.

    logits [B * (G+1), V], request by request (row b * (G+1) + j: p(. | prefix_j) of request b); temperature,
    top_k, top_p [B * (G+1)]; draft_tokens [B, G]; draft_probs as the sparse verifiers take it; block: block
    verification, else token-wise. fused on CUDA with Triton: topk_fused's kernels in their sparse mode and the
    verification (inside their finish with launch_config's VERIFY, else the verify kernel of
    harness.verify.sparse_kernel queued behind them), one synchronisation after both (the rows the kernels left,
    if any, are then built by sparse_probs and their steps verified again); a sparse q takes the torch verifiers.
    max_top_k: the host's bound on every row's top_k (SGLang's sampling_info.max_top_k; None: none known); when it
    is at most topk_fused.FAST_K the kernels take every row and the fused step queues its work without that
    synchronisation (topk_fused.bounded). config: overrides of topk_fused.launch_config (the fused path).
    Otherwise: sparse_probs (fused: fused_sparse_probs) and the torch sparse verifiers.
    Arguments are checked at entry (harness.verify.checks; the draft ids' range and the coins only on a CPU)."""
    check_drafts(draft_tokens, check_logits(logits).shape[1], logits.device, "logits")
    check_draft_probs(draft_probs, logits.device, "logits")
    bsz, gamma = draft_tokens.shape
    if logits.shape[0] != bsz * (gamma + 1):
        raise ValueError(f"{logits.shape[0]} rows of logits for {bsz} steps of {gamma} drafts: need B * (G+1)")
    if isinstance(draft_probs, Tensor) and tuple(draft_probs.shape) != (bsz, gamma, logits.shape[1]):
        raise ValueError(
            f"draft_probs {tuple(draft_probs.shape)} must be [B, G, V] = [{bsz}, {gamma}, {logits.shape[1]}]"
        )
    if max_top_k is not None and max_top_k < 1:
        raise ValueError(f"max_top_k {max_top_k}: the host's bound on every row's top_k must be >= 1 (or None)")
    u = _uniforms(uniforms, generators, (bsz, gamma + 1), logits.device)
    if fused and logits.device.type == "cuda" and not isinstance(draft_probs, SparseProbs) and _kernels():
        return _fused_step(
            logits, temperature, top_k, top_p, draft_tokens, draft_probs, u, block, max_top_k=max_top_k, config=config
        )
    s = (fused_sparse_probs if fused else sparse_probs)(logits, temperature, top_k, top_p)
    return _verify_entries(s, bsz, gamma, draft_tokens, draft_probs, u, block, kernel=False)


def _kernels() -> bool:
    from harness.verify import sparse_kernel, topk_fused  # noqa: PLC0415  (imports Triton)

    return topk_fused.available() and sparse_kernel.available()


def _fused_step(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    u: Tensor,
    block: bool,
    *,
    max_top_k: int | None = None,
    config: dict[str, int] | None = None,
) -> VerifyOutput:
    """verify_step's kernel path (the tests run it on a CPU under TRITON_INTERPRET=1)."""
    from harness.verify import sparse_kernel, topk_fused  # noqa: PLC0415

    bsz, gamma = draft_tokens.shape
    vocab = logits.shape[1]
    temperature, top_k, top_p = row_params(logits, temperature, top_k, top_p)
    if (config or {}).get("VERIFY", topk_fused.launch_config(vocab, sparse=True)["VERIFY"]):
        q = None if draft_probs is None else draft_probs.float().contiguous()
        step = topk_fused.Step(draft_tokens.contiguous(), q, u.float().contiguous(), block)
        values, ids, out, pending = topk_fused.queue_step(logits, temperature, top_k, top_p, step, config, max_top_k)
    else:
        values, ids, pending = topk_fused.queue_sparse(logits, temperature, top_k, top_p, config, max_top_k)
        out = sparse_kernel.verify_entries(
            values.view(bsz, gamma + 1, -1), ids.view(bsz, gamma + 1, -1), vocab, draft_tokens, draft_probs, u, block
        )
    left = pending()
    if left is None:
        return out
    s = _merged(logits, temperature, top_k, top_p, values, ids, left)  # rare: rows the kernels left
    return _verify_entries(
        s, bsz, gamma, draft_tokens, draft_probs, u, block, kernel=s.width <= sparse_kernel.MAX_WIDTH
    )


def _verify_entries(
    s: SparseProbs,
    bsz: int,
    gamma: int,
    draft_tokens: Tensor,
    draft_probs: Tensor | SparseProbs | None,
    u: Tensor,
    block: bool,
    kernel: bool,
) -> VerifyOutput:
    target = SparseProbs(s.values.view(bsz, gamma + 1, -1), s.ids.view(bsz, gamma + 1, -1), s.vocab)
    if kernel and not isinstance(draft_probs, SparseProbs):
        from harness.verify import sparse_kernel  # noqa: PLC0415

        return sparse_kernel.verify_entries(target.values, target.ids, s.vocab, draft_tokens, draft_probs, u, block)
    verifier = verify_block_sparse if block else verify_tokenwise_sparse
    return verifier(target, draft_tokens, draft_probs, uniforms=u)


def _q_at(draft_probs: Tensor | SparseProbs | None, rows: Tensor, pos: Tensor, ids: Tensor) -> Tensor | None:
    """q(.|prefix at pos) at `ids` [B, K] for each row -> [B, K] fp32, or None for point masses. A sparse q
    is looked up by comparing ids ([B, K, Kq] at once: meant for top-k widths, not whole vocabularies)."""
    if draft_probs is None:
        return None
    if isinstance(draft_probs, SparseProbs):
        q = draft_probs.select((rows, pos))  # [B, Kq]
        hit = q.ids.unsqueeze(1) == ids.unsqueeze(-1)  # [B, K, Kq]
        return torch.where(hit, q.values.unsqueeze(1), torch.zeros((), device=ids.device)).sum(dim=-1)
    q_row = draft_probs[rows, pos]  # [B, V]
    vocab = q_row.shape[-1]
    return torch.where(ids < vocab, q_row.gather(-1, ids.clamp(max=vocab - 1)), 0.0)


def _residual(p_scale: Tensor, p: SparseProbs, q: Tensor | None, q_token: Tensor) -> Tensor:
    """max(p_scale * p - q, 0) at p's entries -> [B, K]; q None: a point mass at q_token (-1: none)."""
    scaled = p_scale.unsqueeze(-1) * p.values
    if q is None:
        q = (p.ids == q_token.unsqueeze(-1)).float()
    return torch.clamp(scaled - q, min=0.0)


def _sample(weights: Tensor, ids: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sample over each row's entries (in id order, as the dense sampler over the vocabulary):
    the same token as harness.verify.sample_from_probs on the densified row."""
    cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)
    target = (u.double() * cdf[:, -1]).unsqueeze(-1)
    at = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    over = at >= weights.shape[-1]
    if bool(over.any()):
        rows = over.nonzero().squeeze(-1)
        at[rows] = last_with_mass(weights[rows])  # (a row without mass: ValueError, never the padding id V)
    return ids.gather(-1, at.unsqueeze(-1)).squeeze(-1)


def _draft_prob_of_token(draft_tokens: Tensor, draft_probs: Tensor | SparseProbs | None) -> Tensor:
    if draft_probs is None:
        return torch.ones(draft_tokens.shape, dtype=torch.float32, device=draft_tokens.device)
    if isinstance(draft_probs, SparseProbs):
        return draft_probs.at(draft_tokens)
    return draft_probs.gather(2, draft_tokens.unsqueeze(-1)).squeeze(-1)


def _final_token(
    target: SparseProbs,
    draft_tokens: Tensor,
    draft_probs: Tensor | SparseProbs | None,
    stop: Tensor,
    p_scale: Tensor,
    u_last: Tensor,
) -> Tensor:
    """The token after `stop` accepted drafts, as harness.verify.verifiers._final_token, on p's entries."""
    bsz, gamma = draft_tokens.shape
    rows = torch.arange(bsz, device=draft_tokens.device)
    p = target.select((rows, stop))  # [B, K]
    is_bonus = stop >= gamma
    at = stop.clamp(max=gamma - 1)
    q = _q_at(draft_probs, rows, at, p.ids)
    q_token = torch.where(is_bonus, torch.full_like(stop, -1), draft_tokens[rows, at])
    if q is not None:
        q = torch.where(is_bonus.unsqueeze(-1), torch.zeros_like(q), q)
    scale = torch.where(is_bonus, torch.ones_like(p_scale), p_scale)
    dist = _residual(scale, p, q, q_token)
    empty = dist.sum(dim=-1) <= 0
    dist = torch.where(empty.unsqueeze(-1), p.values, dist)
    return _sample(dist, p.ids, u_last)


def _check(target: SparseProbs, draft_tokens: Tensor, draft_probs: Tensor | SparseProbs | None) -> None:
    """The entry checks of the sparse verifiers (harness.verify.checks: what each costs, where it runs)."""
    check_sparse_ids(target.ids, target.values, target.vocab)
    check_drafts(draft_tokens, target.vocab, target.values.device, "target")
    check_draft_probs(draft_probs, target.values.device, "target")
    if isinstance(draft_probs, SparseProbs):
        check_same_device("draft_probs.values", draft_probs.values, target.values.device, "target")
    bsz, gamma = draft_tokens.shape
    if target.values.dim() != 3 or target.values.shape[:2] != (bsz, gamma + 1):
        raise ValueError(f"target {tuple(target.values.shape)} must be [B, G+1, K] for drafts [{bsz}, {gamma}]")
    if isinstance(draft_probs, SparseProbs):
        if draft_probs.values.shape[:2] != (bsz, gamma) or draft_probs.vocab != target.vocab:
            raise ValueError(
                f"sparse draft_probs {tuple(draft_probs.values.shape)} over {draft_probs.vocab} ids must "
                f"be [B, G, Kq] = [{bsz}, {gamma}, Kq] over the target's {target.vocab}"
            )
    elif draft_probs is not None and tuple(draft_probs.shape) != (bsz, gamma, target.vocab):
        raise ValueError(f"draft_probs {tuple(draft_probs.shape)} must be [B, G, V] = [{bsz}, {gamma}, {target.vocab}]")


def verify_tokenwise_sparse(
    target: SparseProbs,
    draft_tokens: Tensor,
    draft_probs: Tensor | SparseProbs | None,
    *,
    uniforms: Tensor | None = None,
    generators: list[torch.Generator] | None = None,
) -> VerifyOutput:
    """Token-wise verification (harness.verify.verify_tokenwise) on a sparse target [B, G+1, K]."""
    _check(target, draft_tokens, draft_probs)
    bsz, gamma = draft_tokens.shape
    u = _uniforms(uniforms, generators, (bsz, gamma + 1), target.values.device)
    p_tok = target.select((slice(None), slice(0, gamma))).at(draft_tokens)  # [B, G]
    q_tok = _draft_prob_of_token(draft_tokens, draft_probs)
    accept = (u[:, :gamma] * q_tok < p_tok) & _in_vocab(draft_tokens, target.vocab)
    n_acc = accept.long().cumprod(dim=1).sum(dim=1)
    last = _final_token(target, draft_tokens, draft_probs, n_acc, torch.ones(bsz, device=u.device), u[:, gamma])
    return _emit(draft_tokens, n_acc, last)


def _in_vocab(draft_tokens: Tensor, vocab: int) -> Tensor:
    """[B, G] whether each draft is an id of the vocabulary: a draft outside it is never accepted, whatever its
    coin (elementwise, no synchronisation: on a GPU the ids are not checked at entry)."""
    return (draft_tokens >= 0) & (draft_tokens < vocab)


def block_weights_sparse(
    target: SparseProbs, draft_tokens: Tensor, draft_probs: Tensor | SparseProbs | None
) -> tuple[Tensor, Tensor]:
    """Sun et al.'s p_i and h_i (harness.verify.block_weights) on a sparse target. -> ([B, G+1], [B, G])."""
    _check(target, draft_tokens, draft_probs)
    return _block_weights_sparse(target, draft_tokens, draft_probs)


def _block_weights_sparse(
    target: SparseProbs, draft_tokens: Tensor, draft_probs: Tensor | SparseProbs | None
) -> tuple[Tensor, Tensor]:
    """block_weights_sparse without its checks (verify_block_sparse made them)."""
    bsz, gamma = draft_tokens.shape
    device = draft_tokens.device
    p_tok = target.select((slice(None), slice(0, gamma))).at(draft_tokens)
    q_tok = _draft_prob_of_token(draft_tokens, draft_probs).clamp(min=1e-30)
    p_acc = [torch.ones(bsz, dtype=torch.float32, device=device)]
    for i in range(gamma):
        p_acc.append(torch.clamp(p_acc[-1] * p_tok[:, i] / q_tok[:, i], max=1.0))  # the dense order of rounding
    p_acc_t = torch.stack(p_acc, dim=1)
    rows = torch.arange(bsz, device=device)
    h = torch.empty(bsz, gamma, dtype=torch.float32, device=device)
    for i in range(1, gamma):
        p = target.select((slice(None), i))
        q = _q_at(draft_probs, rows, torch.full_like(rows, i), p.ids)
        r = _residual(p_acc_t[:, i], p, q, draft_tokens[:, i]).sum(dim=-1)
        denom = r + 1.0 - p_acc_t[:, i]
        h[:, i - 1] = torch.where(denom > 0, r / denom.clamp(min=1e-30), torch.zeros_like(r))
    h[:, gamma - 1] = p_acc_t[:, gamma]
    return p_acc_t, h


def verify_block_sparse(
    target: SparseProbs,
    draft_tokens: Tensor,
    draft_probs: Tensor | SparseProbs | None,
    *,
    uniforms: Tensor | None = None,
    generators: list[torch.Generator] | None = None,
) -> VerifyOutput:
    """Block verification (harness.verify.verify_block) on a sparse target [B, G+1, K]."""
    _check(target, draft_tokens, draft_probs)
    bsz, gamma = draft_tokens.shape
    u = _uniforms(uniforms, generators, (bsz, gamma + 1), target.values.device)
    p_acc, h = _block_weights_sparse(target, draft_tokens, draft_probs)
    hit = (u[:, :gamma] < h) & _in_vocab(draft_tokens, target.vocab).cumprod(dim=1).bool()  # x_1..x_i all ids
    positions = torch.arange(1, gamma + 1, device=u.device).unsqueeze(0)
    tau = torch.where(hit, positions, torch.zeros_like(positions)).max(dim=1).values
    p_tau = p_acc.gather(1, tau.unsqueeze(-1)).squeeze(-1)
    last = _final_token(target, draft_tokens, draft_probs, tau, p_tau, u[:, gamma])
    return _emit(draft_tokens, tau, last)
