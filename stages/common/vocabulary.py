"""Whether a teacher and a student share a tokenizer: the same token -> id map and logits over the same
number of tokens. Read from a checkpoint's files (tokenizer.json, config.json) without transformers, so
the pre-run checks can use it; the kd stage compares the loaded tokenizers the same way."""

from __future__ import annotations

import json
from pathlib import Path


def file_vocabulary(path: str | Path) -> dict[str, int] | None:
    """token -> id of a local checkpoint's tokenizer.json (its model's vocabulary and the added tokens);
    None where it has none (a slow tokenizer's files: the stage compares the loaded tokenizers)."""
    file = Path(path).expanduser() / "tokenizer.json"
    if not file.is_file():
        return None
    data = json.loads(file.read_text())
    vocab = data.get("model", {}).get("vocab")
    if isinstance(vocab, dict):
        tokens = dict(vocab)
    elif isinstance(vocab, list):  # Unigram: [piece, score] in id order
        tokens = {entry[0]: i for i, entry in enumerate(vocab)}
    else:
        return None
    tokens.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    return tokens


def logit_width(path: str | Path) -> int | None:
    """The `vocab_size` of a local checkpoint's config.json (a multimodal config's text part too)."""
    file = Path(path).expanduser() / "config.json"
    if not file.is_file():
        return None
    config = json.loads(file.read_text())
    return config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")


def mismatch(teacher: dict[str, int], student: dict[str, int], teacher_width: int | None,
             student_width: int | None, theirs: str = "the student's") -> str | None:
    """What differs between the teacher's and the student's tokenizers, in a phrase; None when nothing.
    `theirs` names the second one in the phrase (a critic's checks name the policy's)."""
    if teacher_width is not None and student_width is not None and teacher_width != student_width:
        return f"its logits cover {teacher_width} tokens, {theirs} {student_width}"
    if len(teacher) != len(student):
        return f"its vocabulary has {len(teacher)} tokens, {theirs} {len(student)}"
    differing = sorted(token for token in teacher.keys() | student.keys() if teacher.get(token) != student.get(token))
    if differing:
        token = differing[0]
        return f"token {token!r} has id {teacher.get(token)} in it, {student.get(token)} in {theirs}"
    return None


def message(teacher_field: str, student: str, problem: str) -> str:
    return (f"{teacher_field}: the teacher's tokenizer differs from the student's ({student}): {problem}; "
            "distil a teacher that shares the student's tokenizer and vocabulary")
