"""What a benchmark registered in `python -m benchmarks` receives and hands back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunOptions:
    """Settings shared by every benchmark of one `python -m benchmarks run`."""

    steps: int | None  # optimizer steps per trial; None: the benchmark's own default
    repeats: int | None  # trials per system; None: the benchmark's own default
    workdir: Path  # scratch space that lives as long as the run (benchmarks may share data there)
    overrides: list[str] = field(default_factory=list)  # KEY=VALUE config overrides (the pipeline benchmark)
    # SFT steps of the start policy the GRPO-family benchmarks train (grpo, rl, rollout); None: their default
    sft_steps: int | None = None
    # the systems the GRPO comparisons (grpo, grpo-50m) run, a subset of their size's; None: all of them
    systems: list[str] | None = None
    # the scale benchmark: row counts of its files, the checkpoint's shape, where its generated files are kept
    scale_rows: list[int] | None = None
    scale_model: str | None = None
    scale_cache: Path | None = None

    def repeats_or(self, default: int) -> int:
        return self.repeats or default


@dataclass
class Report:
    """One benchmark's result: a markdown table for people and the raw measurements for the JSON."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    data: dict = field(default_factory=dict)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def as_json(self) -> dict:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, **self.data}


def folder_for(workdir: Path, name: str, overrides) -> Path:
    """A scratch folder per set of config overrides: `name`, `name-key_value-...`, or for a long set `name-<hash>`."""
    folder = "-".join([name, *(o.replace("=", "_") for o in overrides)])
    if len(folder) > 120:  # file names stop at 255 bytes
        folder = f"{name}-{hashlib.sha1(' '.join(overrides).encode()).hexdigest()[:12]}"
    return workdir / folder


def add_result_args(parser, out: str) -> None:
    """A standalone benchmark's `--out` (the JSON it writes) and `--report` (render a saved one instead)."""
    parser.add_argument("--out", default=out)
    parser.add_argument("--report", metavar="JSON", help="print the table of a result file and exit")


def print_saved(path: str | Path, render: Callable[[dict], str]) -> int:
    print(render(json.loads(Path(path).read_text())), end="")
    return 0


def with_note(lines: list[str], result: dict) -> str:
    """A standalone benchmark's table lines as one text, with the line about its run's conditions."""
    if result.get("note"):
        lines = [*lines, "", f"Note: {result['note']}."]
    return "\n".join(lines) + "\n"


def save(result: dict, out: str | Path, render: Callable[[dict], str]) -> None:
    """Write a standalone benchmark's result as JSON to `out` and print its table."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result), end="")
