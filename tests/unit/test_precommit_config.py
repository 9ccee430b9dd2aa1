""".pre-commit-config.yaml runs the static checks of the README's test command (and the fast lane's unit
tests), and pre-commit itself accepts the file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parent.parent.parent


def readme_checks() -> list[str]:
    """The commands between the install and pytest in the README's test command: `ruff check`, `mypy`."""
    text = (ROOT / "README.md").read_text()
    command = text.split("<!-- test-command -->", 1)[1].split("```bash\n", 1)[1].split("\n", 1)[0]
    steps = [step.strip() for step in command.split("&&")]
    return [step for step in steps if re.match(r"(ruff|mypy)\b", step)]


def test_every_static_check_of_the_readme_runs_before_a_commit():
    hooks = [hook for repo in yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
             for hook in repo["hooks"] if "commit-msg" not in hook.get("stages", [])]
    entries = [hook["entry"] for hook in hooks]
    assert readme_checks() == ["ruff check", "mypy"]
    assert [entry for entry in entries if not entry.startswith("pytest")] == readme_checks()
    assert 'pytest -q -m "not slow" tests/unit' in entries
    assert all(hook["pass_filenames"] is False for hook in hooks)  # the whole tree, as CI checks it


def test_pre_commit_accepts_the_file():
    done = subprocess.run([sys.executable, "-m", "pre_commit", "validate-config", ".pre-commit-config.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def subject_problems(message: str) -> list[str]:
    sys.path.insert(0, str(ROOT / ".ci"))
    try:
        from commit_subject import problems
    finally:
        sys.path.remove(str(ROOT / ".ci"))
    return problems(message)


def test_a_commit_subject_of_72_characters_passes_and_73_does_not():
    assert subject_problems("x" * 72 + "\n\nWhy, at length.\n") == []
    assert subject_problems("x" * 73) == ["the subject is 73 characters; at most 72, the details in the body"]
    assert subject_problems("Subject\nbody without a blank line") == ["a blank line goes between the subject and the body"]
    assert subject_problems("# a comment git adds\n\n") == ["the subject (first line) is empty"]
