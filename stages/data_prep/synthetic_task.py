"""The tiny preset's task: multi-step arithmetic with worked answers that can be checked.

A prompt is `Compute 17+5-8`; a solution is one line per step and a final line:

    17+5=22
    22-8=14
    Answer: 14

A *flawed* solution makes one slip (a step result off by a little) and carries the wrong
value on, so its steps stay self-consistent after the slip and its final answer is wrong.
From one generator come every dataset the pipeline needs (SFT, preference pairs,
step-labelled PRM data, RL prompts with labels, held-out eval prompts), all pure functions
of a seeded `random.Random`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from configs.schema import SyntheticTaskConfig

ANSWER_PREFIX = "Answer: "


@dataclass(frozen=True)
class Problem:
    terms: tuple[int, ...]
    ops: tuple[str, ...]  # one fewer than terms, each "+" or "-"

    @property
    def prompt(self) -> str:
        return "Compute " + self.expression

    @property
    def expression(self) -> str:
        text = str(self.terms[0])
        for op, term in zip(self.ops, self.terms[1:]):
            text += f"{op}{term}"
        return text

    @property
    def answer(self) -> int:
        return step_values(self)[-1]


def step_values(problem: Problem, slip_at: int | None = None, slip: int = 0) -> list[int]:
    """Running results after each operation; `slip` is added to the result of step `slip_at`."""
    values, current = [], problem.terms[0]
    for i, (op, term) in enumerate(zip(problem.ops, problem.terms[1:])):
        current = current + term if op == "+" else current - term
        if i == slip_at:
            current += slip
        values.append(current)
    return values


def solution_steps(problem: Problem, slip_at: int | None = None, slip: int = 0) -> list[str]:
    """The step lines (`a+b=c`) followed by the final `Answer: N` line."""
    values = step_values(problem, slip_at, slip)
    steps, left = [], problem.terms[0]
    for op, term, value in zip(problem.ops, problem.terms[1:], values):
        steps.append(f"{left}{op}{term}={value}")
        left = value
    return [*steps, f"{ANSWER_PREFIX}{values[-1]}"]


def step_labels(problem: Problem, slip_at: int | None) -> list[str]:
    """`+` for each step line computed correctly from its own left operand, `-` for the slip and what follows it."""
    n_steps = len(problem.ops) + 1  # operation lines plus the answer line
    if slip_at is None:
        return ["+"] * n_steps
    return ["+" if i < slip_at else "-" for i in range(n_steps)]


def two_turns(problem: Problem) -> list[dict]:
    """The problem as two turns: its first operation, then the whole problem (a two-term one with `+0`
    after it) with the first step's line already written, as agents/chained_arithmetic.py plays it."""
    first = Problem(problem.terms[:2], problem.ops[:1])
    whole = problem if len(problem.terms) > 2 else Problem((*problem.terms, 0), (*problem.ops, "+"))
    answer = "\n".join(solution_steps(first))
    return [{"role": "user", "content": first.prompt}, {"role": "assistant", "content": answer},
            {"role": "user", "content": whole.prompt}, {"role": "assistant", "content": "\n".join(solution_steps(whole))}]


def random_problem(rng: random.Random, cfg: SyntheticTaskConfig) -> Problem:
    """Operands in [0, max_operand]; subtraction only where the running value stays non-negative."""
    n_terms = rng.randint(cfg.min_terms, cfg.max_terms)
    terms = [rng.randint(0, cfg.max_operand)]
    ops, current = [], terms[0]
    for _ in range(n_terms - 1):
        term = rng.randint(0, cfg.max_operand)
        op = "-" if current >= term and rng.random() < 0.5 else "+"
        current = current + term if op == "+" else current - term
        terms.append(term)
        ops.append(op)
    return Problem(tuple(terms), tuple(ops))


