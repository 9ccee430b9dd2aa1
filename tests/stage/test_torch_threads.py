"""Ray actors take torch's thread count from OMP_NUM_THREADS at process start rather than from
`torch.set_num_threads`, which turns MKL's dynamic threading off (`dist_env.use_threads`;
`python -m benchmarks run threads` measures what that costs)."""

import pytest
import ray

from runtime import resources
from stages.common import dist_env

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)


@ray.remote
class ThreadProbe:
    def prepare(self, threads: int) -> tuple[int, list[int]]:
        """torch's thread count after `prepare_process`, and the counts it passed to set_num_threads."""
        import torch

        calls, original = [], torch.set_num_threads

        def recording(n: int) -> None:
            calls.append(n)
            original(n)

        torch.set_num_threads = recording
        try:
            dist_env.prepare_process(threads)
        finally:
            torch.set_num_threads = original
        return torch.get_num_threads(), calls


def test_an_actor_sharing_its_cores_starts_with_their_thread_count(ray_cluster):
    probe = ThreadProbe.options(num_cpus=1, **resources.thread_env(2)).remote()
    assert ray.get(probe.prepare.remote(2)) == (2, [])


def test_an_actor_whose_count_ray_did_not_set_gets_it_from_torch(ray_cluster):
    probe = ThreadProbe.options(num_cpus=1).remote()  # Ray's OMP_NUM_THREADS: 1
    assert ray.get(probe.prepare.remote(2)) == (2, [2])
