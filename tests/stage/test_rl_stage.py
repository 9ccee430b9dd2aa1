"""The RL stage on a local Ray cluster with the tiny model: every actor group, engine and reference actors,
weight sync into the rollout engine, async training and its queue's resume, the reward worker's faults.
(What the driver computes whatever runs its workers: tests/stage/test_rl_algorithms.py, in one process;
learning on the real preset: flow tests.)"""

import time

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from configs import PipelineError, load_config
from stages.dag.contract import NodeInputs
from stages.rl import stage as rl_stage
from tests.stage.rl_runs import RL_FAST, run_rl, same

STEP_KEYS = {"train/reward", "rollout/reward_std", "train/kl", "actor/entropy", "actor/policy_loss", "actor/clip_frac",
             "rollout/advantage_mean", "rollout/advantage_std", "train/response_length", "time/generation", "time/reward",
             "time/experience", "time/training", "time/weight_sync", "rollout/samples_per_s", "rollout/logprob_gap"}


pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.slow]  # slow: the fast lane leaves out Ray


@pytest.fixture(scope="module")
def grpo(prepared, grpo_args, tmp_path_factory):
    return run_rl(prepared, tmp_path_factory.mktemp("grpo"), grpo_args)


def test_grpo_logs_every_step_metric_and_evals(grpo):
    result, logged = grpo
    steps = [(s, m) for s, m in logged if "train/reward" in m]
    assert [s for s, _ in steps] == [1, 2]
    for _, m in steps:
        assert set(m) >= STEP_KEYS, STEP_KEYS - set(m)
        assert not {"rollout/kl_coef", "rollout/filtered_groups"} & set(m)  # fixed by the config: no flat lines
    assert [s for s, m in logged if "eval/accuracy" in m] == [0, 1, 2]
    # the eval stage's metrics (stages.eval.metrics): no pass@k, since the length reward is not 0/1
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
    from stages.data.prepared import read_split
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
            assert m[key] == by_step[step][key], (step, key)
    assert same(load_file(whole.outputs["rl_model"] / "model.safetensors"),
                load_file(result.outputs["rl_model"] / "model.safetensors"))


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


def test_async_training_plays_a_multi_turn_agents_episodes_one_update_behind(grpo_args, prepared, tmp_path):
    """rl.rollout.async_train with rl.agent.path: step 2's episodes, every turn of them, are played while the
    policy trains on step 1's (in a thread of the driver's, settled before the weights sync), so they come from
    the weights one update back, as a one-turn draw's do."""
    result, logged = run_rl(prepared, tmp_path, [*grpo_args, "rl.rollout.async_train=true", "rl.eval_every=2",
                                                 "rl.agent.path=agents/chained_arithmetic.py",
                                                 "rl.placement.colocate_all=false", "rl.placement.colocate_models=true",
                                                 "infra.cpus_per_worker=1"])
    steps = {s: m for s, m in logged if "train/reward" in m}
    assert {s: m["rollout/staleness"] for s, m in steps.items()} == {1: 0, 2: 1}
    # the stand-in policy earns no reward yet, so its update is small: measured gaps 1.2e-7 (step 1, on-policy)
    # and 3.7e-4 (step 2, one update stale); on-policy stays under 1e-4 as in the synchronous runs
    assert steps[1]["rollout/logprob_gap"] < 1e-4 < steps[2]["rollout/logprob_gap"], steps
    assert all(1.0 <= m["rollout/turns"] <= 2.0 for m in steps.values())
    assert "eval/turns" in result.metrics


