"""The lock that keeps two pipeline runs from training one stage + fingerprint at once: a run waiting
for it stops waiting when it is stopped (Ctrl-C)."""

import threading
import time

from flows.stage_task import LOCK_POLL_S, work_dir_lock


def test_a_stage_waiting_for_another_runs_lock_gives_up_when_its_run_is_stopped(tmp_path, capsys):
    work_dir = tmp_path / "state" / "work" / "sft-0123"
    stopping = threading.Event()
    outcome = {}

    def second_run():
        try:
            with work_dir_lock(work_dir, "sft", stopping):
                outcome["locked"] = True
        except KeyboardInterrupt:
            outcome["stopped_at"] = time.monotonic()

    with work_dir_lock(work_dir, "sft", threading.Event()):  # the first run trains the stage
        waiter = threading.Thread(target=second_run)
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not outcome
        stopped = time.monotonic()
        stopping.set()
        waiter.join(timeout=30)
    assert outcome.keys() == {"stopped_at"}
    took = outcome["stopped_at"] - stopped
    # it waits on the stop Event between looks at the lock (LOCK_POLL_S apart), so a stop ends the wait at once;
    # the bound says "within seconds", generous for a loaded machine
    assert took < LOCK_POLL_S + 10, f"{took:.1f} s from the stop to the waiting run giving up the lock"
    assert "[sft] waiting: another pipeline run is running this stage" in capsys.readouterr().out


def test_the_lock_is_taken_once_the_other_run_lets_go(tmp_path):
    work_dir = tmp_path / "state" / "work" / "sft-0123"
    got = threading.Event()

    def second_run():
        with work_dir_lock(work_dir, "sft", threading.Event()):
            got.set()

    with work_dir_lock(work_dir, "sft", threading.Event()):
        waiter = threading.Thread(target=second_run)
        waiter.start()
        assert not got.wait(0.5)
    assert got.wait(LOCK_POLL_S + 5)
    waiter.join()
