"""A `rlhf run` SIGKILLed at a list of points inside its stages' work, each kill followed by a plain rerun (the
rerun is the resume: each stage goes on from its last checkpoint, the stages that finished are reused from the
cache), the next point landing in that rerun.

A point is a stage and a delay after that stage's first line of work in the current attempt (its first progress
line, its `resumed from step` line; eval's `running` line): where the stage is in its work at the kill (mid
rollout, between micro-batches, inside a checkpoint write) is left to the delay. The stages after SFT take turns
on the one stage worker in an order the flow does not fix, so the points wait for their stage, whichever comes
first."""

from __future__ import annotations

import os
import queue
import random
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.flow.conftest import CLI, assert_gone, cli_env, cluster_processes

KILLED_STAGES = ("sft", "rm", "prm", "rl", "dpo", "eval")
# Seconds of work each stage of the tiny preset has after its first line of work, on a 2-core CPU (a little less than
# it takes): the span a stage's kill points are spread over.
WORK_S = {"sft": 70.0, "rm": 25.0, "prm": 20.0, "rl": 30.0, "dpo": 6.0, "eval": 5.0}

WORK_LINE = re.compile(r"\[(sft|rm|prm|rl|dpo)\] (?:step (\d+)/\d+|resumed from step (\d+))|\[(eval)\] running")
DONE_LINE = re.compile(r"Task run '(\w+)' - Finished in state|\[(\w+)\] cached: ")


@dataclass(frozen=True)
class KillPoint:
    stage: str
    delay_s: float  # after the stage's first line of work in the attempt


def kill_points(n: int, seed: int) -> list[KillPoint]:
    """`n` points: each of KILLED_STAGES once, the others drawn in proportion to the stages' work. A stage's points
    are instants drawn in its WORK_S, in order: each point's delay is the time from the one before, which the
    rerun after that kill resumes near (its last checkpoint), so the kills move through the stage's work."""
    rng = random.Random(seed)
    weights = [WORK_S[s] for s in KILLED_STAGES]
    stages = [*KILLED_STAGES, *rng.choices(KILLED_STAGES, weights=weights, k=n - len(KILLED_STAGES))]
    points = []
    for stage in KILLED_STAGES:
        instants = sorted(rng.uniform(0.0, WORK_S[stage]) for _ in range(stages.count(stage)))
        points += [KillPoint(stage, round(b - a, 1)) for a, b in zip([0.0, *instants], instants)]
    return points


@dataclass(frozen=True)
class Kill:
    point: KillPoint
    hit: str  # the stage at work when the signal went ("" between stages): the point's own unless it ended first
    step: int | None  # the hit stage's last step on the terminal in this attempt
    attempt_s: float  # from the attempt's start to the kill
    in_checkpoint_write: bool  # a checkpoint folder newer than the one `latest` names: the kill came mid-write


def killed_again_and_again(folder: Path, points: list[KillPoint], *overrides: str, attempt_limit_s: float = 900) -> list[Kill]:
    """`rlhf run OVERRIDES` in `folder`, killed (SIGKILL to its process group) at each of `points` in turn, restarted after
    each kill; after each, no process of the group is left. The run is left killed by the last point."""
    pending = {stage: [p for p in points if p.stage == stage] for stage in KILLED_STAGES}
    carried: list[KillPoint] = []  # points of a stage that finished before their turn: for the next stage at work
    kills: list[Kill] = []
    while len(kills) < len(points):
        kills.append(one_attempt(folder, overrides, pending, carried, attempt_limit_s))
    return kills


def one_attempt(folder: Path, overrides: tuple[str, ...], pending: dict[str, list[KillPoint]], carried: list[KillPoint],
                limit_s: float) -> Kill:
    proc = subprocess.Popen([*CLI, "run", *overrides], cwd=folder, env=cli_env(folder), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    started = time.monotonic()
    steps: dict[str, int | None] = {}  # the stages at work in this attempt: their last step on the terminal
    output: list[str] = []
    armed: tuple[KillPoint, float] | None = None
    latest = ""  # the stage of the newest line of work
    while armed is None or time.monotonic() < armed[1]:
        assert time.monotonic() - started < limit_s, f"no kill within {limit_s:g} s:\n" + "".join(output)[-3000:]
        try:
            line = lines.get(timeout=1.0 if armed is None else max(armed[1] - time.monotonic(), 0.0))
        except queue.Empty:
            continue
        if line is None:
            proc.wait(timeout=60)
            left = [p for points in pending.values() for p in points] + carried
            raise AssertionError(f"the run ended ({proc.returncode}) with kill points left ({left}): their stages "
                                 "ended before them\n" + "".join(output)[-3000:])
        output.append(line)
        if work := WORK_LINE.search(line):
            stage = work.group(1) or work.group(4)
            step = work.group(2) or work.group(3)
            steps[stage], latest = int(step) if step else steps.get(stage), stage
            if armed is None and (pending[stage] or carried):
                point = pending[stage].pop(0) if pending[stage] else carried.pop(0)
                armed = (point, time.monotonic() + point.delay_s)
        elif done := DONE_LINE.search(line):
            stage = done.group(1) or done.group(2)
            steps.pop(stage, None)
            carried.extend(pending.pop(stage, []))
            pending[stage] = []
    point = armed[0]
    cluster = cluster_processes(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    attempt_s = time.monotonic() - started
    proc.wait(timeout=60)
    assert_gone(cluster, within_s=5)
    assert group_members(proc.pid) == [], group_members(proc.pid)
    hit = point.stage if point.stage in steps else latest if latest in steps else ""
    return Kill(point, hit, steps.get(hit), round(attempt_s, 1), checkpoint_write_cut(folder, hit))


def group_members(pgid: int) -> list[str]:
    """Every live process of process group `pgid`, wherever it was reparented."""
    found = []
    for p in psutil.process_iter(["pid", "name", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{p.pid} {p.info['name']}")
        except (psutil.Error, ProcessLookupError):
            pass
    return found


STEP_TAG = re.compile(r"^step(\d+)$")


def checkpoint_write_cut(folder: Path, stage: str) -> bool:
    """Whether a checkpoint folder of `stage`'s work dir holds a step newer than the one its `latest` names:
    the save of that step was under way (DeepSpeed writes `latest` last)."""
    for work in (folder / ".rlhf" / "work").glob(f"{stage}-*"):
        for d in (d for d in work.rglob("*") if d.is_dir()):
            tags = [int(m.group(1)) for child in d.iterdir() if (m := STEP_TAG.match(child.name))]
            named = STEP_TAG.match((d / "latest").read_text().strip()) if (d / "latest").is_file() else None
            if tags and max(tags) > (int(named.group(1)) if named else -1):
                return True
    return False
