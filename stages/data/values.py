"""What each column of a user's dataset must hold (OpenRLHF's formats: text, or chat messages
`[{"role": ..., "content": ...}]`), and what is wrong with a value that does not.

HF `datasets` keeps a JSON value as it was written (`"question": 42` stays the number 42) and
renders whatever it gets, so a wrong type is caught here, per value, before any rendering.
"""

from __future__ import annotations

from configs.schema import DatasetConfig

TEXT = "a string"
PROMPT = "a string or a list of {role, content} messages"
CONVERSATION = "a list of {role, content} messages with at least one assistant turn"
RESPONSE = "a string, or a list of {role, content} messages ending with the assistant's reply"
NUMBER = "a number"
LABEL = "a string, a number, or a list of {role, content} messages (the last one's content is the label)"
STEP_LABELS = "a list of step labels (e.g. [\"+\", \"-\"]) or a string of them"
BOOLEAN = "true or false (or 1 / 0)"
TRUE_TEXT, FALSE_TEXT = ("true", "1"), ("false", "0")  # a CSV column is text: how a boolean reads there


def value_kinds(section: str, cfg: DatasetConfig, pretrain: bool = False) -> dict[str, str]:
    """Config field -> what the column it names must hold, for every column a dataset kind reads
    (`pretrain`: sft.pretrain_mode's plain-text rows)."""
    if section == "sft":
        if pretrain:
            return {"input_key": TEXT}
        return {"input_key": CONVERSATION} if cfg.multiturn else {"input_key": PROMPT, "output_key": TEXT}
    if section == "preference":
        if cfg.unpaired:
            return {"input_key": PROMPT, "output_key": RESPONSE, "label_key": BOOLEAN}
        return {"input_key": PROMPT, "chosen_key": RESPONSE, "rejected_key": RESPONSE, "margin_key": NUMBER}
    if section == "prm":
        return {"input_key": TEXT, "label_key": STEP_LABELS}
    return {"input_key": PROMPT, "label_key": LABEL}


def as_boolean(value) -> bool | None:
    """A desirable label as a bool (true / false, 1 / 0, or their text); None for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in (*TRUE_TEXT, *FALSE_TEXT):
        return value.strip().lower() in TRUE_TEXT
    return None


def problem(value, kind: str, required: bool = True) -> str | None:
    """What is wrong with `value` as `kind`, phrased to follow the column's name; None when it is fine.
    An optional column may be null or empty (the row then has no such value)."""
    if _is_empty(value):
        return "is missing or empty; give it a value or remove the row" if required else None
    if kind == BOOLEAN:
        return None if as_boolean(value) is not None else f"must be {kind}, not {describe(value)}"
    if kind == STEP_LABELS and isinstance(value, list):
        bad = next((v for v in value if not isinstance(v, str)), None)
        return None if bad is None else f"must be {kind}, not a list holding {describe(bad)}"
    if isinstance(value, str):
        if kind in (TEXT, PROMPT, RESPONSE, LABEL, STEP_LABELS):
            return None
        if kind == NUMBER:
            return None if _is_number_text(value) else f"must be {kind}, not {describe(value)}"
    elif isinstance(value, list) and kind in (PROMPT, CONVERSATION, RESPONSE):
        return _chat_problem(value, kind)
    elif isinstance(value, list) and kind == LABEL:  # a conversation's last turn as the label (a preference set's chosen)
        return _chat_problem(value, PROMPT)
    elif isinstance(value, int | float) and not isinstance(value, bool) and kind in (NUMBER, LABEL):
        return None
    return f"must be {kind}, not {describe(value)}"


def _chat_problem(messages: list, kind: str) -> str | None:
    for k, message in enumerate(messages, 1):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str)):
            return f"message {k} must be {{\"role\": ..., \"content\": \"...\"}} with text content, not {describe(message)}"
    roles = [m["role"] for m in messages]
    if kind == CONVERSATION and "assistant" not in roles:
        return "has no assistant turn, so nothing to train on; add the assistant's reply or remove the row"
    if kind == RESPONSE:
        if roles[-1] != "assistant":
            return f"must end with the assistant's reply (the response), not a {roles[-1]!r} turn"
        if not messages[-1]["content"].strip():
            return "ends with an empty assistant reply; give it a value or remove the row"
    return None


def _is_empty(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value)


def _is_number_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def describe(value) -> str:
    """A value as a message names it: `the number 42`, `a list`, ..."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__
