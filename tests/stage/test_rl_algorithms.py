"""What the RL driver computes whatever runs its workers, with every worker in the test's process
(`stages.rl.stage.run_in_process`, the backend of `benchmarks/gpu_stages.py`): dense process rewards, a critic
from the reward model and its warm-up, GSPO, dynamic filtering and ProRL's truncation penalty, checkpoint
and resume, max_checkpoints, EMA and the best eval step. The same driver on Ray actors, with what only Ray
has (engine and reference actors, weight sync, groups of several workers, async training):
tests/stage/test_rl_stage.py. In one process a run skips the seconds each actor takes to start."""

import functools

import pytest
import torch
from safetensors.torch import load_file

from stages.prm import stage as prm
from stages.rl import stage as rl_stage
from stages.rm import stage as rm_stage
from tests.stage import rl_runs
from tests.stage.rl_runs import ONE_UPDATE, STEP_MOVES, gap, quick_reward_model, same, tag_weights, tags

pytestmark = pytest.mark.slow  # each test trains for a few steps

run_rl = functools.partial(rl_runs.run_rl, run=rl_stage.run_in_process)


@pytest.fixture(scope="module")
def grpo(prepared, grpo_args, tmp_path_factory):
    return run_rl(prepared, tmp_path_factory.mktemp("grpo"), grpo_args)


def test_reinforce_with_dense_process_rewards(prepared, tmp_path):
    prm_dir = quick_reward_model("prm", prm, "prm_data", "prm", prepared, tmp_path)
    # each sample in a padded row of its own (the preset computes a prompt's samples as one row)
    result, logged = run_rl(prepared, tmp_path / "rl", ["rl.algorithm.advantage_estimator=reinforce", "reward.source=prm",
                                                        "rl.shared_prompt=false"], extra_inputs={"prm": prm_dir})
    steps = [m for _, m in logged if "train/reward" in m]
    assert all("reward/prm/steps" in m for m in steps)
    assert result.outputs["rl_model"].is_dir()


def test_ppo_with_a_critic_from_the_reward_model_keeps_it_as_a_value_network(prepared, tmp_path):
    """OpenRLHF's PPO with a reward model: the critic starts from the RM (rl.critic.init_from=reward_model; its first
    values are the RM's: tests/stage/test_rl_critic.py) and is kept (rl.critic.save_value_network) as critic_model,
    trained away from the RM's head, a checkpoint the RM loader reads."""
    from stages.rewards.rm_scorer import load_reward_model

    rm_dir = quick_reward_model("rm", rm_stage, "pref_data", "reward_model", prepared, tmp_path)
    result, logged = run_rl(prepared, tmp_path / "rl", ["rl.algorithm.advantage_estimator=gae", "reward.source=rm",
                                                        "rl.critic.init_from=reward_model", "rl.critic.save_value_network=true",
                                                        "rl.max_steps=1"], extra_inputs={"reward_model": rm_dir})
    (step,) = [m for _, m in logged if "train/reward" in m]
    assert step["critic/value_loss"] > 0 and step["critic/grad_norm"] > 0
    assert set(result.outputs) == {"rl_model", "critic_model"}
    critic, rm = (load_reward_model(path, "cpu") for path in (result.outputs["critic_model"], rm_dir))
    assert critic.head.weight.shape == rm.head.weight.shape and not torch.equal(critic.head.weight, rm.head.weight)


def test_gspo_trains_another_policy_than_ppos_clip_from_the_same_samples(grpo, grpo_args, prepared, tmp_path):
    """rl.algorithm.policy_loss_type=gspo (OpenRLHF's --actor.policy_loss_type gspo): the same seed draws the same
    step-1 samples, and the sequence-level ratio trains other weights; each optimizer step logs its gradient norm."""
    result, logged = run_rl(prepared, tmp_path, [*grpo_args, "rl.algorithm.policy_loss_type=gspo"])
    ppo_result, ppo_logged = grpo
    gspo_steps = [m for _, m in logged if "train/reward" in m]
    ppo_steps = [m for _, m in ppo_logged if "train/reward" in m]
    assert gspo_steps[0]["train/reward"] == ppo_steps[0]["train/reward"]
    assert all(m["actor/grad_norm"] > 0 for m in gspo_steps + ppo_steps)
    ours, theirs = (load_file(r.outputs["rl_model"] / "model.safetensors") for r in (result, ppo_result))
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) > 1e-6


