"""A commit message's subject is at most 72 characters and, when a body follows, a blank line separates them
(`git log --oneline` and every tool that shows one line per commit then show the whole subject).

    python .ci/commit_subject.py MESSAGE_FILE     # pre-commit's commit-msg hook passes the file
"""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 72


def problems(message: str) -> list[str]:
    lines = [line for line in message.splitlines() if not line.startswith("#")]  # git's comment lines
    if not lines or not lines[0].strip():
        return ["the subject (first line) is empty"]
    found = []
    if len(lines[0]) > LIMIT:
        found.append(f"the subject is {len(lines[0])} characters; at most {LIMIT}, the details in the body")
    if len(lines) > 1 and lines[1].strip():
        found.append("a blank line goes between the subject and the body")
    return found


def main(argv: list[str]) -> int:
    for problem in problems(Path(argv[1]).read_text()):
        print(f"commit message: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
