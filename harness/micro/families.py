"""Logit families: what the microbenchmark feeds the verify-probability builders (`micro.logits`).

Real language-model logits are not i.i.d. Gaussians: a few dozen to a few hundred plausible ids stand far
above a bulk, often as neighbours (a tokenizer keeps a script's, a language's or the digits' tokens in
contiguous id ranges); rows can be peaked, heavy-tailed, quantised to bf16 (ties) or padding (all equal).
A data-dependent kernel can be fast on one and slow on another, so each published set runs them all.
Every family is seeded (the same seed, rows and vocabulary give the same tensor) and documented in one line
(FAMILIES); tests/micro/test_micro_families.py checks the property each one claims. The real families read rows
of a logit bank (harness.micro.bank) and tile them to the row count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

Make = Callable[
    [int, int, torch.Generator], Tensor
]  # (rows, vocab, generator) -> fp32 [rows, vocab], generator's device

REGION = 4096  # ids of a clustered row's large region (at most an eighth of the row)
PLAUSIBLE = 300  # plausible ids of an lm_like row


def _normal(rows: int, vocab: int, gen: torch.Generator) -> Tensor:
    return torch.randn(rows, vocab, generator=gen, device=gen.device, dtype=torch.float32)


def _ints(high: int, size: tuple[int, ...], gen: torch.Generator) -> Tensor:
    return torch.randint(0, max(1, high), size, generator=gen, device=gen.device)


def iid(rows: int, vocab: int, gen: torch.Generator) -> Tensor:
    return _normal(rows, vocab, gen)


def clustered(rows: int, vocab: int, gen: torch.Generator) -> Tensor:
    """Row i by i % 4: one large region at a random place, four smaller ones, one at the row's start, one at
    its end; the regions' logits are N(4, 1), the rest N(0, 1)."""
    x = _normal(rows, vocab, gen)
    size = max(1, min(REGION, vocab // 8))
    part = max(1, size // 4)
    one = _ints(vocab - size + 1, (rows,), gen)
    four = _ints(vocab - part + 1, (rows, 4), gen)
    for r in range(rows):
        layout = r % 4
        if layout == 0:
            spans = [(int(one[r]), size)]
        elif layout == 1:
            spans = [(int(first), part) for first in four[r]]
        else:
            spans = [(0, size) if layout == 2 else (vocab - size, size)]
        for first, n in spans:
            x[r, first : first + n] += 4.0
    return x


def sorted_rows(rows: int, vocab: int, gen: torch.Generator) -> Tensor:
    """N(0, 1) sorted along the vocabulary: ascending on even rows (the largest at the end), descending on odd."""
    x = torch.sort(_normal(rows, vocab, gen), dim=-1).values
    x[1::2] = x[1::2].flip(-1)
    return x


def heavy_tail(rows: int, vocab: int, gen: torch.Generator) -> Tensor:
    """Student's t with 2 degrees of freedom: a few logits far out, no finite variance."""
    z = _normal(rows, vocab, gen)
    chi2 = _normal(rows, vocab, gen) ** 2 + _normal(rows, vocab, gen) ** 2
    return z / torch.sqrt(chi2 / 2).clamp(min=1e-6)


def peaked(rows: int, vocab: int, gen: torch.Generator) -> Tensor:
    """Near-greedy: N(0, 1) with one logit 30 above it (the next token is all but certain)."""
    x = _normal(rows, vocab, gen)
    x[torch.arange(rows, device=gen.device), _ints(vocab, (rows,), gen)] += 30.0
    return x


def bf16(rows: int, vocab: int, gen: torch.Generator) -> Tensor:
    """N(0, 3) rounded to bfloat16 (8 significant bits): many logits tie, at the top of the row too."""
    return (_normal(rows, vocab, gen) * 3).to(torch.bfloat16).float()


def padding(rows: int, vocab: int, gen: torch.Generator) -> Tensor:
    """Padding slots of a batch: every logit of the row equal (the all-ties case)."""
    return torch.zeros(rows, vocab, device=gen.device)


def lm_like(rows: int, vocab: int, gen: torch.Generator) -> Tensor:
    """A few hundred plausible ids (PLAUSIBLE) 6 to 12 above an N(0, 1) bulk, in three contiguous id ranges
    (half the ids of each range), as a tokenizer groups a script's or a topic's tokens."""
    x = _normal(rows, vocab, gen)
    per = PLAUSIBLE // 3
    width = min(2 * per, max(1, vocab // 3))
    starts = _ints(vocab - width, (rows, 3), gen)
    for r in range(rows):
        for s in starts[r]:
            window = int(s) + torch.randperm(width, generator=gen, device=gen.device)[: min(per, width)]
            x[r, window] = 6.0 + 6.0 * torch.rand(window.numel(), generator=gen, device=gen.device)
    return x


@dataclass(frozen=True)
class Family:
    name: str
    doc: str  # what it models and why, in one line
    make: Make | None  # None: a real family, read from a logit bank
    bank: str | None = None  # the bank's model name, for a real family


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("iid", "i.i.d. N(0, 1): the structureless case every earlier set used", iid),
        Family(
            "clustered",
            "large logits in contiguous id ranges: one region, four, at the row's start, at its end",
            clustered,
        ),
        Family("sorted", "logits sorted along the vocabulary (largest at the end, or at the start)", sorted_rows),
        Family("heavy_tail", "Student's t, 2 degrees of freedom: a few logits far out of the bulk", heavy_tail),
        Family("peaked", "near-greedy: one logit 30 above the bulk", peaked),
        Family("bf16", "N(0, 3) quantised to bfloat16: ties, the k-th value too", bf16),
        Family("padding", "all-equal rows (padding slots of a batch)", padding),
        Family("lm_like", "a few hundred plausible ids far above a Gaussian bulk, in three id ranges", lm_like),
        Family("smollm2", "real rows: SmolLM2-135M-Instruct (49,152 ids) on real prompts", None, bank="smollm2"),
        Family("gemma3", "real rows: Gemma 3 270M (262,144 ids) on real prompts", None, bank="gemma3"),
    )
}


class FamilyError(ValueError):
    """An unknown family name, or a real family without its bank; the message says which and what to do."""


def check_families(names: list[str]) -> None:
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise FamilyError(
            f"unknown logit famil{'ies' if len(unknown) > 1 else 'y'} {unknown} in micro.logits; "
            f"valid: {', '.join(FAMILIES)}"
        )


def fit_vocab(rows: Tensor, vocab: int) -> Tensor:
    """Real rows at another vocabulary: truncated, or padded with each row's minimum. rows: [n, V0] fp32."""
    have = rows.shape[1]
    if vocab <= have:
        return rows[:, :vocab].contiguous()
    pad = rows.min(dim=1, keepdim=True).values.expand(rows.shape[0], vocab - have)
    return torch.cat([rows, pad], dim=1)


def tile(rows: Tensor, n: int) -> Tensor:
    """`rows` repeated to n rows (the first n when there are more). rows: [m, V]."""
    reps = -(-n // rows.shape[0])
    return rows.repeat(reps, 1)[:n].contiguous()


def make_family(
    name: str, rows: int, vocab: int, *, seed: int, device: torch.device, bank_rows: Tensor | None = None
) -> Tensor:
    """The family's fp32 logits [rows, vocab] on `device`, seeded by (seed, rows, the family's name).
    A real family needs `bank_rows` ([m, V0], any float dtype): tiled to `rows`, fitted to `vocab`."""
    family = FAMILIES[name]
    if family.make is None:
        if bank_rows is None:
            raise FamilyError(f"the real family {name!r} needs a logit bank (make logit-bank, or micro.bank=DIR)")
        return tile(fit_vocab(bank_rows.to(device=device, dtype=torch.float32), vocab), rows)
    salt = sum(ord(c) * 31**i for i, c in enumerate(name)) % 2**31
    gen = torch.Generator(device=device).manual_seed((seed * 1_000_003 + rows * 7919 + salt) % 2**63)
    return family.make(rows, vocab, gen)
