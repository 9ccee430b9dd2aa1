"""A killed RL run, rerun in its folder, resumes from its last checkpoint and ends as the uninterrupted run ends.
With every worker in this process (`run_in_process`): the same output weights bit for bit and the same metrics
at every step it logged again (timings aside), for GRPO and for PPO with its critic, killed at a step that is not
a checkpoint step or between two micro-batches of an optimizer step. The policy has attention dropout, so its
training draws from torch's RNG. Async training runs on Ray (tests/stage/test_rl_stage.py)."""

from __future__ import annotations

import functools

import pytest

from stages.rl import stage as rl_stage
from tests.stage import rl_runs
from tests.stage.resume_runs import assert_same_histories, assert_same_weights, dropout_model, killed_between_micro_batches, latest

pytestmark = pytest.mark.slow

run_rl = functools.partial(rl_runs.run_rl, run=rl_stage.run_in_process)
# 3 steps of 2 optimizer steps (of 2 micro-batches) each; a checkpoint at step 2
STEPS = ["rl.max_steps=3", "rl.save_every=2", "rl.eval_every=3", "eval.samples_per_prompt=0"]
ESTIMATORS = {"grpo": ["rl.algorithm.advantage_estimator=group_norm"],
              "ppo": ["rl.algorithm.advantage_estimator=gae", "rl.critic.lr=1e-3"]}


@pytest.fixture(scope="module")
def sources(prepared, tmp_path_factory):
    return {**prepared, "base_model": dropout_model(prepared["base_model"], tmp_path_factory.mktemp("rl_resume") / "dropout")}


@pytest.fixture(scope="module", params=list(ESTIMATORS))
def uninterrupted(request, sources, length_reward, tmp_path_factory):
    args = [*ESTIMATORS[request.param], f"reward.func_path={length_reward}", *STEPS]
    result, logged = run_rl(sources, tmp_path_factory.mktemp(request.param), args)
    return args, result, logged


def check_resumed(uninterrupted, sources, root, resumed_from: int) -> None:
    args, whole, logged = uninterrupted
    resumed, again = run_rl(sources, root, args)
    assert resumed.metrics["resumed_from_step"] == resumed_from
    assert_same_weights(whole.outputs["rl_model"], resumed.outputs["rl_model"])
    assert_same_histories(logged, again, resumed_from)


def test_killed_at_a_step_that_is_not_checkpointed_resumes_to_the_uninterrupted_run(uninterrupted, sources, tmp_path):
    """Killed logging step 3 (after its update): the rerun loads step 2's checkpoint (the critic's too) and redoes
    step 3: its rollout, its experience and both models' updates."""
    with pytest.raises(RuntimeError, match="killed at step 3"):
        run_rl(sources, tmp_path, uninterrupted[0], fail_at=3)
    assert latest(tmp_path / "work" / "checkpoints" / "policy") == "step2"
    check_resumed(uninterrupted, sources, tmp_path, resumed_from=2)


def test_killed_between_micro_batches_resumes_to_the_uninterrupted_run(uninterrupted, sources, tmp_path):
    """Killed in step 3's first optimizer step (the policy's fifth), in its second micro-batch."""
    with killed_between_micro_batches(5), pytest.raises(KeyboardInterrupt):
        run_rl(sources, tmp_path, uninterrupted[0])
    assert latest(tmp_path / "work" / "checkpoints" / "policy") == "step2"
    check_resumed(uninterrupted, sources, tmp_path, resumed_from=2)
