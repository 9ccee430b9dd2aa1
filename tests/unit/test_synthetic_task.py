"""stages/data_prep/synthetic_task.py: worked solutions, slips, step labels and the seeded dataset generator."""

from __future__ import annotations

import random
import re

import pytest

from configs.schema import SyntheticTaskConfig
from stages.data_prep.synthetic_task import (
    ANSWER_PREFIX,
    Problem,
    generate,
    random_problem,
    random_slip,
    solution_steps,
    step_labels,
    step_values,
    unique_problems,
)

P = Problem((17, 5, 8), ("+", "-"))

# a small but not trivial config: fast to generate, still thousands of rows
CFG = SyntheticTaskConfig(num_train=2000, num_eval=100, num_prompts=500)


def parse_prompt(prompt: str) -> Problem:
    """`Compute 17+5-8` -> Problem((17, 5, 8), ("+", "-")), written independently of the module."""
    assert prompt.startswith("Compute ")
    expr = prompt[len("Compute ") :]
    assert re.fullmatch(r"\d+([+-]\d+)+", expr), expr
    terms = tuple(int(t) for t in re.findall(r"\d+", expr))
    ops = tuple(re.findall(r"[+-]", expr))
    return Problem(terms, ops)


def hand_solution(problem: Problem) -> list[str]:
    """The correct worked solution, computed here without the module's helpers."""
    lines, acc = [], problem.terms[0]
    for op, term in zip(problem.ops, problem.terms[1:]):
        new = acc + term if op == "+" else acc - term
        lines.append(f"{acc}{op}{term}={new}")
        acc = new
    return [*lines, f"Answer: {acc}"]


# --- hand-written problems -----------------------------------------------------------------


def test_problem_text_and_answer():
    assert P.expression == "17+5-8"
    assert P.prompt == "Compute 17+5-8"
    assert P.answer == 14


def test_step_values_and_lines():
    assert step_values(P) == [22, 14]
    assert solution_steps(P) == ["17+5=22", "22-8=14", "Answer: 14"]
    assert step_labels(P, None) == ["+", "+", "+"]


def test_slip_at_step_0_carries_on():
    assert step_values(P, slip_at=0, slip=1) == [23, 15]
    assert solution_steps(P, 0, 1) == ["17+5=23", "23-8=15", "Answer: 15"]
    assert step_labels(P, 0) == ["-", "-", "-"]
    assert step_values(P, 0, 1)[-1] != P.answer


def test_slip_at_step_1():
    assert step_values(P, slip_at=1, slip=1) == [22, 15]
    assert solution_steps(P, 1, 1) == ["17+5=22", "22-8=15", "Answer: 15"]
    assert step_labels(P, 1) == ["+", "-", "-"]


def test_negative_slip_and_longer_problem():
    q = Problem((3, 4, 2, 10), ("+", "-", "+"))
    assert q.expression == "3+4-2+10"
    assert step_values(q) == [7, 5, 15]
    assert q.answer == 15
    assert solution_steps(q, 1, -2) == ["3+4=7", "7-2=3", "3+10=13", "Answer: 13"]
    assert step_labels(q, 2) == ["+", "+", "-", "-"]
    assert step_labels(q, None) == ["+"] * 4


def test_two_term_problem():
    q = Problem((9, 9), ("-",))
    assert q.prompt == "Compute 9-9"
    assert solution_steps(q) == ["9-9=0", "Answer: 0"]
    assert solution_steps(q, 0, 2) == ["9-9=2", "Answer: 2"]
    assert step_labels(q, 0) == ["-", "-"]


def test_slip_of_zero_or_out_of_range_changes_nothing():
    assert step_values(P, 0, 0) == [22, 14]
    assert step_values(P, 5, 3) == [22, 14]


# --- random pieces -------------------------------------------------------------------------


def test_random_problem_respects_config():
    cfg = SyntheticTaskConfig(min_terms=2, max_terms=4, max_operand=9)
    rng = random.Random(0)
    lengths = set()
    for _ in range(2000):
        p = random_problem(rng, cfg)
        assert len(p.ops) == len(p.terms) - 1
        assert 2 <= len(p.terms) <= 4
        assert all(0 <= t <= 9 for t in p.terms)
        assert set(p.ops) <= {"+", "-"}
        assert all(v >= 0 for v in step_values(p))
        lengths.add(len(p.terms))
    assert lengths == {2, 3, 4}


