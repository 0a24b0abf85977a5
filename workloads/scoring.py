"""Answer scoring in MathArena's way: the content of the LAST `\\boxed{...}` against the reference.

- Extraction: the last complete `\\boxed{...}` (or `\\fbox{...}`) of the whole response, thinking
  included, braces matched (LaTeX-escaped `\\{`/`\\}` do not count); boxes nested in it are
  unwrapped. A box left open at the end (a response cut by the token cap) does not count, nor an empty
  box after an answer (a repeated "put your final answer within \\boxed{}").
- Fallback (MathArena, `strict_parsing: false`): when nothing is boxed, the last integer of the text,
  flagged `fallback=True`.
- Comparison: integer against integer after light normalisation (`042` = 42, `\\text{42}`,
  `42^\\circ`, `1{,}000`, `1\\,000`, `1 000`; digits apart otherwise are no integer: `4 2` != 42, and
  more than 1,000 digits are none); anything else goes to math-verify (`\\frac{84}{2}` = 42,
  `x = 42` = 42, `\\frac{1}{2}` != 1).
"""

from __future__ import annotations

import importlib.metadata
import re
import threading
from dataclasses import dataclass

_BOX_MARKERS = ("\\boxed", "\\fbox")
_LAST_INT = re.compile(r"\b\d+\b")  # MathArena's `extract_last_integer`
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|boldsymbol|mbox)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;:! ]|~|\\quad|\\qquad")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|°")
_INT = re.compile(r"[+-]?\d+")
_GROUPED_INT = re.compile(r"\d{1,3}(?:,\d{3})+")
_INTEGRAL_DECIMAL = re.compile(r"([+-]?\d+)\.0*")
_MAX_VERIFY_CHARS = 400  # longer "answers" are compared as strings (sympy can hang on junk)
_MAX_INT_DIGITS = 1000
_DIGIT_GAP = re.compile(r"(?<=\d)(?:\s|\\[,;:! ]|~)+(?=\d)")  # space between two digits: "1 000", "1\\,000"


@dataclass
class Score:
    """The scored answer of one response."""

    answer: str | None  # what was extracted
    correct: bool | None  # None when there is no reference or scoring is off
    fallback: bool  # came from the last-integer fallback