def test_a_queue_of_two_steps_draws_two_updates_behind_and_resumes_with_its_queue(grpo_args, prepared, tmp_path):
    """rl.rollout.async_queue_size=2: steps 1 and 2 are drawn before any update (step 2 one update stale), steps 3
    and 4 during steps 1 and 2 (two updates stale); only step 1's engine log-probs agree with the policy's. Killed
    at step 4, the rerun resumes from step 2's checkpoint, whose queue holds what steps 3 and 4 drew from the
    weights of their own steps: it trains on those, as the uninterrupted run does, and ends on its weights, bit for
    bit, with the same metrics."""
    args = [*grpo_args, "rl.rollout.async_train=true", "rl.rollout.async_queue_size=2", "rl.max_steps=4", "rl.eval_every=4",
            "rl.save_every=2", "rl.placement.colocate_all=false", "rl.placement.colocate_models=true",
            "infra.cpus_per_worker=1"]
    whole, whole_logged = run_rl(prepared, tmp_path / "whole", args)
    steps = {s: m for s, m in whole_logged if "train/reward" in m}
    assert {s: m["rollout/staleness"] for s, m in steps.items()} == {1: 0, 2: 1, 3: 2, 4: 2}
    assert steps[1]["rollout/logprob_gap"] < 1e-4
    assert all(steps[s]["rollout/logprob_gap"] > 1e-3 for s in (2, 3, 4)), steps
    with pytest.raises(RuntimeError, match="killed at step 4"):
        run_rl(prepared, tmp_path / "killed", args, fail_at=4)
    resumed, logged = run_rl(prepared, tmp_path / "killed", args)
    assert resumed.metrics["resumed_from_step"] == 2.0
    again = {s: m for s, m in logged if "train/reward" in m}
    assert list(again) == [3, 4]
    for s in (3, 4):
        assert again[s]["rollout/staleness"] == 2 and again[s]["train/reward"] == steps[s]["train/reward"]
        assert again[s]["rollout/logprob_gap"] == steps[s]["rollout/logprob_gap"]
    a, b = (load_file(r.outputs["rl_model"] / "model.safetensors") for r in (whole, resumed))
    assert same(a, b)


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


def test_actor_groups_that_do_not_fit_the_cluster_fail_with_one_line(prepared, tmp_path):
    with pytest.raises(PipelineError, match=r"stage rl needs 8 CPU .* the Ray cluster has 2 CPU .*rl.placement.colocate_all: true"):
        run_rl(prepared, tmp_path, ["rl.placement.colocate_all=false"])


def test_prompt_longer_than_prompt_max_len_names_the_row(prepared, tmp_path):
    from configs.errors import DataError

    with pytest.raises(DataError, match=r"prompts/train row 0: prompt is \d+ tokens, over rl.rollout.prompt_max_len=2"):
        run_rl(prepared, tmp_path, ["rl.rollout.prompt_max_len=2"])


def test_length_reward_fixture_is_a_valid_reward_file(length_reward):
    from stages.rewards.func_scorer import FunctionScorer

    rewards = FunctionScorer(length_reward).score(["p"], ["abc"], [None]).rewards
    assert torch.equal(rewards, torch.tensor([3.0]))


STUCK_REWARD = """import os
import time


def reward_func(queries, prompts, labels):
    with open(os.environ["PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)  # "never" for the test, which fails on its deadline rather than hangs without the timeout
"""


def test_a_reward_func_that_never_returns_ends_the_stage_and_its_worker(tmp_path):
    """A stuck reward_func ends the stage after reward.timeout_s with one line naming the file and the key;
    its reward worker, which nothing else could stop, is killed."""
    import psutil
    import ray

    from configs.errors import RewardError
    from runtime.resources import actor_class
    from runtime.rl_actors import RayActors
    from stages.rl.reward_worker import RewardWorker

    class Recorded(RayActors):
        """The Ray backend, keeping the timeout of each wait for results and the workers it killed."""

        def __init__(self):
            super().__init__()
            self.timeouts: list[float | None] = []
            self.killed: list[object] = []

        def get(self, refs, timeout=None):
            self.timeouts.append(timeout)
            return super().get(refs, timeout=timeout)

        def kill(self, worker):
            self.killed.append(worker)
            super().kill(worker)

    (tmp_path / "stuck.py").write_text(STUCK_REWARD)
    cfg = load_config(None, ["reward.func_path=stuck.py", "reward.timeout_s=1.5"])
    worker = actor_class(RewardWorker).options(num_cpus=0, runtime_env={"env_vars": {"PID_FILE": str(tmp_path / "pid")}}).remote(1)
    ray.get(worker.setup.remote(cfg, NodeInputs({}), [], str(tmp_path)))  # the relative path resolved from the given cwd
    backend = Recorded()
    started = time.monotonic()
    with pytest.raises(RewardError) as err:
        rl_stage.score(backend, [worker], ["p"] * 3, ["r"] * 3, [None] * 3, cfg.reward)
    took = time.monotonic() - started
    # one wait for the scores, bounded by reward.timeout_s; then the worker is killed
    assert backend.timeouts == [1.5] and len(backend.killed) == 1 and backend.killed[0] is worker
    assert took < 120, f"{took:.0f} s: a stuck reward_func held the stage past reward.timeout_s=1.5"
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

    from configs.errors import RewardError
    from flows import retries
    from flows.stage_task import unwrap
    from runtime.resources import actor_class
    from stages.rl.reward_worker import RewardWorker

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
