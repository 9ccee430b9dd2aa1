"""The workers of the run's Ray job start without the imports no stage uses (runtime/worker_setup.py).
The vLLM engine's interpreter runs the same start (tests/stage/test_rl_vllm.py)."""

import pytest
import ray

from configs import load_config
from runtime import resources
from runtime.resources import actor_class
from runtime.rl_actors import RayActors
from stages.dag.contract import NodeInputs
from stages.rl import stage as rl_stage
from stages.rl.reward_worker import RewardWorker

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.slow]  # slow: a Ray cluster


@ray.remote
class Probe:
    def what_it_sees(self) -> tuple[object, bool, bool]:
        import sys

        from transformers.generation import candidate_generator  # the module that would import scikit-learn
        from transformers.utils import is_sklearn_available

        return sys.modules["sklearn"], is_sklearn_available(), hasattr(candidate_generator, "roc_curve")


@pytest.mark.parametrize("options", [{}, resources.thread_env(1)], ids=["plain", "with-its-own-runtime-env"])
def test_a_worker_starts_without_scikit_learn_and_transformers_does_not_look_for_it(options):
    probe = Probe.options(num_cpus=0, **options).remote()
    assert ray.get(probe.what_it_sees.remote(), timeout=300) == (None, False, False)


USES_SKLEARN = """import sklearn


def reward_func(queries, prompts, labels):
    return [float(bool(sklearn.__version__))] * len(queries)
"""


def rewards_in_a_worker(folder, reward_file: str) -> list[float]:
    """The rewards a fresh reward actor gives two answers with `reward_file` (in `folder`) as its rule function."""
    (folder / "reward.py").write_text(reward_file)
    cfg = load_config(None, ["reward.func_path=reward.py"])
    worker = actor_class(RewardWorker).options(num_cpus=0).remote(1)
    try:
        ray.get(worker.setup.remote(cfg, NodeInputs({}), [], str(folder)), timeout=300)
        return rl_stage.score(RayActors(), [worker], ["p"] * 2, ["r"] * 2, [None] * 2, cfg.reward).rewards.tolist()
    finally:
        ray.kill(worker)


def test_a_reward_file_in_a_worker_imports_scikit_learn(tmp_path):
    """The mark keeps scikit-learn out of what the stages import, not out of a user's reward_func.py."""
    assert rewards_in_a_worker(tmp_path, USES_SKLEARN) == [1.0, 1.0]


SEES_ITS_IMPORTS = """import os
import sys


def reward_func(queries, prompts, labels):
    heavy = [name for name in ("transformers", "deepspeed", "mlflow", "datasets", "peft") if name in sys.modules]
    return [float(len(heavy)), float(os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1")]
"""


def test_the_reward_worker_of_a_rule_function_imports_no_model_library(tmp_path):
    """A rule function's reward worker needs torch and the file: no transformers, DeepSpeed or MLflow (each
    RL run's reward actor starts seconds sooner), and HF's bars are off for a library the file may import."""
    assert rewards_in_a_worker(tmp_path, SEES_ITS_IMPORTS) == [0.0, 1.0]
