"""The RL stage on a local Ray cluster with the tiny model: every actor group, each reward source,
weight sync into the rollout engine, checkpoint/resume. (Learning on the real preset: flow tests.)"""

import time

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from configs import PipelineError, load_config
from runtime import rl_driver
from stages import prm
from stages import reward_model as rm_stage
from stages.contract import NodeInputs
from stages.rl import stage as rl_stage
from tests.stage.conftest import FAST, make_ctx

RL_FAST = [
    *FAST, "rl.max_steps=2", "rl.rollout.batch_size=4", "rl.rollout.n_samples_per_prompt=4", "rl.train_batch_size=8",
    "rl.micro_train_batch_size=4", "rl.rollout.micro_batch_size=16", "rl.eval_every=1", "rl.save_every=1",
    "rl.rollout.generate_max_len=12", "rl.actor.lr=1e-3", "eval.max_samples=8", "eval.max_new_tokens=12",
    "eval.samples_per_prompt=2", "rl.placement.colocate_all=true", "infra.cpus_per_worker=2",
    "rl.algorithm.recompute_old_log_probs=true",  # the policy's own old log-probs: rollout_logprob_gap checks the weight sync
    "rl.rollout.engine=hf",  # engine and reference actors (the preset's hybrid layout: the hybrid test and the flow tests)
]
# Rewards that differ between samples of the untrained model, so every estimator has a signal.
LENGTH_REWARD = "def reward_func(queries, prompts, labels):\n    return [len(q) - len(p) for q, p in zip(queries, prompts)]\n"
STEP_KEYS = {"train/reward", "rollout/reward_std", "train/kl", "actor/entropy", "actor/policy_loss", "actor/clip_frac",
             "rollout/advantage_mean", "rollout/advantage_std", "train/response_length", "time/generation", "time/reward",
             "time/experience", "time/training", "time/weight_sync", "rollout/samples_per_s", "rollout/logprob_gap"}


pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.slow]  # slow: the fast lane leaves out Ray


