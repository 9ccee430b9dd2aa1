"""Async training's queue (OpenRLHF's --train.async_queue_size): the first rollout rounds of the next steps,
drawn before the policy trains on this one.

With a queue of N, step t's samples are drawn while the policy trains on step t-N's, so from step N+1 on
they come from the weights N updates back. A draw is launched during a step, before its update, and the
engines run their calls in order, so which weights a draw sees is fixed by the step it was launched in,
not by timing: a run is the same run each time. The prompts of a queued step are picked when it is
queued (stream positions taken in order; a dynamic-filtering refill picks after them), so a checkpoint's
`cursor` and the queued draws' starts pick the same prompts again on resume. A checkpoint keeps what the
queued steps drew (`Collected`): a resumed run trains on the samples the killed run drew, from the weights of
the steps they were launched in, so it goes on as the uninterrupted run does.

A multi-turn agent's draw is not one engine call but turns of calls and environment steps: it is played
in a thread of the driver's (one draw at a time, in step order) while the policy trains, and `settle`
waits for it before the weights change, so that every turn of it sees the weights it was launched with, as
a single-call draw does. Where the engines are the policy ranks (the hybrid engine) or nothing runs
concurrently (the one-process backend), it is played when launched instead: the same episodes, no overlap.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass
class Collected:
    """A draw a checkpoint kept, as it was drawn: its samples (a multi-turn draw: its samples and rewards)."""

    result: Any


@dataclass
class Drawn:
    step: int  # the (0-based) step whose first round it is
    start: int  # its first prompt's position in the prompt stream
    updates: int  # policy updates done when it was launched
    # the launched generation (refs), the episodes being played (a Future of samples and rewards), or a
    # resumed checkpoint's draw (Collected)
    pending: Any


class DrawnAhead:
    """Up to `size` steps' first rounds, in step order; `size` 0: none (synchronous training)."""

    def __init__(self, size: int):
        self.size = size
        self.queue: deque[Drawn] = deque()
        self.pool: ThreadPoolExecutor | None = None

    def play(self, episodes: Callable[[], Any], overlap: bool) -> Future:
        """Episodes drawn ahead: played in this queue's thread (`overlap`), else now."""
        if overlap:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rl-episodes-ahead")
            return self.pool.submit(episodes)
        done: Future = Future()
        done.set_result(episodes())
        return done

    def settle(self) -> None:
        """Wait for the episodes being played ahead (before the weights change); an error in them is raised here."""
        for drawn in self.queue:
            if isinstance(drawn.pending, Future):
                drawn.pending.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def take(self, step: int) -> Drawn | None:
        """The first round drawn ahead for `step`, if one was."""
        if self.queue and self.queue[0].step == step:
            return self.queue.popleft()
        return None

    def to_draw(self, step: int, total: int) -> list[int]:
        """The steps to draw for now, during `step` (0-based): those after the queued ones, up to `size` ahead
        and not past the run's last step."""
        first = self.queue[-1].step + 1 if self.queue else step + 1
        return list(range(first, min(step + self.size, total - 1) + 1))

    def add(self, drawn: Drawn) -> None:
        self.queue.append(drawn)