def test_killed_rl_resumes_from_its_checkpoint_and_matches_an_uninterrupted_run(grpo, grpo_args, prepared, tmp_path):
    """Killed at step 2 (after the step-1 checkpoint; `rl.save_every=1`), the rerun resumes there and ends
    on the weights of the module's uninterrupted GRPO run, with the same settings."""
    whole, _ = grpo
    with pytest.raises(RuntimeError, match="killed at step 2"):
        run_rl(prepared, tmp_path, grpo_args, fail_at=2)
    assert (tmp_path / "work" / "checkpoints" / "policy" / "latest").read_text() == "step1"
    resumed, logged = run_rl(prepared, tmp_path, grpo_args)
    assert resumed.metrics["resumed_from_step"] == 1.0
    first_eval = [m for s, m in logged if s == 0 and "eval/accuracy" in m]
    assert [s for s, m in logged if "train/reward" in m] == [2]
    a = load_file(whole.outputs["rl_model"] / "model.safetensors")
    b = load_file(resumed.outputs["rl_model"] / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    # the resumed run's MLflow run still holds the held-out eval of the policy RL started from (step 0)
    assert first_eval == [m for s, m in grpo[1] if s == 0 and "eval/accuracy" in m]


def test_dynamic_filtering_replaces_groups_whose_scores_are_all_equal(prepared, tmp_path):
    # the untrained model never answers, so the rule reward is 0 for every sample: every group is filtered
    result, logged = run_rl(prepared, tmp_path, ["rl.algorithm.dynamic_filtering=true", "rl.max_steps=1"])
    (step,) = [m for _, m in logged if "train/reward" in m]
    assert step["rollout/filtered_groups"] == 4 * (1 + rl_stage.MAX_FILL_ROUNDS)
    assert result.outputs["rl_model"].is_dir()


def test_a_filtering_range_keeps_groups_of_equal_scores_and_truncated_responses_are_penalised(prepared, tmp_path):
    """The untrained model's rule rewards are all 0: a dynamic_filtering_range of (-1, 1) keeps every group (mean 0
    inside it), where the all-equal rule above drops them all; with 3 tokens to answer in, responses are cut
    before their end token and ProRL's coefficient -1 becomes their reward (rollout/score, the shaped mean)."""
    _, logged = run_rl(prepared, tmp_path, ["rl.algorithm.dynamic_filtering=true", "rl.algorithm.dynamic_filtering_range=[-1,1]",
                                            "rl.algorithm.stop_properly_penalty_coef=-1", "rl.rollout.generate_max_len=3",
                                            "rl.max_steps=1"])
    (step,) = [m for _, m in logged if "train/reward" in m]
    assert step["rollout/filtered_groups"] == 0 and step["train/reward"] == 0.0
    assert -1.0 <= step["rollout/score"] < 0.0


def test_while_the_critic_warms_up_the_policy_is_left_as_it_was(prepared, length_reward, tmp_path):
    """rl.critic.freezing_steps (OpenRLHF's --critic.freezing_steps) covering the whole run: the critic trains,
    the policy's weights come out as the SFT model's."""
    result, logged = run_rl(prepared, tmp_path, ["rl.algorithm.advantage_estimator=gae", "rl.critic.freezing_steps=1",
                                                 f"reward.func_path={length_reward}", "rl.max_steps=1"])
    (step,) = [m for _, m in logged if "train/reward" in m]
    assert step["critic/value_loss"] > 0 and step["critic/grad_norm"] > 0
    assert not any(k.startswith("actor/") for k in step)
    assert set(result.outputs) == {"rl_model"}  # no rl.critic.save_value_network: the critic is not kept
    before = load_file(prepared["base_model"] / "model.safetensors")
    after = load_file(result.outputs["rl_model"] / "model.safetensors")
    assert all(torch.equal(after[k], before[k]) for k in before)


@pytest.fixture(scope="module")
def stepwise(prepared, grpo_args, tmp_path_factory):
    """Four one-update GRPO steps, each checkpointed and kept (the last is the output): the policy's weights
    after every step, which the runs below with the same settings must reproduce."""
    root = tmp_path_factory.mktemp("stepwise")
    result, logged = run_rl(prepared, root, [*grpo_args, *ONE_UPDATE, "rl.max_steps=4", "rl.max_checkpoints=4"])
    weights = {0: load_file(prepared["base_model"] / "model.safetensors"), 4: load_file(result.outputs["rl_model"] / "model.safetensors")}
    weights |= {step: tag_weights(root, step) for step in (1, 2, 3)}
    return root, weights, logged


def test_max_checkpoints_keeps_that_many_and_the_output_is_the_last_step(stepwise):
    """rl.max_checkpoints (OpenRLHF's --ckpt.max_num) 4: every checkpoint of the run stays (the last step is the
    output, not a checkpoint); without ema or a best metric the output is the last step's policy."""
    root, weights, _ = stepwise
    assert tags(root) == {"step1", "step2", "step3"} and not (root / "work" / "checkpoints" / "best").exists()
    assert all(gap(weights[s + 1], weights[s]) > STEP_MOVES for s in range(4))  # each step trains


def test_the_saved_policy_is_the_moving_average_of_the_trained_weights_and_resumes(grpo_args, prepared, stepwise, tmp_path):
    """rl.actor.ema_beta=0.75 (OpenRLHF's --enable_ema --ema_beta 0.75) over two one-update steps, killed after the
    second and resumed from the step-1 checkpoint: the output is 0.75 x (0.75 x W0 + 0.25 x W1) + 0.25 x W2 =
    0.5625 W0 + 0.1875 W1 + 0.25 W2 of the SFT weights W0 and the trained weights W1, W2 (the stepwise run's:
    the average does not change training), which the resumed run reaches only from the checkpointed average."""
    _, w, _ = stepwise
    args = [*grpo_args, *ONE_UPDATE, "rl.max_steps=2", "rl.actor.ema_beta=0.75", "rl.eval_every=2"]
    with pytest.raises(RuntimeError, match="killed at step 2"):
        run_rl(prepared, tmp_path, args, fail_at=2)
    w1 = tag_weights(tmp_path, 1)  # this run's trained weights after step 1
    assert same(w[1], w1)  # the average is not what trains
    saved = torch.load(tmp_path / "work" / "checkpoints" / "policy" / "step1" / "ema.pt")
    assert gap(saved, {k: 0.75 * w[0][k] + 0.25 * w1[k] for k in saved}) < 1e-6
    result, _ = run_rl(prepared, tmp_path, args)
    assert result.metrics["resumed_from_step"] == 1.0
    out = load_file(result.outputs["rl_model"] / "model.safetensors")
    # W2 only from the stepwise run (this one saves the average), the same bytes as this run's; the bound is the
    # float32 rounding of the two forms of the average (weights below 1: a few 1e-8)
    assert gap(out, {k: 0.5625 * w[0][k] + 0.1875 * w1[k] + 0.25 * w[2][k] for k in out}) < 1e-6
    assert gap(out, w[2]) > STEP_MOVES  # not the trained weights


def test_the_output_is_the_policy_of_the_best_eval_step(grpo_args, prepared, stepwise, tmp_path):
    """rl.best_metric=reward (OpenRLHF's --ckpt.best_metric_key) over four steps evaluated each: the output is the
    weights of the first step with the highest held-out reward, its metrics the stage's, and the step is
    logged; rl.max_checkpoints=2 leaves the newest two checkpoints (of steps 1-3) on disk."""
    _, w, every = stepwise
    result, logged = run_rl(prepared, tmp_path, [*grpo_args, *ONE_UPDATE, "rl.max_steps=4", "rl.max_checkpoints=2",
                                                 "rl.best_metric=reward"])
    rewards = {s: m["eval/reward"] for s, m in logged if s > 0 and "eval/reward" in m}
    assert rewards == {s: m["eval/reward"] for s, m in every if s > 0 and "eval/reward" in m}  # the same training
    best = min(s for s in rewards if rewards[s] == max(rewards.values()))
    assert result.metrics["best_step"] == float(best) and result.metrics["eval/reward"] == rewards[best]
    out = load_file(result.outputs["rl_model"] / "model.safetensors")
    assert same(out, w[best]) and all(gap(out, w[s]) > STEP_MOVES for s in (1, 2, 3, 4) if s != best)
    assert tags(tmp_path) == {"step2", "step3"}