@pytest.fixture(scope="module")
def length_reward(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "length.py"
    path.write_text(LENGTH_REWARD)
    return str(path)


def run_rl(prepared, root, overrides, fail_at: int | None = None, extra_inputs=None, logged: list | None = None):
    """The RL stage on the fast config; `fail_at`: raise at that step's metrics (after its update), as a kill would
    end it; `logged`: where the (step, metrics) go, read by a caller whose run raises."""
    cfg = load_config(None, [*RL_FAST, *overrides])
    logged = [] if logged is None else logged

    def log(metrics, step):
        if fail_at is not None and step == fail_at and "train/reward" in metrics:
            raise RuntimeError(f"killed at step {step}")
        logged.append((step, metrics))

    ctx = make_ctx("rl", cfg, root, log)
    inputs = {"sft_model": prepared["base_model"], "prompts": prepared["prompts"], "eval_data": prepared["eval_data"],
              **(extra_inputs or {})}
    return rl_driver.run(ctx, inputs), logged


@pytest.fixture(scope="module")
def grpo_args(length_reward) -> list[str]:
    """The module's GRPO run's settings (on top of RL_FAST): the tests that compare against it start from them."""
    return ["rl.algorithm.advantage_estimator=group_norm", f"reward.func_path={length_reward}"]


@pytest.fixture(scope="module")
def grpo(prepared, grpo_args, tmp_path_factory):
    return run_rl(prepared, tmp_path_factory.mktemp("grpo"), grpo_args)


def test_grpo_logs_every_step_metric_and_evals(grpo):
    result, logged = grpo
    steps = [(s, m) for s, m in logged if "train/reward" in m]
    assert [s for s, _ in steps] == [1, 2]
    for _, m in steps:
        assert STEP_KEYS <= set(m), STEP_KEYS - set(m)
        assert not {"rollout/kl_coef", "rollout/filtered_groups"} & set(m)  # fixed by the config: no flat lines
    assert [s for s, m in logged if "eval/accuracy" in m] == [0, 1, 2]
    # the eval stage's metrics (stages.eval_metrics): no pass@k, since the length reward is not 0/1
    assert {"eval/sampled_accuracy", "eval/reward", "eval/sampled_reward", "eval/response_length"} <= set(logged[-1][1])
    assert "eval/pass_at_k" not in logged[-1][1]
    assert {"eval/reward", "eval/accuracy", "eval/sampled_accuracy"} <= set(result.metrics)


def test_grpo_trains_the_policy_and_syncs_the_engine(grpo, prepared):
    result, logged = grpo
    before = load_file(prepared["base_model"] / "model.safetensors")
    after = load_file(result.outputs["rl_model"] / "model.safetensors")
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-4
    step2 = next(m for s, m in logged if s == 2 and "train/reward" in m)
    # step 2 samples from the engine after the step-1 update: had the sync failed, the engine's
    # log-probs would be the old policy's, not the ones the trainer computes
    assert step2["train/kl"] > 0
    assert step2["rollout/logprob_gap"] < 1e-4
    model = AutoModelForCausalLM.from_pretrained(result.outputs["rl_model"])
    assert model.config.vocab_size > 0


@pytest.mark.parametrize("engine", ["hf", "hybrid"])  # hybrid, not recomputed: the tiny preset's RL
def test_sampling_log_probs_stand_in_for_the_old_ones_when_not_recomputed(grpo, grpo_args, prepared, tmp_path, engine):
    """rl.algorithm.recompute_old_log_probs=false: the same first rollout (same seed) trains to the same losses,
    since the sampler's log-probs (HF engine or the hybrid policy rank) are the ones the policy would
    recompute."""
    _, logged = run_rl(prepared, tmp_path, [*grpo_args, "rl.algorithm.recompute_old_log_probs=false", "rl.max_steps=1",
                                            f"rl.rollout.engine={engine}"])
    fast = next(m for s, m in logged if s == 1 and "train/reward" in m)
    full = next(m for s, m in grpo[1] if s == 1 and "train/reward" in m)
    assert "rollout/logprob_gap" not in fast
    assert (fast["train/reward"], fast["train/response_length"]) == (full["train/reward"], full["train/response_length"])
    for key in ("train/kl", "actor/policy_loss", "actor/clip_frac", "actor/kl_loss", "rollout/advantage_std"):
        assert fast[key] == pytest.approx(full[key], abs=1e-5), key


def test_hybrid_engine_samples_as_the_engine_does_without_engine_actors_or_weight_sync(grpo, grpo_args, prepared,
                                                                                         tmp_path):
    """rl.rollout.engine=hybrid: the policy rank samples with the weights it trains and holds the reference. The
    first rollout (same seed, same start weights) is the one the HF engine drew; the second comes from
    the updated policy itself, so its log-probs are the trainer's, nothing is synced, and its KL against
    the rank's reference is the one the reference actor gave the engine's run."""
    result, logged = run_rl(prepared, tmp_path, [*grpo_args, "rl.rollout.engine=hybrid"])
    steps = {s: m for s, m in logged if "train/reward" in m}
    engine = next(m for s, m in grpo[1] if s == 1 and "train/reward" in m)
    assert (steps[1]["train/reward"], steps[1]["train/response_length"]) == (engine["train/reward"], engine["train/response_length"])
    assert steps[2]["rollout/logprob_gap"] < 1e-4
    # the reference the policy rank holds scores as the reference actor does: the same KL from the updated
    # policy (0.062 here; the policy's current weights as the reference would read 0)
    engine2 = next(m for s, m in grpo[1] if s == 2 and "train/reward" in m)
    assert steps[2]["train/kl"] > 0.01
    for key in ("train/reward", "train/kl", "actor/kl_loss", "actor/policy_loss"):
        assert steps[2][key] == pytest.approx(engine2[key], abs=1e-6), key
    assert not any("time/weight_sync" in m for m in steps.values())  # nothing to sync: no flat line of zeros
    assert {"eval/accuracy", "eval/sampled_accuracy"} <= set(result.metrics)
    assert AutoModelForCausalLM.from_pretrained(result.outputs["rl_model"]).config.vocab_size > 0


def test_hf_engine_in_calls_of_generate_batch_size_returns_every_prompt_in_order(prepared):
    """rl.rollout.generate_batch_size splits an engine's share into several `generate` calls; greedy answers
    (which do not depend on the batch) come back the same, one per prompt, in the prompts' order."""
    import ray

    from runtime.resources import actor_class
    from stages.common import checkpoint
    from stages.data_prep import read_split
    from stages.rl.workers import HFRolloutEngine

    tok = checkpoint.load_tokenizer(prepared["base_model"])
    prompts = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in read_split(prepared["eval_data"], "eval")[:7]]
    engines = {per_call: actor_class(HFRolloutEngine).options(num_cpus=0).remote(  # both start at once
        load_config(None, [*RL_FAST, *([f"rl.rollout.generate_batch_size={per_call}"] if per_call else [])]),
        NodeInputs({"sft_model": str(prepared["base_model"])}), 1) for per_call in (None, 3)}
    answers = {per_call: ray.get(e.generate.remote(prompts, 0, None, 12)) for per_call, e in engines.items()}
    for engine in engines.values():
        ray.kill(engine)
    assert [s.prompt_ids for s in answers[3]] == prompts
    assert [s.response_ids for s in answers[3]] == [s.response_ids for s in answers[None]]
    for split, whole in zip(answers[3], answers[None]):
        assert split.log_probs == pytest.approx(whole.log_probs, abs=1e-4)


