"""How long the test suite takes, run by run: the README's test command on a clean clone (CI's `.ci/run`) or
`pytest -q` in a working tree, with the machine, the commit and its slowest steps. The suite is not a benchmark
script (CI runs it): each timed run is added by hand to benchmarks/results/suite.json, and its table in
docs/testing.md is rendered from that file by `python -m benchmarks report`."""

from __future__ import annotations

HOW = {"ci": "clean clone, `.ci/run`", "tree": "`pytest -q` in the tree"}


def minutes(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def report(result: dict) -> str:
    """The runs, newest first: when, how, the commit, tests passed, total and pytest time, what else it shows."""
    lines = [f"{result['about']}", "", "| when | machine | how | commit | tests | in all | pytest | notes |",
             "|---|---|---|---|---|---|---|---|"]
    for run in sorted(result["runs"], key=lambda r: r["when"], reverse=True):
        lines.append(f"| {run['when']} | {run['machine']} | {HOW[run['how']]} | {run.get('commit', '')} | "
                     f"{run.get('passed', '')} | {minutes(run.get('total_s'))} | {minutes(run.get('pytest_s'))} | "
                     f"{run.get('notes', '')} |")
    return "\n".join(lines) + "\n"