def test_random_slip_is_nonzero_in_range_and_keeps_slipped_step_nonnegative():
    rng = random.Random(1)
    cfg = SyntheticTaskConfig()
    for _ in range(2000):
        p = random_problem(rng, cfg)
        slip_at, slip = random_slip(rng, p)
        assert 0 <= slip_at < len(p.ops)
        assert slip in (-2, -1, 1, 2)
        assert step_values(p, slip_at, slip)[slip_at] >= 0
        # the slip is carried on, so the final answer is always off by exactly `slip`
        assert step_values(p, slip_at, slip)[-1] == p.answer + slip


def test_unique_problems_are_distinct_and_exclude_is_updated():
    rng = random.Random(3)
    exclude = {"1+1"}
    got = unique_problems(rng, CFG, 300, exclude)
    exprs = [p.expression for p in got]
    assert len(exprs) == 300 == len(set(exprs))
    assert "1+1" not in exprs
    assert exclude == set(exprs) | {"1+1"}


def test_unique_problems_fails_when_space_is_too_small():
    # max_operand=2, two terms: 3*3 "+" expressions plus 6 "-" ones = 15 distinct expressions
    cfg = SyntheticTaskConfig(min_terms=2, max_terms=2, max_operand=2)
    with pytest.raises(ValueError, match="cannot draw 16 distinct problems"):
        unique_problems(random.Random(0), cfg, 16, set())
    assert len(unique_problems(random.Random(0), cfg, 15, set())) == 15


# --- generate() ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def splits():
    return generate(CFG, seed=11)


def test_split_sizes(splits):
    assert len(splits.sft_train) == len(splits.preference_train) == len(splits.prm_train) == 2000
    assert len(splits.sft_eval) == len(splits.preference_eval) == len(splits.prm_eval) == 100
    assert len(splits.eval_prompts) == 100
    assert len(splits.prompts_train) == 500


def test_generate_is_deterministic_for_a_seed(splits):
    again = generate(CFG, seed=11)
    assert again == splits


def test_generate_differs_for_another_seed(splits):
    other = generate(CFG, seed=12)
    assert other.eval_prompts != splits.eval_prompts
    assert other.sft_train != splits.sft_train


def test_eval_prompts_never_in_training_rows(splits):
    eval_prompts = {r["prompt"] for r in splits.eval_prompts}
    assert len(eval_prompts) == 100
    for rows in (splits.sft_train, splits.preference_train, splits.prm_train, splits.prompts_train):
        assert eval_prompts.isdisjoint(r["prompt"] for r in rows)
    # the eval splits of the other datasets are the eval problems themselves
    for rows in (splits.sft_eval, splits.preference_eval, splits.prm_eval):
        assert [r["prompt"] for r in rows] == [r["prompt"] for r in splits.eval_prompts]


def test_rl_prompts_are_disjoint_from_sft_prompts(splits):
    sft = {r["prompt"] for r in splits.sft_train}
    rl = {r["prompt"] for r in splits.prompts_train}
    assert len(sft) == 2000 and len(rl) == 500
    assert sft.isdisjoint(rl)


def test_flawed_share_of_sft_train_is_near_config(splits):
    flawed = 0
    for row in splits.sft_train:
        lines = row["response"].split("\n")
        if lines != hand_solution(parse_prompt(row["prompt"])):
            flawed += 1
    share = flawed / len(splits.sft_train)
    # binomial(2000, 0.25): sd ~0.0097, so +-0.04 is over 4 sd
    assert abs(share - CFG.flawed_share) < 0.04, share


def test_flawed_share_zero_gives_only_correct_solutions():
    s = generate(SyntheticTaskConfig(num_train=300, num_eval=20, num_prompts=20, flawed_share=0.0), seed=0)
    for row in s.sft_train:
        assert row["response"].split("\n") == hand_solution(parse_prompt(row["prompt"]))