def test_ppo_with_lora_actor_and_critic_syncs_merged_weights_and_saves_the_adapter(prepared, length_reward, tmp_path):
    """The engines sample from the merged LoRA policy: at step 2 their log-probs are the trainer's."""
    from peft import PeftModel

    from stages.common import checkpoint_paths

    result, logged = run_rl(prepared, tmp_path, ["rl.algorithm.advantage_estimator=gae", f"reward.func_path={length_reward}",
                                                 "rl.actor.lora.rank=4", "rl.actor.lora.alpha=8", "rl.critic.lora.rank=4",
                                                 "rl.actor.lr=5e-3", "rl.algorithm.init_kl_coef=0"])
    step2 = next(m for s, m in logged if s == 2 and "train/reward" in m)
    assert step2["rollout/logprob_gap"] < 1e-4 and "critic/value_loss" in step2
    out = result.outputs["rl_model"]
    assert checkpoint_paths.is_adapter(out) and not (out / "model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(prepared["base_model"])
    adapted = PeftModel.from_pretrained(base, out).eval()
    ids = torch.arange(3, 30).unsqueeze(0)
    with torch.no_grad():
        with adapted.disable_adapter():
            plain = adapted(input_ids=ids).logits
        assert float((adapted(input_ids=ids).logits - plain).abs().max()) > 1e-4  # the adapter trained


def quick_reward_model(stage, module, data: str, output: str, prepared, root):
    """A 4-step rm or prm checkpoint trained from the base model (a scorer to plug into RL)."""
    cfg = load_config(None, [*FAST, f"{stage}.max_steps=4", f"{stage}.eval_every=2", f"{stage}.save_every=2"])
    result = module.run(make_ctx(stage, cfg, root / stage), {"sft_model": prepared["base_model"], data: prepared[data]})
    return result.outputs[output]


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
    from stages.rewards.reward_model import load_reward_model

    rm_dir = quick_reward_model("rm", rm_stage, "pref_data", "reward_model", prepared, tmp_path)
    result, logged = run_rl(prepared, tmp_path / "rl", ["rl.algorithm.advantage_estimator=gae", "reward.source=rm",
                                                        "rl.critic.init_from=reward_model", "rl.critic.save_value_network=true",
                                                        "rl.max_steps=1"], extra_inputs={"reward_model": rm_dir})
    (step,) = [m for _, m in logged if "train/reward" in m]
    assert step["critic/value_loss"] > 0 and step["critic/grad_norm"] > 0
    assert set(result.outputs) == {"rl_model", "critic_model"}
    critic, rm = (load_reward_model(path, "cpu") for path in (result.outputs["critic_model"], rm_dir))
    assert critic.head.weight.shape == rm.head.weight.shape and not torch.equal(critic.head.weight, rm.head.weight)


def test_reference_and_reward_groups_of_two_workers_match_one_worker(prepared, length_reward, tmp_path):
    """rl.placement.ref_num_workers / reward_num_workers = 2: each copy scores half of every rollout (and of the
    held-out evals); the step's reward, lengths and KL are those of one copy scoring it all."""
    # one CPU per bundle, so the colocated pool of two bundles fits the 2-CPU cluster in both runs
    args = ["rl.algorithm.advantage_estimator=group_norm", f"reward.func_path={length_reward}", "rl.max_steps=1",
            "infra.cpus_per_worker=1", "rl.algorithm.use_kl_loss=true", "rl.algorithm.kl_estimator=k3"]
    _, single = run_rl(prepared, tmp_path / "one", args)
    _, sharded = run_rl(prepared, tmp_path / "two", [*args, "rl.placement.ref_num_workers=2", "rl.placement.reward_num_workers=2"])
    (one,), (two,) = ([m for _, m in logged if "train/reward" in m] for logged in (single, sharded))
    assert two["train/reward"] == one["train/reward"] and two["train/response_length"] == one["train/response_length"]  # same samples, same scores
    assert two["train/kl"] == pytest.approx(one["train/kl"], rel=1e-4, abs=1e-7)  # each reference copy scored half the rollout
    evals = [[m["eval/reward"] for _, m in logged if "eval/reward" in m] for logged in (single, sharded)]
    assert evals[0] == evals[1] and len(evals[0]) == 2  # held-out evals before and after, scored in two shares


def test_weight_sync_through_the_object_store_gives_the_broadcast_run(grpo, grpo_args, prepared, tmp_path, capsys):
    """rl.rollout.weight_sync decides only how the engine gets the policy's weights: whole state dicts through the
    object store give the module's GRPO run (parameter-by-parameter broadcast over a gloo group) step for
    step, and each run says in its log which path it took."""
    whole, steps = grpo
    result, logged = run_rl(prepared, tmp_path, [*grpo_args, "rl.rollout.weight_sync=object_store"])
    assert "[rl] weight sync: whole state dicts (rl.rollout.weight_sync=object_store)" in capsys.readouterr().out
    by_step = {s: m for s, m in steps if "train/reward" in m}
    for step, m in ((s, m) for s, m in logged if "train/reward" in m):
        for key in ("train/reward", "train/kl", "actor/policy_loss", "rollout/logprob_gap", "train/response_length"):
            assert m[key] == pytest.approx(by_step[step][key], abs=1e-6), (step, key)
    assert gap(load_file(whole.outputs["rl_model"] / "model.safetensors"),
               load_file(result.outputs["rl_model"] / "model.safetensors")) < RERUN_GAP


def test_async_training_samples_one_update_behind_and_weighs_those_samples(grpo_args, prepared, tmp_path):
    """rl.rollout.async_train: the engine draws step t+1's samples while the policy trains on step t's, so from step 2
    on they come from the weights one update back: the engine's log-probs lag the policy's recomputed ones,
    where the synchronous run's agree (its gap < 1e-4: test_grpo_trains_the_policy_and_syncs_the_engine).
    Step 1's samples are drawn before any update, on-policy in both."""
    result, logged = run_rl(prepared, tmp_path, [*grpo_args, "rl.rollout.async_train=true", "rl.eval_every=2",
                                                 "rl.placement.colocate_all=false", "rl.placement.colocate_models=true", "infra.cpus_per_worker=1"])
    gaps = {s: m["rollout/logprob_gap"] for s, m in logged if "train/reward" in m}
    assert sorted(gaps) == [1, 2]
    assert gaps[1] < 1e-4 and gaps[2] > 1e-3, gaps
    assert {s: m["rollout/staleness"] for s, m in logged if "train/reward" in m} == {1: 0, 2: 1}
    assert {"eval/accuracy", "eval/reward"} <= set(result.metrics)


def test_a_queue_of_two_steps_draws_two_updates_behind_and_resumes_with_its_queue(grpo_args, prepared, tmp_path):
    """rl.rollout.async_queue_size=2: steps 1 and 2 are drawn before any update (step 2 one update stale), step 3
    during step 1 (two updates stale); only step 1's engine log-probs agree with the policy's. Killed at step 4,
    the rerun resumes from step 3's checkpoint, whose queue holds step 4's prompts: drawn again on the resumed
    weights, so step 4 is on-policy."""
    args = [*grpo_args, "rl.rollout.async_train=true", "rl.rollout.async_queue_size=2", "rl.max_steps=4", "rl.eval_every=4",
            "rl.placement.colocate_all=false", "rl.placement.colocate_models=true", "infra.cpus_per_worker=1"]
    logged: list = []
    with pytest.raises(RuntimeError, match="killed at step 4"):
        run_rl(prepared, tmp_path, args, fail_at=4, logged=logged)
    steps = {s: m for s, m in logged if "train/reward" in m}
    assert {s: m["rollout/staleness"] for s, m in steps.items()} == {1: 0, 2: 1, 3: 2}
    assert steps[1]["rollout/logprob_gap"] < 1e-4
    assert steps[2]["rollout/logprob_gap"] > 1e-3 and steps[3]["rollout/logprob_gap"] > 1e-3, steps
    resumed, logged = run_rl(prepared, tmp_path, args)
    assert resumed.metrics["resumed_from_step"] == 3.0
    steps = {s: m for s, m in logged if "train/reward" in m}
    assert list(steps) == [4] and steps[4]["rollout/staleness"] == 0 and steps[4]["rollout/logprob_gap"] < 1e-4


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


@pytest.mark.parametrize("mode", ["icepop", "seq-mask-tis"])  # tis, async training's default: the test above
def test_each_importance_correction_weighs_the_stale_samples_of_async_training(grpo_args, prepared, tmp_path, mode):
    """Async training's step-2 samples come from the weights one update back. With a band of 0.999 to 1.001
    icepop zeroes the tokens whose weight lies outside it and seq-mask-tis the sequences, so their mean weight
    falls (tis would clamp them into it: a mean near 1)."""
    _, logged = run_rl(prepared, tmp_path, [*grpo_args, "rl.rollout.async_train=true", "rl.eval_every=2",
                                            "rl.placement.colocate_all=false", "rl.placement.colocate_models=true",
                                            "infra.cpus_per_worker=1", f"rl.algorithm.rollout_is_type={mode}",
                                            "rl.algorithm.rollout_is_floor=0.999", "rl.algorithm.rollout_is_cap=1.001"])
    weights = {s: m["actor/is_weight_mean"] for s, m in logged if "train/reward" in m}
    assert weights[1] == pytest.approx(1.0, abs=1e-3)  # on-policy: every weight in the band
    assert weights[2] < 0.9, weights


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


# a rollout (4 prompts x 4 samples) is one optimizer step (one average update); greedy evals only
ONE_UPDATE = ["rl.train_batch_size=16", "eval.samples_per_prompt=0"]
# Two runs of the same settings, each in processes of its own: the same training up to the CPU BLAS's rounding,
# which may differ from process to process (MKL picks kernels by memory alignment; 6e-6 seen after one step).
# A step moves the weights by about the learning rate (1e-3), so this still tells every step apart.
RERUN_GAP = 5e-5


def tag_weights(root, step: int) -> dict[str, torch.Tensor]:
    """The policy's weights in its resumable checkpoint of `step` (ZeRO-2: DeepSpeed's model states hold them whole)."""
    path = root / "work" / "checkpoints" / "policy" / f"step{step}" / "mp_rank_00_model_states.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["module"]


def tags(root, model: str = "policy") -> set[str]:
    return {p.name for p in (root / "work" / "checkpoints" / model).iterdir() if p.is_dir()}


@pytest.fixture(scope="module")
def stepwise(prepared, grpo_args, tmp_path_factory):
    """Four one-update GRPO steps, each checkpointed and kept (the last is the output): the policy's weights
    after every step, which the runs below with the same settings must reproduce."""
    root = tmp_path_factory.mktemp("stepwise")
    result, logged = run_rl(prepared, root, [*grpo_args, *ONE_UPDATE, "rl.max_steps=4", "rl.max_checkpoints=4"])
    weights = {0: load_file(prepared["base_model"] / "model.safetensors"), 4: load_file(result.outputs["rl_model"] / "model.safetensors")}
    weights |= {step: tag_weights(root, step) for step in (1, 2, 3)}
    return root, weights, logged


def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference between two state dicts, over their common keys (an HF output's tied head is its
    embedding, which a DeepSpeed checkpoint holds once)."""
    return max((a[k] - b[k]).abs().max().item() for k in a.keys() & b.keys())


def test_max_checkpoints_keeps_that_many_and_the_output_is_the_last_step(stepwise):
    """rl.max_checkpoints (OpenRLHF's --ckpt.max_num) 4: every checkpoint of the run stays (the last step is the
    output, not a checkpoint); without ema or a best metric the output is the last step's policy."""
    root, weights, _ = stepwise
    assert tags(root) == {"step1", "step2", "step3"} and not (root / "work" / "checkpoints" / "best").exists()
    assert all(gap(weights[s + 1], weights[s]) > 10 * RERUN_GAP for s in range(4))  # each step trains


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
    assert gap(w[1], w1) < RERUN_GAP  # the average is not what trains
    saved = torch.load(tmp_path / "work" / "checkpoints" / "policy" / "step1" / "ema.pt")
    assert gap(saved, {k: 0.75 * w[0][k] + 0.25 * w1[k] for k in saved}) < 1e-6
    result, _ = run_rl(prepared, tmp_path, args)
    assert result.metrics["resumed_from_step"] == 1.0
    out = load_file(result.outputs["rl_model"] / "model.safetensors")
    # W2 only from the stepwise run (this one saves the average): its rounding, weighed 0.25
    assert gap(out, {k: 0.5625 * w[0][k] + 0.1875 * w1[k] + 0.25 * w[2][k] for k in out}) < 0.25 * RERUN_GAP
    assert gap(out, w[2]) > 10 * RERUN_GAP  # not the trained weights


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
    assert gap(out, w[best]) < RERUN_GAP and all(gap(out, w[s]) > 10 * RERUN_GAP for s in (1, 2, 3, 4) if s != best)
    assert tags(tmp_path) == {"step2", "step3"}


def test_actor_groups_that_do_not_fit_the_cluster_fail_with_one_line(prepared, tmp_path):
    with pytest.raises(PipelineError, match=r"stage rl needs 8 CPU .* the Ray cluster has 2 CPU .*rl.placement.colocate_all: true"):
        run_rl(prepared, tmp_path, ["rl.placement.colocate_all=false"])


def test_prompt_longer_than_prompt_max_len_names_the_row(prepared, tmp_path):
    from configs.errors import DataError

    with pytest.raises(DataError, match=r"prompts/train row 0: prompt is \d+ tokens, over rl.rollout.prompt_max_len=2"):
        run_rl(prepared, tmp_path, ["rl.rollout.prompt_max_len=2"])


def test_length_reward_fixture_is_a_valid_reward_file(length_reward):
    from stages.rewards.function import FunctionScorer

    rewards = FunctionScorer(length_reward).score(["p"], ["abc"], [None]).rewards
    assert torch.equal(rewards, torch.tensor([3.0]))


STUCK_REWARD = """import os
import time


def reward_func(queries, prompts, labels):
    with open(os.environ["PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)  # "never" for the test, which fails rather than hangs without the timeout
"""


def test_a_reward_func_that_never_returns_ends_the_stage_and_its_worker(tmp_path):
    """A stuck reward_func ends the stage after reward.timeout_s with one line naming the file and the key;
    its reward worker, which nothing else could stop, is killed."""
    import psutil
    import ray

    from runtime.resources import actor_class
    from runtime.rl_actors import RayActors
    from stages.rewards.errors import RewardError
    from stages.rl.workers import RewardWorker

    (tmp_path / "stuck.py").write_text(STUCK_REWARD)
    cfg = load_config(None, ["reward.func_path=stuck.py", "reward.timeout_s=1.5"])
    worker = actor_class(RewardWorker).options(num_cpus=0, runtime_env={"env_vars": {"PID_FILE": str(tmp_path / "pid")}}).remote(1)
    ray.get(worker.setup.remote(cfg, NodeInputs({}), [], str(tmp_path)))  # the relative path resolved from the given cwd
    started = time.monotonic()
    with pytest.raises(RewardError) as err:
        rl_stage.score(RayActors(), [worker], ["p"] * 3, ["r"] * 3, [None] * 3, cfg.reward)
    assert 1.5 <= time.monotonic() - started < 10
    assert str(err.value) == ("reward.func_path=stuck.py: reward_func did not return within reward.timeout_s=1.5 s "
                              "(a batch of 3 queries); fix the function or raise reward.timeout_s")
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"reward worker {pid} still running"
        time.sleep(0.2)


def test_a_reward_file_that_fails_to_load_in_the_worker_is_the_users_error(tmp_path):
    """A reward file that only fails when run (here, an import the driver's check does not run) comes back
    from the reward worker as the RewardError it is: not an actor death, so never retried as a lost worker."""
    import ray

    from flows import retries
    from flows.stage_task import unwrap
    from runtime.resources import actor_class
    from stages.rewards.errors import RewardError
    from stages.rl.workers import RewardWorker

    (tmp_path / "needs.py").write_text("import no_such_module_xyz\n\n\ndef reward_func(queries, prompts, labels):\n"
                                       "    return [0.0] * len(queries)\n")
    cfg = load_config(None, ["reward.func_path=needs.py"])
    worker = actor_class(RewardWorker).options(num_cpus=0).remote(1)
    try:
        with pytest.raises(RewardError) as err:
            ray.get(worker.setup.remote(cfg, NodeInputs({}), [], str(tmp_path)))
    finally:
        ray.kill(worker)
    error = unwrap(err.value)
    assert isinstance(error, RewardError) and not retries.transient(err.value)
    assert str(error) == ("reward function file needs.py: import failed "
                          "(ModuleNotFoundError: No module named 'no_such_module_xyz')")