@dataclass(frozen=True)
class Scorer:
    """Scores responses: `mode` boxed | none; `fallback_last_integer` as MathArena's non-strict parsing."""

    mode: str = "boxed"
    fallback_last_integer: bool = True

    @property
    def name(self) -> str:
        """What produces the verdicts: "boxed+math-verify" (the last box, else the last integer, compared
        by math-verify), "boxed-strict+math-verify" (no last-integer fallback), or "none"."""
        if self.mode == "none":
            return "none"
        return "boxed+math-verify" if self.fallback_last_integer else "boxed-strict+math-verify"

    @property
    def version(self) -> str | None:
        """The installed math-verify's version (None for mode none, or when it is not installed)."""
        if self.mode == "none":
            return None
        try:
            return importlib.metadata.version("math-verify")
        except importlib.metadata.PackageNotFoundError:
            return None

    @property
    def label(self) -> str:
        """`name version` as scores.jsonl records it ("none" alone for mode none)."""
        return f"{self.name} {self.version}" if self.version else self.name

    def score(self, output_text: str | None, reference: str | None) -> Score:
        """Extract the answer of `output_text` and compare it with `reference` (None: no verdict)."""
        if self.mode == "none":
            return Score(answer=None, correct=None, fallback=False)
        text = output_text or ""
        answer, fallback = last_boxed(text), False
        if answer is None and self.fallback_last_integer:
            answer = last_integer(text)
            fallback = answer is not None
        if reference is None:
            return Score(answer=answer, correct=None, fallback=fallback)
        correct = answer is not None and answers_match(answer, reference)
        return Score(answer=answer, correct=correct, fallback=fallback)


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}`/`\\fbox{...}` in `text` that is not empty (an empty box, as in
    a repeated "put your answer within \\boxed{}", answers nothing), inner boxes unwrapped."""
    last: str | None = None
    pos = 0
    while (found := _next_box(text, pos)) is not None:
        content, pos = found
        if (inner := _unwrap_boxes(content).strip()) or last is None:
            last = inner
    return last


def last_integer(text: str) -> str | None:
    """The last run of digits standing as a word (MathArena's fallback), or None."""
    matches = _LAST_INT.findall(text)
    return matches[-1] if matches else None


def answers_match(answer: str, reference: str) -> bool:
    """True when the extracted `answer` equals `reference`: as integers, else by math-verify."""
    ref_int, ans_int = as_integer(reference), as_integer(answer)
    if ref_int is not None and ans_int is not None:
        return ref_int == ans_int
    if len(answer) > _MAX_VERIFY_CHARS:
        return _normalise(answer) == _normalise(reference)
    return _math_verify_equal(answer, reference)


def as_integer(value: str) -> int | None:
    """`value` as an integer after light LaTeX normalisation, or None when it is not one (nor one of at most
    _MAX_INT_DIGITS digits: a response that loops on digits is no answer, and Python refuses to read such a number)."""
    s = _normalise(value)
    if len(s) > _MAX_INT_DIGITS:
        return None
    if _INT.fullmatch(s):
        return int(s)
    if _GROUPED_INT.fullmatch(s):
        return int(s.replace(",", ""))
    if m := _INTEGRAL_DECIMAL.fullmatch(s):
        return int(m.group(1))
    return None


def _next_box(text: str, start: int) -> tuple[str, int] | None:
    """The first complete box at or after `start`: (its content, the index after it)."""
    while True:
        hits = [(i, m) for m in _BOX_MARKERS if (i := text.find(m, start)) >= 0]
        if not hits:
            return None
        i, marker = min(hits)
        j = i + len(marker)
        while j < len(text) and text[j].isspace():
            j += 1
        if j < len(text) and text[j] == "{" and (end := _matching_brace(text, j)) is not None:
            return text[j + 1 : end], end + 1
        start = i + len(marker)


def _matching_brace(text: str, open_at: int) -> int | None:
    """Index of the `}` closing the `{` at `open_at` (LaTeX escapes `\\{`, `\\}` skipped), or None."""
    depth, k = 0, open_at
    while k < len(text):
        c = text[k]
        if c == "\\":
            k += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return k
        k += 1
    return None


def _unwrap_boxes(content: str) -> str:
    """Replace every `\\boxed{x}` inside `content` by `x`."""
    while (found := _first_box_span(content)) is not None:
        start, inner_start, end = found
        content = content[:start] + content[inner_start:end] + content[end + 1 :]
    return content


def _first_box_span(text: str) -> tuple[int, int, int] | None:
    for marker in _BOX_MARKERS:
        i = text.find(marker)
        if i < 0:
            continue
        j = i + len(marker)
        while j < len(text) and text[j].isspace():
            j += 1
        if j < len(text) and text[j] == "{" and (end := _matching_brace(text, j)) is not None:
            return i, j + 1, end
    return None


def _normalise(value: str) -> str:
    s = value.strip().strip("$").strip()
    for _ in range(3):  # nested wrappers: \textbf{\text{42}}
        s = _WRAPPERS.sub(r"\1", s)
    s = _DIGIT_GAP.sub(",", s)  # a thousands separator ("1 000" reads as 1,000); "4 2" is then no integer
    s = _SPACING.sub("", s)
    s = _DEGREES.sub("", s)
    s = s.replace("{,}", ",").replace(" ", "")
    return s.rstrip(".")


def _math_verify_equal(answer: str, reference: str) -> bool:
    import math_verify  # noqa: PLC0415  (sympy is slow to import; most answers never get here)

    # math-verify times out with signal.alarm, which only works in the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = math_verify.parse(f"${reference}$", parsing_timeout=timeout)
    pred = math_verify.parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    if not gold or not pred:
        return _normalise(answer) == _normalise(reference)
    return bool(math_verify.verify(gold, pred, timeout_seconds=timeout))
