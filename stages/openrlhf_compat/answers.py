"""Final answers in LaTeX's `\\boxed{...}`, and whether two answers are the same: what OpenRLHF's
`openrlhf.utils.extract_boxed_answer` and `grade_answer` give a math reward function. Pure functions."""

from __future__ import annotations

import re
from fractions import Fraction

BOXED = ("\\boxed", "\\fbox")
# LaTeX that changes how an answer looks, not what it is
NOISE = (r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", r"\displaystyle", "$", " ")
# A number written in more characters than this, or with a power of ten beyond it, is compared as text only: its
# exact value would take minutes and gigabytes to build (`1e999999999` is a billion-digit integer).
MAX_DIGITS = 1000
EXPONENT = re.compile(r"[eE]([-+]?[\d_]+)")


def extract_boxed_answer(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None without one."""
    start = max(text.rfind(b) for b in BOXED)
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0:
        return None
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1 : i]
    return None  # unbalanced: no answer


def normalize(answer: str) -> str:
    """An answer's text with LaTeX spacing, `\\text{}`, `\\dfrac`, a trailing period and thousands separators
    taken away."""
    s = answer.strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for noise in NOISE:
        s = s.replace(noise, "")
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def as_number(answer: str) -> Fraction | None:
    """An exact value for an integer, a decimal, `a/b` or `\\frac{a}{b}` (with a sign), else None (also for a
    number `exact` refuses to build)."""
    s = normalize(answer)
    frac = re.fullmatch(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s) or re.fullmatch(r"(-?)\\frac(\d)(\d)", s)
    try:
        if frac:
            value = exact(frac.group(2)) / exact(frac.group(3))
            return -value if frac.group(1) else value
        if "/" in s:
            top, bottom = s.split("/", 1)
            return exact(top) / exact(bottom)
        return exact(s)
    except (ValueError, ZeroDivisionError):
        return None


def exact(number: str) -> Fraction:
    """`Fraction(number)`, refused (ValueError) for a text longer than `MAX_DIGITS` or a power of ten beyond it,
    which `Fraction` would multiply out."""
    if len(number) > MAX_DIGITS:
        raise ValueError(f"more than {MAX_DIGITS} characters: {number[:40]!r}...")
    power = EXPONENT.search(number)
    if power and abs(int(power.group(1).replace("_", ""))) > MAX_DIGITS:
        raise ValueError(f"a power of ten beyond {MAX_DIGITS}: {number[:40]!r}")
    return Fraction(number)


def grade_answer(given: str | None, ground_truth: str | None) -> bool:
    """Whether `given` is `ground_truth`: the same text once normalized, or the same exact number."""
    if given is None or ground_truth is None:
        return False
    if normalize(given) == normalize(ground_truth):
        return True
    a, b = as_number(given), as_number(ground_truth)
    return a is not None and b is not None and a == b
