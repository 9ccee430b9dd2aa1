"""The benchmark tables of the docs, rendered from the JSON the benchmarks wrote, so no number is pasted by hand.

    python -m benchmarks report            # rewrite every marked table in the docs from its JSON
    python -m benchmarks report --check    # exit 1, naming them, where a table is not what its JSON renders

A table in a docs page sits between two markers that name its JSON file (and, for a file of
`python -m benchmarks run`, which benchmark of it):

    <!-- table: benchmarks/results/agent-90.json#agent -->
    ...rendered here...
    <!-- /table -->

Each kind of result file has one renderer, the function its benchmark prints its own `--report` with.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/benchmarks.md", "docs/gpu.md", "docs/own-task.md", "docs/testing.md")
MARKED = re.compile(r"(<!-- table: (?P<path>[\w./-]+?)(?:#(?P<name>[\w-]+))? -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
# a result file's "benchmark" -> the function that renders it (module:function), imported when used
RENDERERS = {
    "packing": "benchmarks.packing:report",
    "shared-rows": "benchmarks.shared_rows:report",
    "weight_sync": "benchmarks.weight_sync:report",
    "gpu_stages": "benchmarks.gpu_stages:report",
    "gpu_smoke": "benchmarks.gpu_smoke:report",
    "gpu_grpo": "benchmarks.gpu_grpo:report",
    "methods": "benchmarks.methods:markdown",
    "freeform": "benchmarks.freeform:markdown",
    "suite": "benchmarks.suite:report",
}


def machine_line(result: dict) -> str:
    m = result["machine"]
    return (f"Measured {result['date']} on {m['cpus']} CPUs ({m['platform']}), torch {m['torch']}, transformers "
            f"{m['transformers']}" + (f", TRL {m['trl']}" if m.get("trl") else "") + ".")


def run_report(result: dict, name: str) -> str:
    """One benchmark's table from a `python -m benchmarks run` file (its stored title, columns and rows)."""
    if name not in result["benchmarks"]:
        raise KeyError(f"no benchmark {name!r} in this file (it holds: {', '.join(result['benchmarks'])})")
    report = result["benchmarks"][name]
    lines = [f"{report['title']}. {machine_line(result)}", "", "| " + " | ".join(report["columns"]) + " |",
             "|" + "---|" * len(report["columns"])]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in report["rows"]]) + "\n"


def render(path: str, name: str | None) -> str:
    result = json.loads((ROOT / path).read_text())
    if "benchmarks" in result:
        if name is None:
            raise KeyError("a `python -m benchmarks run` file holds several benchmarks: name one (FILE#NAME)")
        return run_report(result, name)
    module, function = RENDERERS[result["benchmark"]].split(":")
    return getattr(importlib.import_module(module), function)(result)


def refreshed(text: str, page: str) -> str:
    def table(match: re.Match) -> str:
        try:
            body = render(match["path"], match["name"])
        except (OSError, KeyError, ValueError) as e:
            raise SystemExit(f"{page}: the table of {match['path']}: {type(e).__name__}: {e}") from None
        return match.group(1) + body.rstrip("\n") + "\n" + match.group(5)

    return MARKED.sub(table, text)


def stale(pages=PAGES) -> list[str]:
    """The pages whose marked tables are not what their JSON renders."""
    return [page for page in pages if refreshed((ROOT / page).read_text(), page) != (ROOT / page).read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        pages = stale()
        for page in pages:
            print(f"{page}: a table differs from its JSON; run `python -m benchmarks report`")
        return 1 if pages else 0
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        new = refreshed(text, page)
        if new != text:
            path.write_text(new)
            print(f"rewrote the tables of {page}")
    return 0
