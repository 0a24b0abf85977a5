"""Answer scoring: the last \\boxed{} against the reference, MathArena's fallback, math-verify."""

from __future__ import annotations

import threading

import pytest

from workloads.scoring import Score, Scorer, answers_match, as_integer, last_boxed, last_integer

B = "\\boxed"

# (case id, response, reference, extracted answer, correct, from the fallback)
TRICKY = [
    ("plain", f"The answer is {B}{{70}}.", "70", "70", True, False),
    ("several boxes, last wins", f"First {B}{{12}}, then corrected: {B}{{70}}", "70", "70", True, False),
    ("several boxes, last is wrong", f"{B}{{70}}. Wait, actually {B}{{71}}", "70", "71", False, False),
    ("nested braces", f"{B}{{\\frac{{140}}{{2}}}}", "70", "\\frac{140}{2}", True, False),
    ("dfrac", f"{B}{{\\dfrac{{140}}{{2}}}}", "70", "\\dfrac{140}{2}", True, False),
    ("fraction vs integer", f"{B}{{\\frac{{1}}{{2}}}}", "1", "\\frac{1}{2}", False, False),
    ("fraction vs zero", f"{B}{{\\frac{{1}}{{2}}}}", "0", "\\frac{1}{2}", False, False),
    ("leading zeros", f"{B}{{042}}", "42", "042", True, False),
    ("leading zeros, reference too", f"{B}{{42}}", "042", "42", True, False),
    ("text wrapper", f"{B}{{\\text{{70}}}}", "70", "\\text{70}", True, False),
    ("text, not a number", f"{B}{{\\text{{no solution}}}}", "70", "\\text{no solution}", False, False),
    ("equation", f"{B}{{x = 70}}", "70", "x = 70", True, False),
    ("degrees", f"{B}{{70^\\circ}}", "70", "70^\\circ", True, False),
    ("negative", f"{B}{{-70}}", "70", "-70", False, False),
    ("grouped digits", f"{B}{{1{{,}}000}}", "1000", "1{,}000", True, False),
    ("in dollars", f"so ${B}{{70}}$", "70", "70", True, False),
    ("spaces", f"{B} {{ 70 }}", "70", "70", True, False),
    ("fbox", "\\fbox{70}", "70", "70", True, False),
    ("box in a box", f"{B}{{{B}{{70}}}}", "70", "70", True, False),
    ("escaped braces", f"{B}{{\\{{1, 2\\}}}}", "70", "\\{1, 2\\}", False, False),
    ("empty box", f"{B}{{}} and 70", "70", "", False, False),
    ("empty box after the answer", f"So {B}{{42}}.\n\nPut your final answer within {B}{{}}.", "42", "42", True, False),
    ("spaced digits are not one number", f"{B}{{4 2}}", "42", "4 2", False, False),
    ("thin-spaced digits are not one number", f"{B}{{4\\,2}}", "42", "4\\,2", False, False),
    ("thousands with a space", f"{B}{{1 000}}", "1000", "1 000", True, False),
    ("thousands with a thin space", f"{B}{{1\\,000}}", "1000", "1\\,000", True, False),
    ("a loop of digits", f"{B}{{{'1' * 5000}}}", "42", "1" * 5000, False, False),  # past Python's int limit
    ("a loop of digits, no box", "The answer is " + "0" * 5000, "42", "0" * 5000, False, True),
    ("box cut by the token cap", f"{B}{{70}} but let me recheck... {B}{{7", "70", "70", True, False),
    (
        "thinking before the answer",
        "<think>Try 12. No, 15 fails too. Let me recount: 70.</think>\nThe answer is " + f"{B}{{70}}",
        "70",
        "70",
        True,
        False,
    ),
    (
        "boxed in <think>, then a final box",
        f"<think>Maybe {B}{{12}}? No.</think>\nFinal answer: {B}{{70}}",
        "70",
        "70",
        True,
        False,
    ),
    (
        "boxed only in <think>: the whole response counts",
        f"<think>So {B}{{12}}.</think>\nThe answer is 70.",
        "70",
        "12",
        False,
        False,
    ),
    ("no box: last integer, flagged", "We get 3 cases, so the total is 588.", "588", "588", True, True),
    ("no box: last integer is wrong", "The total is 588, times 2.", "588", "2", False, True),
    ("no box, no integer", "I could not solve it.", "70", None, False, False),
    ("empty response", "", "70", None, False, False),
]


@pytest.mark.parametrize(
    ("text", "reference", "answer", "correct", "fallback"),
    [case[1:] for case in TRICKY],
    ids=[case[0] for case in TRICKY],
)
def test_tricky_outputs(text: str, reference: str, answer: str | None, correct: bool, fallback: bool) -> None:
    assert Scorer().score(text, reference) == Score(answer=answer, correct=correct, fallback=fallback)


def test_fallback_can_be_turned_off() -> None:
    scorer = Scorer(fallback_last_integer=False)
    assert scorer.score("the total is 588", "588") == Score(answer=None, correct=False, fallback=False)
    assert scorer.score(f"{B}{{588}}", "588") == Score(answer="588", correct=True, fallback=False)


def test_no_reference_extracts_without_verdict() -> None:
    assert Scorer().score(f"{B}{{70}}", None) == Score(answer="70", correct=None, fallback=False)
    assert Scorer().score("about 70", None) == Score(answer="70", correct=None, fallback=True)


def test_scoring_none_gives_nothing() -> None:
    assert Scorer(mode="none").score(f"{B}{{70}}", "70") == Score(answer=None, correct=None, fallback=False)


def test_last_integer_follows_matharena() -> None:
    # MathArena's pattern is \b\d+\b: digits standing as a word.
    assert last_integer("x^2 = 49, so x = 7") == "7"
    assert last_integer("about 3.14") == "14"
    assert last_integer("abc12 then nothing") is None


def test_last_boxed_unwraps_and_ignores_unclosed() -> None:
    assert last_boxed(f"{B}{{a}} {B}{{b {B}{{c}}}}") == "b c"
    assert last_boxed(f"{B}{{\\left\\{{x\\right\\}}}}") == "\\left\\{x\\right\\}"
    assert last_boxed(f"{B}{{unclosed") is None
    assert last_boxed("no box here") is None


def test_as_integer_normalisation() -> None:
    assert as_integer(" 042 ") == 42
    assert as_integer("\\textbf{\\text{7}}") == 7
    assert as_integer("1,234") == 1234
    assert as_integer("42.00") == 42
    assert as_integer("4.2") is None
    assert as_integer("1,2") is None
    assert as_integer("\\frac{1}{2}") is None


def test_non_integer_references_use_math_verify() -> None:
    assert answers_match("0.5", "\\frac{1}{2}")
    assert answers_match("\\frac{2}{4}", "\\frac{1}{2}")
    assert not answers_match("\\frac{1}{3}", "\\frac{1}{2}")
    assert answers_match("\\sqrt{4}", "2")


def test_math_verify_path_works_off_the_main_thread() -> None:
    # math-verify's default timeout uses signal.alarm, which raises outside the main thread.
    results: list[object] = []

    def work() -> None:
        try:
            results.append(Scorer().score(f"{B}{{\\frac{{140}}{{2}}}}", "70"))
        except Exception as e:  # the assertion below shows it  # noqa: BLE001
            results.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert results == [Score(answer="\\frac{140}{2}", correct=True, fallback=False)]


def test_long_junk_is_compared_as_text() -> None:
    junk = "9" * 1000 + "^{" + "9" * 50 + "}"
    assert Scorer().score(f"{B}{{{junk}}}", "70") == Score(answer=junk, correct=False, fallback=False)
