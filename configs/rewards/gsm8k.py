"""Rule-based reward for GSM8K-style math: 1.0 when the response's final answer equals the label.

The final answer is the number after the last `####` (the format GSM8K solutions end with), else
inside the last `\\boxed{...}`, else the last number in the response; commas and a trailing `.0`
are ignored. Loaded by file path (`reward.func_path`): only torch and re.
"""

import re

import torch

MARKED = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
BOXED = re.compile(r"\\boxed\{\s*(-?[\d,]*\.?\d+)\s*\}")
# a number starts with a digit or a point: a run of commas then fails at once, not after trying every split of it
NUMBER = re.compile(r"-?(?:\d[\d,]*)?\.?\d+")


def normalize(number):
    text = number.replace(",", "").strip()
    return text[:-2] if text.endswith(".0") else text


def final_answer(response):
    for pattern in (MARKED, BOXED, NUMBER):
        found = pattern.findall(response)
        if found:
            return normalize(found[-1])
    return None


def reward_func(queries, prompts, labels):
    answers = [final_answer(query[len(prompt):]) for query, prompt in zip(queries, prompts)]
    correct = [a is not None and label is not None and a == normalize(str(label)) for a, label in zip(answers, labels)]
    rewards = torch.tensor([1.0 if c else 0.0 for c in correct])
    return {"rewards": rewards, "scores": rewards,
            "extra_logs": {"answered": torch.tensor([0.0 if a is None else 1.0 for a in answers])}}
