"""docs/architecture.md's tree ("## The tree") lists every folder of the code, and only those: a folder moved,
added or removed without the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
PAGE = ROOT / "docs" / "architecture.md"
CODE = ("flows", "runtime", "stages", "artifacts", "configs", "benchmarks")


def documented(page: str) -> set[str]:
    """The folders of the tree's code block: a name ending in `/` at the start of a line, nested by indent
    (two spaces a level)."""
    block = page.split("## The tree", 1)[1].split("```", 2)[1]
    folders, parents = set(), []
    for line in block.splitlines():
        if not (match := re.match(r"( *)([a-z_]+)/( |$)", line)):
            continue
        depth = len(match[1]) // 2
        parents = [*parents[:depth], match[2]]
        folders.add("/".join(parents))
    return folders


def in_code() -> set[str]:
    return {str(p.parent.relative_to(ROOT)) for top in CODE for p in (ROOT / top).rglob("*.py")
            if "__pycache__" not in p.parts}


def test_the_tree_on_the_page_is_the_code_tree():
    assert documented(PAGE.read_text()) == in_code()


def test_nesting_is_read_from_the_indent():
    page = "## The tree\n\n```\nstages/    x\n  data/    y\n  rl/\nflows/\n  cli/   z\n```\n"
    assert documented(page) == {"stages", "stages/data", "stages/rl", "flows", "flows/cli"}
