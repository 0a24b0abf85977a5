"""The `synthetic` workload: arithmetic word problems generated offline from a seed.

Every problem has an integer answer in 0..999 and is put in MathArena's AIME prompt, so the default
experiment needs no download and its answers are scored like AIME's. Item `i` depends only on
(`workload.seed`, `workload.level`, `i`): a longer workload extends a shorter one. Categories rotate with `i`.
`workload.level=easy` asks one-digit sums, differences and products instead (a model of 135M parameters
answers some of them; it answers next to none of the standard level's three-digit problems).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from workloads.base import Item, Workload
from workloads.config import WorkloadConfig
from workloads.pipeline import materialise
from workloads.prompts import math_prompt, user_messages
from workloads.read_split import SplitRows
from workloads.subset import Candidate

GENERATOR = "arith-v1"  # bump when the generated text or answers change
EASY_GENERATOR = "arith-easy-v1"  # likewise, for workload.level=easy

_NAMES = ("Ava", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ines", "Jomo", "Kai", "Lena")
_THINGS = ("apples", "marbles", "stickers", "pencils", "coins", "shells", "stamps", "beads")

Problem = tuple[str, int]  # (text, answer)


def _addition(r: random.Random) -> Problem:
    name, things = r.choice(_NAMES), r.choice(_THINGS)
    a, b = r.randint(10, 499), r.randint(10, 499)
    return f"{name} has {a} {things} and is given {b} more. How many {things} does {name} have now?", a + b


def _subtraction(r: random.Random) -> Problem:
    a = r.randint(100, 999)
    b = r.randint(1, a)
    return (
        f"A library owns {a} books and lends out {b} of them. How many books are left on its shelves?",
        a - b,
    )


def _multiplication(r: random.Random) -> Problem:
    name, things = r.choice(_NAMES), r.choice(_THINGS)
    a = r.randint(2, 40)
    b = r.randint(2, 999 // a)
    return f"{name} fills {a} boxes with {b} {things} each. How many {things} are in the boxes?", a * b


def _division(r: random.Random) -> Problem:
    things = r.choice(_THINGS)
    k, q = r.randint(2, 25), r.randint(1, 999)
    return f"{k * q} {things} are shared equally among {k} friends. How many {things} does each friend get?", q


def _remainder(r: random.Random) -> Problem:
    n, d = r.randint(1000, 99999), r.randint(7, 999)
    return f"What is the remainder when {n} is divided by {d}?", n % d


def _multi_step(r: random.Random) -> Problem:
    rows = r.randint(3, 30)
    per_row = r.randint(3, 900 // rows)
    lost = r.randint(0, rows * per_row)
    planted = r.randint(0, 999 - (rows * per_row - lost))
    text = (
        f"An orchard has {rows} rows of {per_row} trees. A storm knocks down {lost} trees, and then "
        f"{planted} new trees are planted. How many trees does the orchard have now?"
    )
    return text, rows * per_row - lost + planted


def _series(r: random.Random) -> Problem:
    n = r.randint(2, 44)
    return f"What is the sum of all the integers from 1 to {n}?", n * (n + 1) // 2


_TEMPLATES: tuple[tuple[str, Callable[[random.Random], Problem]], ...] = (
    ("addition", _addition),
    ("subtraction", _subtraction),
    ("multiplication", _multiplication),
    ("division", _division),
    ("remainder", _remainder),
    ("multi-step", _multi_step),
    ("series", _series),
)


def _easy_addition(r: random.Random) -> Problem:
    a, b = r.randint(1, 9), r.randint(1, 9)
    return f"What is {a} + {b}?", a + b


def _easy_subtraction(r: random.Random) -> Problem:
    a = r.randint(2, 18)
    b = r.randint(1, min(a, 9))
    return f"What is {a} - {b}?", a - b


def _easy_multiplication(r: random.Random) -> Problem:
    a, b = r.randint(2, 9), r.randint(2, 9)
    return f"What is {a} times {b}?", a * b


def _easy_word(r: random.Random) -> Problem:
    name, things = r.choice(_NAMES), r.choice(_THINGS)
    a, b = r.randint(1, 9), r.randint(1, 9)
    return f"{name} has {a} {things} and is given {b} more. How many {things} does {name} have now?", a + b


_EASY_TEMPLATES: tuple[tuple[str, Callable[[random.Random], Problem]], ...] = (
    ("addition", _easy_addition),
    ("subtraction", _easy_subtraction),
    ("multiplication", _easy_multiplication),
    ("word-addition", _easy_word),
)
# workload.level -> (generator id, templates)
LEVELS = {"standard": (GENERATOR, _TEMPLATES), "easy": (EASY_GENERATOR, _EASY_TEMPLATES)}


def generate_rows(seed: int, n_items: int, level: str = "standard") -> list[dict[str, Any]]:
    """The raw rows `{index, category, problem, answer}` of the first `n_items` problems for `seed` at `level`."""
    generator, templates = LEVELS[level]
    rows = []
    for i in range(n_items):
        category, make = templates[i % len(templates)]
        text, answer = make(random.Random(f"{generator}:{seed}:{i}"))
        rows.append({"index": i, "category": category, "problem": text, "answer": answer})
    return rows


def load(cfg: WorkloadConfig) -> Workload:
    """The synthetic workload of `workload.n_items` problems from `workload.seed`."""
    generator = LEVELS[cfg.level][0]
    src = SplitRows(
        rows=generate_rows(cfg.seed, cfg.n_items, cfg.level),
        dataset_id=f"synthetic:{generator}",
        revision=f"seed={cfg.seed},n_items={cfg.n_items}",
        origin="generated",
        label=f"synthetic {generator} seed {cfg.seed} ({cfg.n_items} items)",
    )
    return materialise(cfg, src, lambda rows: [_candidate(cfg, row) for row in rows])


def _candidate(cfg: WorkloadConfig, row: dict[str, Any]) -> Candidate:
    prompt = math_prompt(row["problem"], cfg.prompt_template)
    item = Item(
        item_id=str(row["index"]),
        seed_offset=row["index"],
        prompt=prompt,
        messages=user_messages(prompt),
        answer=str(row["answer"]),
        category=row["category"],
    )
    return Candidate(item=item, categories=(row["category"],))
