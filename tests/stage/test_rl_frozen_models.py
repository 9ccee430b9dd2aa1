"""The RL stage's frozen models (in one process, no Ray, so that its workers can be looked at after the run): the
reference and the reward model offloaded between their passes (rl.placement.ref_offload, reward_offload) give the
run without offload, and reward.normalize scores with the statistics the RM's config.json stores."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from configs import load_config
from stages.common import checkpoint, checkpoint_paths
from stages.rl import reward_worker, workers
from stages.rl import stage as rl_stage
from stages.rl.in_process import InProcess
from tests.stage.conftest import FAST, make_ctx

pytestmark = pytest.mark.slow  # trains the policy

# two steps: the second one's samples come from the trained policy, so its KL to the reference is not 0
ARGS = [*FAST, "rl.max_steps=2", "rl.rollout.batch_size=4", "rl.rollout.n_samples_per_prompt=4", "rl.train_batch_size=8",
        "rl.micro_train_batch_size=4", "rl.rollout.micro_batch_size=16", "rl.eval_every=2", "rl.rollout.generate_max_len=12",
        "rl.actor.lr=1e-3", "eval.max_samples=8", "eval.max_new_tokens=12", "eval.samples_per_prompt=2",
        "rl.rollout.engine=hf",  # a reference worker of its own, beside the reward worker
        "rl.algorithm.advantage_estimator=group_norm", "reward.source=rm"]
MEAN, STD = 0.5, 2.0  # what the RM's config.json stores, under OpenRLHF's names


class Recording(InProcess):
    """The in-process backend, keeping every worker it started."""

    def __init__(self):
        super().__init__()
        self.started: list[object] = []

    def start(self, cls, role, index, *args):
        worker = super().start(cls, role, index, *args)
        self.started.append(worker)
        return worker

    def one(self, cls):
        (worker,) = [w for w in self.started if type(w) is cls]
        return worker


@pytest.fixture(scope="module")
def openrlhf_rm(prepared, tmp_path_factory) -> Path:
    """The base model with a random scalar head, saved as OpenRLHF's RM trainer saves one: its eval statistics as
    `mean` and `std`, normalize_reward false."""
    out = tmp_path_factory.mktemp("rm") / "reward_model"
    torch.manual_seed(0)
    with checkpoint.new_head():
        model = AutoModelForSequenceClassification.from_pretrained(checkpoint_paths.resolve(prepared["base_model"]), num_labels=1)
    model.config.update({"normalize_reward": False, "mean": MEAN, "std": STD})
    checkpoint.save(model, checkpoint.load_tokenizer(prepared["base_model"]), out)
    assert json.loads((out / "config.json").read_text())["mean"] == MEAN
    return out


def run(prepared, rm: Path, root: Path, overrides: list[str]) -> tuple[Recording, list[tuple[int, dict]]]:
    backend, logged = Recording(), []
    ctx = make_ctx("rl", load_config(None, [*ARGS, *overrides]), root, lambda metrics, step: logged.append((step, metrics)))
    inputs = {"sft_model": prepared["base_model"], "prompts": prepared["prompts"], "eval_data": prepared["eval_data"],
              "reward_model": rm}
    rl_stage.run_with(backend, ctx, inputs)
    return backend, logged


def by_name(logged: list[tuple[int, dict]], key: str, steps: tuple[int, ...] = (0, 1, 2)) -> list[float]:
    """`key`'s values in step order (0: the held-out eval before RL), of `steps`."""
    return [m[key] for step, m in logged if key in m and step in steps]


@pytest.fixture(scope="module")
def plain(prepared, openrlhf_rm, tmp_path_factory):
    return run(prepared, openrlhf_rm, tmp_path_factory.mktemp("plain"), [])


def test_offloaded_reference_and_reward_model_give_the_run_without_offload(prepared, openrlhf_rm, plain, tmp_path):
    """With offload their weights sit in host memory between passes and go to the compute device (this machine's CPU:
    no copy) for each: the reference once per rollout step, the RM for every scoring call; the samples, rewards, KL
    and losses are the run's without offload."""
    plain_backend, plain_logged = plain
    backend, logged = run(prepared, openrlhf_rm, tmp_path, ["rl.placement.ref_offload=true", "rl.placement.reward_offload=true"])
    reference = backend.one(workers.ReferenceWorker).reference
    (reward_model,) = backend.one(reward_worker.RewardWorker).scorer.models
    for held in (reference, reward_model):
        assert held.offload and held.weights_device == torch.device("cpu") and held.hosted
    assert reference.lent == 2  # two rollout steps
    assert reward_model.lent == 6  # two rollouts, and the greedy and the sampled responses of the evals before and after
    plain_reference = plain_backend.one(workers.ReferenceWorker).reference
    assert not plain_reference.offload and plain_reference.lent == 0 and plain_reference.hosted == []
    assert by_name(plain_logged, "train/kl", (2,))[0] > 0
    for key in ("train/reward", "rollout/reward_std", "train/kl", "actor/policy_loss", "train/response_length", "eval/reward"):
        assert by_name(logged, key) == by_name(plain_logged, key), key


def test_reward_normalize_scores_with_the_rms_stored_mean_and_std(prepared, openrlhf_rm, plain, tmp_path):
    """OpenRLHF's --normalize_reward at RL time: each reward (r - mean) / std with the checkpoint's mean 0.5 and std
    2, so the held-out mean reward before RL and the first step's are (raw mean - 0.5) / 2, and the step's spread the
    raw spread / 2: the same samples, drawn before any reward is read."""
    _, raw = plain
    _, normalized = run(prepared, openrlhf_rm, tmp_path, ["reward.normalize=true", "rl.max_steps=1"])
    for key, step in (("eval/reward", 0), ("eval/sampled_reward", 0), ("train/reward", 1)):
        (got,), (was,) = by_name(normalized, key, (step,)), by_name(raw, key, (step,))
        assert got == pytest.approx((was - MEAN) / STD, rel=1e-5, abs=1e-6), key
    assert by_name(normalized, "rollout/reward_std", (1,)) == pytest.approx([s / STD for s in by_name(raw, "rollout/reward_std", (1,))],
                                                                            rel=1e-5)
    assert by_name(normalized, "train/response_length", (1,)) == by_name(raw, "train/response_length", (1,))
