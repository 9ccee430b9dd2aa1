"""Stages run in-process (no Prefect, no MLflow): tiny synthetic data and a tiny model."""

from __future__ import annotations

import os

import pytest

from configs import load_config
from runtime import resources
from stages.common import dist_env
from stages.dag.contract import StageContext
from stages.data_prep import stage as data_prep

# Small enough that each stage runs in seconds; the flow tests run the real preset.
FAST = [
    "data.synthetic.num_train=400",
    "data.synthetic.num_eval=40",
    "data.synthetic.num_prompts=40",
    "eval.max_samples=40",
    "sft.max_steps=30",
    "sft.save_every=10",
    "sft.eval_every=10",
    "sft.micro_batch_size=16",
]
# Rewards that differ between samples of the untrained model, so every estimator has a signal (the RL tests).
LENGTH_REWARD = "def reward_func(queries, prompts, labels):\n    return [len(q) - len(p) for q, p in zip(queries, prompts)]\n"


@pytest.fixture(scope="session", autouse=True)
def single_rank_env():
    """The torch.distributed environment a Ray worker would set for a one-rank stage."""
    env = {**dist_env.single_rank_env(), "DS_ACCELERATOR": "cpu"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def fast_config():
    return load_config(None, FAST)


def make_ctx(stage: str, cfg, root, log_metrics=None) -> StageContext:
    ctx = StageContext(stage=stage, config=cfg, output_dir=root / "output", work_dir=root / "work")
    ctx.output_dir.mkdir(parents=True, exist_ok=True)
    if log_metrics is not None:
        ctx.log_metrics = log_metrics
    return ctx


@pytest.fixture(scope="session")
def prepared(fast_config, tmp_path_factory):
    """data_prep's outputs for the fast config."""
    root = tmp_path_factory.mktemp("data_prep")
    return data_prep.run(make_ctx("data_prep", fast_config, root), {}).outputs


@pytest.fixture(scope="module")
def ray_cluster():
    """A fresh local Ray cluster for the module (RL actors and rollout engines)."""
    with resources.local_cluster(num_cpus=2, log_to_driver=False):
        yield


@pytest.fixture(scope="module")
def length_reward(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "length.py"
    path.write_text(LENGTH_REWARD)
    return str(path)


@pytest.fixture(scope="module")
def grpo_args(length_reward) -> list[str]:
    """A test module's GRPO run's settings (on top of tests/stage/rl_runs.py's RL_FAST): the tests that compare against it start from them."""
    return ["rl.algorithm.advantage_estimator=group_norm", f"reward.func_path={length_reward}"]


class Recorder:
    """A stage's metric sink that keeps what it is given; `fail_at`: a Ctrl-C at that step (a kill)."""

    def __init__(self, fail_at: int | None = None):
        self.rows: list[tuple[int, dict]] = []
        self.fail_at = fail_at

    def __call__(self, metrics, step):
        if step == self.fail_at:
            raise KeyboardInterrupt(f"simulated kill at step {step}")
        self.rows.append((step, dict(metrics)))
