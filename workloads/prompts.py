"""Prompt formats.

The seed experiment's prompt (the block-verification A/B on AIME 2025): the problem, then
MathArena's final-answer instruction (its `configs/competitions/aime/aime_2025.yaml` text: box the
answer; an integer between 0 and 999). MathArena's own runner puts the instruction first; set
`workload.prompt_template` to reproduce that order instead.
"""

from __future__ import annotations

MATHARENA_AIME_TEMPLATE = (
    "{problem}\n\nPut your final answer within \\boxed{}.\nThe answer is an integer between 0 and 999 inclusive."
)


def math_prompt(problem: str, template: str | None) -> str:
    """The problem inside `template` (its `{problem}` replaced; no other braces are touched)."""
    return (template or MATHARENA_AIME_TEMPLATE).replace("{problem}", problem)


def user_messages(text: str) -> list[dict[str, str]]:
    """`text` as a one-message chat."""
    return [{"role": "user", "content": text}]