def test_flawed_sft_solutions_are_consistent_after_the_slip_and_wrong(splits):
    for row in splits.sft_train:
        problem = parse_prompt(row["prompt"])
        lines = row["response"].split("\n")
        correct = hand_solution(problem)
        assert len(lines) == len(correct)
        if lines == correct:
            continue
        # each step line is `left op term = value`; left is the previous line's value
        left = problem.terms[0]
        wrong_steps = 0
        for line, op, term in zip(lines[:-1], problem.ops, problem.terms[1:]):
            m = re.fullmatch(r"(-?\d+)([+-])(\d+)=(-?\d+)", line)
            assert m, line
            assert int(m.group(1)) == left and m.group(2) == op and int(m.group(3)) == term
            value = int(m.group(4))
            expected = left + term if op == "+" else left - term
            if value != expected:
                wrong_steps += 1
                assert value - expected in (-2, -1, 1, 2)
            left = value
        assert wrong_steps == 1
        assert lines[-1] == f"Answer: {left}"
        assert left != problem.answer


def test_correct_solutions_end_with_problem_answer(splits):
    for row in splits.sft_eval:
        problem = parse_prompt(row["prompt"])
        lines = row["response"].split("\n")
        assert lines == hand_solution(problem)
        assert lines[-1] == f"{ANSWER_PREFIX}{problem.answer}"
    for row in splits.preference_train + splits.preference_eval:
        problem = parse_prompt(row["prompt"])
        assert row["chosen"].split("\n") == hand_solution(problem)
        assert row["chosen"].split("\n")[-1] == f"Answer: {problem.answer}"
        assert row["rejected"] != row["chosen"]
        assert row["rejected"].split("\n")[-1] != f"Answer: {problem.answer}"
    for row in splits.prompts_train + splits.eval_prompts:
        assert row["label"] == str(parse_prompt(row["prompt"]).answer)


def test_prm_rows_labels_match_steps(splits):
    n_flawed = 0
    for row in splits.prm_train + splits.prm_eval:
        problem = parse_prompt(row["prompt"])
        correct = hand_solution(problem)
        assert len(row["steps"]) == len(row["labels"]) == len(problem.ops) + 1
        for i, (line, label) in enumerate(zip(row["steps"], row["labels"])):
            assert label == ("+" if line == correct[i] else "-"), (row, i)
        # once a label is "-", all later ones are too
        labels = "".join(row["labels"])
        assert re.fullmatch(r"\+*-*", labels), labels
        n_flawed += "-" in labels
    share = n_flawed / (len(splits.prm_train) + len(splits.prm_eval))
    assert 0.45 < share < 0.55, share  # PRM rows are flawed with probability 1/2


def test_no_running_value_of_a_correct_solution_is_negative(splits):
    problems = [parse_prompt(r["prompt"]) for r in splits.sft_train + splits.prompts_train + splits.eval_prompts]
    for p in problems:
        assert all(v >= 0 for v in step_values(p)), p
        assert all(0 <= t <= CFG.max_operand for t in p.terms)
        assert CFG.min_terms <= len(p.terms) <= CFG.max_terms


def test_two_turn_rows_split_a_problem_as_the_chained_environment_plays_it(splits):
    from stages.data_prep.synthetic_task import two_turns

    assert two_turns(P) == [
        {"role": "user", "content": "Compute 17+5"}, {"role": "assistant", "content": "17+5=22\nAnswer: 22"},
        {"role": "user", "content": "Compute 17+5-8"}, {"role": "assistant", "content": "17+5=22\n22-8=14\nAnswer: 14"},
    ]
    assert two_turns(Problem((3, 4), ("+",)))[2:] == [  # two terms: `+0` is the held-back part
        {"role": "user", "content": "Compute 3+4+0"}, {"role": "assistant", "content": "3+4=7\n7+0=7\nAnswer: 7"}]
    mixed = generate(CFG.model_copy(update={"two_turn_share": 0.3}), seed=11)
    two = [r for r in mixed.sft_train if "messages" in r]
    assert 0.25 < len(two) / len(mixed.sft_train) < 0.35
    assert mixed.eval_prompts == splits.eval_prompts and mixed.prompts_train == splits.prompts_train
