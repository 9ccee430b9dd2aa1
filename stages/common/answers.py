"""Final-answer extraction and checking for tasks with a reference answer."""

from __future__ import annotations

import re


def extract_answer(text: str, pattern: str) -> str | None:
    """The first group of the last match of `pattern` in `text`, stripped; None when absent."""
    matches = re.findall(pattern, text)
    if not matches:
        return None
    last = matches[-1]
    return (last[0] if isinstance(last, tuple) else last).strip()


def matches(answer: str | None, label: str | None) -> bool:
    """An extracted answer equals the reference label (whitespace aside); a row without a label has no right answer."""
    return answer is not None and label is not None and answer == label.strip()


def is_correct(text: str, label: str | None, pattern: str) -> bool:
    return matches(extract_answer(text, pattern), label)
