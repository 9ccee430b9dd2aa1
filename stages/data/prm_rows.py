"""PRM rows read from files, in Math-Shepherd's format as OpenRLHF's train_prm reads it: one text per
row (`data.prm.input_key`) in which `prm.placeholder_token` ends every step, and per step one of
`prm.reward_tokens` (`data.prm.label_key`).

The label column may be a list (`["+", "-"]`, OpenRLHF's form), a string of the labels alone (`"+-"`,
`"+ -"`), or Math-Shepherd's own string: the text with each placeholder replaced by its label. A row whose
labels do not match its placeholders one for one is an error (OpenRLHF would cut the labels to fit).
"""

from __future__ import annotations

from configs.errors import DataError


def step_labels(text: str, label: list[str] | str, placeholder: str, reward_tokens: tuple[str, str],
                keys: tuple[str, str] = ("input", "label")) -> list[str]:
    """One reward token per placeholder of `text`; `keys` are the input and label columns, for errors."""
    input_key, label_key = keys
    steps = text.count(placeholder)
    if not steps:
        raise DataError(f"{input_key!r} has no step placeholder {placeholder!r} (prm.placeholder_token): each step "
                        "must end with one")
    labels = label if isinstance(label, list) else labels_alone(label, reward_tokens)
    count = len(labels) if labels is not None else 0
    if isinstance(label, str) and labels is None:  # Math-Shepherd: the text with each placeholder replaced by its label
        count = labels_in_text_count(text, label, placeholder, reward_tokens)
        labels = labels_in_text(text, label, placeholder, reward_tokens, keys) if count == steps else None
    if count != steps:
        raise DataError(f"{input_key!r} has {steps} step placeholder{'s' * (steps != 1)} {placeholder!r} but {label_key!r} "
                        f"has {count} step label{'s' * (count != 1)}; give one of {' / '.join(reward_tokens)} per step")
    assert labels is not None
    bad = next((lab for lab in labels if lab not in reward_tokens), None)
    if bad is not None:
        raise DataError(f"{label_key!r} holds the step label {bad!r}, not one of prm.reward_tokens "
                        f"{' / '.join(reward_tokens)}")
    return labels


def labels_alone(label: str, reward_tokens: tuple[str, str]) -> list[str] | None:
    """`"+-+"` or `"+ - +"` as its labels; None when the string holds anything else."""
    rest, labels = "".join(label.split()), []
    longest_first = sorted(reward_tokens, key=len, reverse=True)
    while rest:
        token = next((t for t in longest_first if rest.startswith(t)), None)
        if token is None:
            return None
        labels.append(token)
        rest = rest[len(token):]
    return labels


def labels_in_text_count(text: str, label: str, placeholder: str, reward_tokens: tuple[str, str]) -> int:
    """How many labels a Math-Shepherd label string holds: its reward tokens less those the text's own
    words hold (`17+5` has a `+` of its own)."""
    words = text.replace(placeholder, "")
    return sum(label.count(t) - words.count(t) for t in reward_tokens)


def labels_in_text(text: str, label: str, placeholder: str, reward_tokens: tuple[str, str],
                   keys: tuple[str, str]) -> list[str]:
    """The labels of a Math-Shepherd label string, read where the text has its placeholders; the rest of
    the two strings must agree."""
    input_key, label_key = keys
    pieces = text.split(placeholder)
    longest_first = sorted(reward_tokens, key=len, reverse=True)
    labels: list[str] = []
    at = 0
    for i, piece in enumerate(pieces):
        if not label.startswith(piece, at):
            raise DataError(f"{label_key!r} is not {input_key!r} with each {placeholder!r} replaced by its step label: "
                            f"they differ from character {at + _common_prefix(piece, label[at:])}")
        at += len(piece)
        if i == len(pieces) - 1:
            break
        token = next((t for t in longest_first if label.startswith(t, at)), None)
        if token is None:
            raise DataError(f"{label_key!r} has no step label at character {at}, where {input_key!r} has step "
                            f"{i + 1}'s placeholder; give one of {' / '.join(reward_tokens)} there")
        labels.append(token)
        at += len(token)
    if at != len(label):
        raise DataError(f"{label_key!r} goes on after the text of {input_key!r} ends (character {at})")
    return labels


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
