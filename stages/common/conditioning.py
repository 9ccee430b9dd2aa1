"""The reward condition of a conditional-SFT policy (arXiv:2308.12050 as OpenRLHF's `csft` processor
writes it): each prompt carries a score through a template, in training the response's own reward,
at generation the target. The policy's checkpoint keeps its template and target in `CONDITION_FILE`, so
whatever samples from it (the eval stage) prompts it as it was trained."""

from __future__ import annotations

import json
from pathlib import Path

CONDITION_FILE = "reward_condition.json"


def condition(prompt: str, template: str, reward: float) -> str:
    """The prompt with its score: `template` with `{prompt}` and `{reward}` (one decimal, as OpenRLHF's)
    replaced (a plain replace, so other braces in the prompt or template stay as they are)."""
    return template.replace("{reward}", f"{reward:.1f}").replace("{prompt}", prompt)


def write(model_dir: Path, template: str, target_reward: float) -> None:
    (Path(model_dir) / CONDITION_FILE).write_text(json.dumps({"template": template, "target_reward": target_reward}))


def prompts_for(model_dir: Path, prompts: list[str]) -> list[str]:
    """`prompts` as the policy in `model_dir` is to be prompted: conditioned on its target reward where it
    is a conditional-SFT policy, as they are otherwise."""
    file = Path(model_dir) / CONDITION_FILE
    if not file.is_file():
        return prompts
    saved = json.loads(file.read_text())
    return [condition(p, saved["template"], saved["target_reward"]) for p in prompts]