def random_slip(rng: random.Random, problem: Problem, min_slip: int = 1, max_slip: int = 2) -> tuple[int, int]:
    """Where the flawed solution slips and by how much (|slip| in [min_slip, max_slip]); no running value
    (the slipped one or any carried on from it) goes below zero, so a negative number never gives a flaw away."""
    sizes = range(min_slip, max_slip + 1)
    options = [
        (at, delta)
        for at in range(len(problem.ops))
        for delta in [*(-d for d in sizes), *sizes]
        if min(step_values(problem, at, delta)[at:]) >= 0
    ]
    return rng.choice(options)  # never empty: +min_slip at the last step is always allowed


def unique_problems(rng: random.Random, cfg: SyntheticTaskConfig, count: int, exclude: set[str]) -> list[Problem]:
    """`count` problems whose expressions are distinct and not in `exclude` (which is updated)."""
    problems: list[Problem] = []
    attempts = 0
    while len(problems) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(
                f"cannot draw {count} distinct problems with max_operand={cfg.max_operand}, "
                f"max_terms={cfg.max_terms}; raise them or ask for fewer rows"
            )
        problem = random_problem(rng, cfg)
        if problem.expression in exclude:
            continue
        exclude.add(problem.expression)
        problems.append(problem)
    return problems


@dataclass
class SyntheticSplits:
    """Plain rows (prompt text without any chat template); data prep renders and writes them."""

    sft_train: list[dict]
    sft_eval: list[dict]
    preference_train: list[dict]
    preference_eval: list[dict]
    prm_train: list[dict]
    prm_eval: list[dict]
    prompts_train: list[dict]
    eval_prompts: list[dict]


def generate(cfg: SyntheticTaskConfig, seed: int) -> SyntheticSplits:
    """All datasets of the task; eval problems never appear in any training set."""
    rng = random.Random(seed)
    seen: set[str] = set()
    eval_problems = unique_problems(rng, cfg, cfg.num_eval, seen)
    train_problems = unique_problems(rng, cfg, cfg.num_train, seen)
    prompt_problems = unique_problems(rng, cfg, cfg.num_prompts, seen)

    def slip_of(problem: Problem) -> tuple[int, int]:
        return random_slip(rng, problem, cfg.min_slip, cfg.max_slip)

    def sft_row(problem: Problem, flawed: bool) -> dict:
        # the share is drawn only when asked for, so the default data stay as they were
        if cfg.two_turn_share and rng.random() < cfg.two_turn_share:
            return {"messages": two_turns(problem)}
        slip_at, slip = slip_of(problem) if flawed else (None, 0)
        return {"prompt": problem.prompt, "response": "\n".join(solution_steps(problem, slip_at, slip))}

    def pair_row(problem: Problem) -> dict:
        slip_at, slip = slip_of(problem)
        return {
            "prompt": problem.prompt,
            "chosen": "\n".join(solution_steps(problem)),
            "rejected": "\n".join(solution_steps(problem, slip_at, slip)),
        }

    def prm_row(problem: Problem) -> dict:
        flawed = rng.random() < 0.5
        slip_at, slip = slip_of(problem) if flawed else (None, 0)
        return {
            "prompt": problem.prompt,
            "steps": solution_steps(problem, slip_at, slip),
            "labels": step_labels(problem, slip_at),
        }

    return SyntheticSplits(
        sft_train=[sft_row(p, rng.random() < cfg.flawed_share) for p in train_problems],
        sft_eval=[sft_row(p, False) for p in eval_problems],
        preference_train=[pair_row(p) for p in train_problems],
        preference_eval=[pair_row(p) for p in eval_problems],
        prm_train=[prm_row(p) for p in train_problems],
        prm_eval=[prm_row(p) for p in eval_problems],
        prompts_train=[{"prompt": p.prompt, "label": str(p.answer)} for p in prompt_problems],
        eval_prompts=[{"prompt": p.prompt, "label": str(p.answer)} for p in eval_problems],
    )
