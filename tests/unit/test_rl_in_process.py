"""The RL driver's in-process backend: calls made once and in order, results standing in for calls passed
as arguments (as Ray's object refs do), a timeout on a call that never returns, and the layout one process
can run."""

import threading
import time

import pytest

from configs import ConfigError, load_config
from stages.rl.backend import one
from stages.rl.in_process import InProcess, layout


class Counter:
    def __init__(self):
        self.calls: list[tuple] = []

    def add(self, *args):
        self.calls.append(args)
        return sum(args)

    def stuck(self, release: threading.Event):
        release.wait(120)  # "never", until the test lets it go


def test_a_call_runs_once_when_first_needed_and_its_pending_result_stands_in_for_it_as_an_argument():
    backend, worker = InProcess(), Counter()
    first = backend.call(worker.add, 1, 2)
    assert worker.calls == []  # not run yet
    second = backend.call(worker.add, first, 10)  # a pending result as an argument: its value
    assert backend.get([second, first]) == [13, 3]
    assert worker.calls == [(1, 2), (3, 10)]
    assert one(backend, first) == 3 and len(worker.calls) == 2  # asked again: not run again


def test_a_call_that_never_returns_ends_with_a_timeout_error():
    backend, release = InProcess(), threading.Event()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"calls still running after 0.5 s"):
            backend.get([backend.call(Counter().stuck, release)], timeout=0.5)
        took = time.monotonic() - started
        assert took < 30, f"{took:.1f} s: a call that never returns held get(timeout=0.5)"
    finally:
        release.set()  # the call's thread, left behind, ends


def test_a_call_that_raises_raises_in_the_caller_with_or_without_a_timeout():
    backend = InProcess()
    with pytest.raises(TypeError):
        backend.get([backend.call(Counter().add, "a", 1)], timeout=5)
    with pytest.raises(TypeError):
        one(backend, backend.call(Counter().add, "a", 1))


def test_one_process_samples_in_the_policy_or_beside_it_under_zero_3_and_refuses_what_it_cannot_run():
    assert layout(load_config(None, ["rl.rollout.engine=auto"])).rl.rollout.engine == "hybrid"
    assert layout(load_config(None, ["rl.rollout.engine=auto", "infra.zero_stage=3"])).rl.rollout.engine == "hf"
    assert layout(load_config(None, ["rl.rollout.engine=hf"])).rl.rollout.engine == "hf"
    with pytest.raises(ConfigError, match=r"rl.rollout.engine=vllm: vLLM runs in processes of its own"):
        layout(load_config(None, ["rl.rollout.engine=vllm"]))
    with pytest.raises(ConfigError, match=r"rl.actor.num_workers=2: a one-process RL run has one rank per model; set it to 1"):
        layout(load_config(None, ["rl.rollout.engine=hf", "rl.actor.num_workers=2"]))
