"""An `rl.agent.path` file: where it is, and whether it defines `class Environment` with `reset` and
`step`, decided from its source without running it (the flow's driver checks it before any work
starts, without importing torch or what the file imports)."""

from __future__ import annotations

import ast
from pathlib import Path

from configs.errors import RewardError
from stages.rewards.func_file import parse, resolve_func_path

CLASS = "Environment"
EXECUTOR = "AgentExecutor"  # OpenRLHF's agent file: a MultiTurnAgentExecutor over its AgentInstanceBase class


def resolve(agent_path: str) -> Path:
    """As a `reward.func_path` is found: as given, else relative to the configs/ package."""
    try:
        return resolve_func_path(agent_path)
    except RewardError:
        raise RewardError(f"rl.agent.path={agent_path}: no such file") from None


def check(path: Path) -> None:
    """From the source, without running it: the file compiles and defines `class Environment` with
    `reset` and `step` (the driver checks this before any work starts)."""
    where = f"rl.agent.path={path}"
    tree = parse(path, where)
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS]
    if not found and any(isinstance(n, ast.ClassDef) and n.name == EXECUTOR for n in tree.body):
        return  # OpenRLHF's form: its instance class and methods are checked when the file loads
    if not found:
        raise RewardError(f"{where}: defines no class {CLASS}; define one with reset(prompt, label) and "
                          "step(observation, action)")
    methods = {n.name for n in found[-1].body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    missing = [m for m in ("reset", "step") if m not in methods]
    if missing and not found[-1].bases:  # an inherited method is found when the file loads
        raise RewardError(f"{where}: class {CLASS} has no {' or '.join(missing)}; define reset(prompt, label) "
                          "and step(observation, action)")
