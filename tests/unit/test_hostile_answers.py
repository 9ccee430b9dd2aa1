"""Every rule-based grader in the project against answers a policy could write to hang it: a number too large to
build exactly, runs of 100,000 characters that make a backtracking regex quadratic, braces nested 100,000 deep.
Each must score them 0 (none is the label) and return; the deadline of each test is what "return" means here.
Without the bounds, `\\boxed{1e999999999}` alone ran past 10 minutes in OpenRLHF's math grader, and 100,000
commas took the GSM8K file's last-number pattern minutes (quadratic backtracking)."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs import load_config
from stages.common.answers import is_correct
from stages.rewards.func_scorer import FunctionScorer

pytestmark = pytest.mark.timeout(20)

ROOT = Path(__file__).resolve().parents[2]
GRADER_FILES = {  # reward_func files: the presets' own and OpenRLHF's math example
    "arithmetic": ROOT / "configs" / "rewards" / "arithmetic.py",
    "gsm8k": ROOT / "configs" / "rewards" / "gsm8k.py",
    "openrlhf_math": ROOT / "tests" / "data" / "openrlhf_examples" / "math_reward_func.py",
}
PATTERN_PRESETS = ("tiny", "qwen2.5-0.5b-gsm8k")  # eval.answer_pattern of each, checked by the eval and RL stages

N = 100_000
HOSTILE = {
    "huge exponent": "\\boxed{1e999999999}",
    "huge negative exponent": "so \\boxed{1e-999999999}",
    "a number over a huge exponent": "\\boxed{7/1e999999999}",
    "huge exponent in a frac": "\\boxed{\\frac{7e999999999}{1e999999999}}",
    "100,000 digits": "\\boxed{" + "9" * N + "}",
    "100,000 commas": "," * N,
    "100,000 commas after a marker": "#### " + "," * N,
    "100,000 commas in a box": "\\boxed{" + "," * N,
    "100,000 open braces": "\\boxed" + "{" * N,
    "100,000 spaces after Answer:": "Answer:" + " " * N,
    "20,000 Answer: markers": "Answer: " * 20_000,
    "100,000 minus signs": "Answer: " + "-" * N,
}
LABEL = "7"


@pytest.mark.parametrize("grader", sorted(GRADER_FILES))
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_reward_file_scores_a_hostile_answer_zero_and_returns(grader, case):
    batch = FunctionScorer(GRADER_FILES[grader]).score(["Q: "], [HOSTILE[case]], [LABEL])
    assert batch.rewards.tolist() == [0.0]


@pytest.mark.parametrize("preset", PATTERN_PRESETS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_answer_pattern_checks_a_hostile_answer_and_returns(preset, case):
    pattern = load_config(preset).eval.answer_pattern
    assert pattern is not None
    assert is_correct(HOSTILE[case], LABEL, pattern) is False


def test_the_graders_still_find_the_right_answer():
    """The same graders score the label itself 1, so the zeros above are not a grader that never matches."""
    right = {"arithmetic": "Answer: 7", "gsm8k": "#### 7", "openrlhf_math": "\\boxed{7}"}
    for grader, response in right.items():
        assert FunctionScorer(GRADER_FILES[grader]).score(["Q: "], [response], [LABEL]).rewards.tolist() == [1.0]
    assert is_correct("Answer: 7", LABEL, load_config("tiny").eval.answer_pattern or "")
    assert is_correct("#### 7", LABEL, load_config("qwen2.5-0.5b-gsm8k").eval.answer_pattern or "")
