"""The tiny preset's rule-based reward: 1.0 when the response's final `Answer: N` equals the label.

Loaded by file path (`reward.func_path`), so it stays self-contained: only torch and re.
"""

import re

import torch

ANSWER = re.compile(r"Answer:\s*(-?\d+)")


def final_answer(response):
    """The number of the last `Answer: N` in the response, or None."""
    found = ANSWER.findall(response)
    return found[-1].strip() if found else None


def reward_func(queries, prompts, labels):
    answers = [final_answer(query[len(prompt):]) for query, prompt in zip(queries, prompts)]
    correct = [a is not None and label is not None and a == str(label).strip() for a, label in zip(answers, labels)]
    rewards = torch.tensor([1.0 if c else 0.0 for c in correct])
    return {
        "rewards": rewards,
        "scores": rewards,
        "extra_logs": {"answered": torch.tensor([0.0 if a is None else 1.0 for a in answers])},
    }
