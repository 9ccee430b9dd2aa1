"""OpenRLHF's names that a user's reward or agent file imports (`from openrlhf.utils import grade_answer`,
`from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor`), provided where OpenRLHF is
not installed, so that those files load here unchanged. Where OpenRLHF is installed, its own modules are
imported instead and nothing here is used."""

from __future__ import annotations

import importlib.util
import sys
import types


def provide() -> None:
    """Register `openrlhf`, `openrlhf.utils` and `openrlhf.utils.agent` in `sys.modules` unless OpenRLHF
    itself can be imported (called before a user's file is executed)."""
    if "openrlhf" in sys.modules or importlib.util.find_spec("openrlhf") is not None:
        return
    from stages.openrlhf_compat import agent, answers

    root = types.ModuleType("openrlhf", "stand-ins for OpenRLHF's names (stages/openrlhf_compat)")
    utils = types.ModuleType("openrlhf.utils", "stand-ins for openrlhf.utils (stages/openrlhf_compat)")
    root.__path__, utils.__path__ = [], []  # packages: their submodules import
    utils.extract_boxed_answer = answers.extract_boxed_answer  # type: ignore[attr-defined]
    utils.grade_answer = answers.grade_answer  # type: ignore[attr-defined]
    utils.agent = agent  # type: ignore[attr-defined]
    root.utils = utils  # type: ignore[attr-defined]
    sys.modules.update({"openrlhf": root, "openrlhf.utils": utils, "openrlhf.utils.agent": agent})
