"""The workers of the run's Ray job start without the imports no stage uses (runtime/worker_setup.py).
The vLLM engine's interpreter runs the same start (tests/stage/test_rl_vllm.py)."""

import pytest
import ray

from runtime import resources

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
