"""Ray actors take torch's thread count from OMP_NUM_THREADS at process start rather than from
`torch.set_num_threads`, which turns MKL's dynamic threading off (`dist_env.use_threads`;
`python -m benchmarks run threads` measures what that costs)."""

import json

import pytest
import ray

from benchmarks.__main__ import main
from stages.common import dist_env, ray_workers


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
    probe = ThreadProbe.options(num_cpus=1, **ray_workers.thread_env(2)).remote()
    assert ray.get(probe.prepare.remote(2)) == (2, [])


def test_an_actor_whose_count_ray_did_not_set_gets_it_from_torch(ray_cluster):
    probe = ThreadProbe.options(num_cpus=1).remote()  # Ray's OMP_NUM_THREADS: 1
    assert ray.get(probe.prepare.remote(2)) == (2, [2])


def test_threads_benchmark_times_both_settings(tmp_path, capsys):
    out = tmp_path / "benchmarks.json"
    assert main(["run", "threads", "--steps", "1", "--repeats", "1", "--out", str(out), "--workdir", str(tmp_path / "w")]) == 0

    bench = json.loads(out.read_text())["benchmarks"]["threads"]
    for setting in ("env", "set_num_threads"):
        trial = bench["trials"][setting][0]
        assert trial["torch_threads"] == 2 and trial["train_ms"] > 0 and trial["generate_s"] > 0
    assert bench["ratio"]["train_ms"] == pytest.approx(
        bench["medians"]["set_num_threads"]["train_ms"] / bench["medians"]["env"]["train_ms"])
    assert "| time with `set_num_threads` / without |" in capsys.readouterr().out
