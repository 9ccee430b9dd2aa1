"""How `rlhf run` ends: the terminal keeps Prefect's run logs but not their tracebacks, a state folder
the run made is removed only when no stage run was recorded in it, and a second Ctrl-C (or a stop that
takes too long) ends the process at once; a SIGTERM stops it as a Ctrl-C does."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mlflow import MlflowClient

from artifacts import run_tags
from flows.run_end import NoRunTracebacks, remove_if_unused

ROOT = Path(__file__).resolve().parents[2]


def record(name: str, traceback: bool) -> logging.LogRecord:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info() if traceback else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, "Encountered exception during execution", None, exc_info)


def test_the_terminal_drops_run_records_with_a_traceback_and_keeps_the_rest():
    keep = NoRunTracebacks().filter
    assert not keep(record("prefect.flow_runs", traceback=True))
    assert not keep(record("prefect.task_runs", traceback=True))
    assert keep(record("prefect.flow_runs", traceback=False))  # 'Finished in state Failed(...)': one line
    assert keep(record("prefect.events.clients", traceback=True))  # not a run's: Prefect's own trouble shows


def test_rays_warning_that_a_thread_started_it_without_a_sigterm_handler_is_dropped_and_its_others_kept():
    from flows.run_end import quiet_ray_thread_warning

    logger, seen = logging.getLogger("ray._private.worker"), []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        quiet_ray_thread_warning()
        logger.warning("SIGTERM handler is not set because current thread is not the main thread.")
        logger.warning("Started a local Ray instance.")
    finally:
        logger.removeHandler(handler)
    assert seen == ["Started a local Ray instance."]


def state_folder(tmp_path: Path, empty_store: Path, stage_ran: bool) -> tuple[Path, str]:
    """A state folder whose store holds a pipeline run and, if `stage_ran`, a run of one of its stages."""
    state = tmp_path / ".rlhf"
    (state / "prefect").mkdir(parents=True)
    shutil.copyfile(empty_store, state / "mlflow.db")
    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("rlhf-pipeline", artifact_location=(state / "mlartifacts").as_uri())
    client.create_run(exp, tags={"rlhf.kind": "pipeline"})
    if stage_ran:
        client.create_run(exp, tags={run_tags.TAG_STAGE: "data_prep"})
    return state, uri


def test_a_fresh_state_folder_whose_run_recorded_no_stage_is_removed(tmp_path, empty_store):
    state, uri = state_folder(tmp_path, empty_store, stage_ran=False)
    assert remove_if_unused(state, uri)
    assert not state.exists()


def test_a_state_folder_with_a_stage_run_or_a_work_dir_is_kept(tmp_path, empty_store):
    state, uri = state_folder(tmp_path, empty_store, stage_ran=True)
    assert not remove_if_unused(state, uri) and (state / "mlflow.db").exists()
    remote = tmp_path / "remote-store"  # the store elsewhere: a stage's work dir marks what ran here
    (remote / "work" / "sft-0123").mkdir(parents=True)
    assert not remove_if_unused(remote, "http://127.0.0.1:5000") and remote.exists()


def test_a_store_that_cannot_be_read_is_left_for_the_user(tmp_path):
    state = tmp_path / ".rlhf"
    state.mkdir()
    (state / "mlflow.db").write_bytes(b"not a database")
    assert not remove_if_unused(state, f"sqlite:///{state / 'mlflow.db'}") and state.exists()


def ctrl_c(script: str) -> subprocess.CompletedProcess:
    code = "import os, signal, time\nfrom flows import run_end\n" + script
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_first_ctrl_c_raises_keyboard_interrupt_and_a_second_one_ends_the_process():
    done = ctrl_c(
        "with run_end.bounded_interrupt():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(60)\n"
        "    except KeyboardInterrupt:\n"
        "        print('stopping', flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(60)\n"
    )
    assert done.returncode == 130 and done.stdout == "stopping\n", done.stderr
    assert done.stderr.splitlines() == [
        "interrupted: a second Ctrl-C; stopped without waiting for the stages; rerun to resume"]


def test_a_stop_that_outlasts_its_bound_ends_the_process():
    done = ctrl_c(
        "run_end.FORCE_EXIT_S = 0.5\n"
        "with run_end.bounded_interrupt():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(60)\n"
        "    except KeyboardInterrupt:\n"
        "        time.sleep(60)  # a stage that does not stop\n"
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == [
        "interrupted: still stopping after 0.5 s; stopped without waiting for the stages; rerun to resume"]


# inside a stop begun by a SIGTERM: a second one, then a stage that does not stop (the bound, 1.5 s, ends it)
SIGTERM_AGAIN_THEN_HANG = (
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "        time.sleep(0.5)\n"
    "        print('still stopping', flush=True)\n"
    "        time.sleep(60)\n"
)
SIGTERM_BOUND_HIT = "terminated: still stopping after 1.5 s; stopped without waiting for the stages; rerun to resume"


def test_a_sigterm_raises_terminated_a_repeat_leaves_the_stop_going_and_its_bound_holds():
    """What `timeout`, systemd's stop or SLURM's cancel send, maybe more than once."""
    done = ctrl_c(
        "run_end.FORCE_EXIT_S = 1.5\n"
        "with run_end.bounded_interrupt():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(60)\n"
        "    except run_end.Terminated as exc:\n"
        "        print(exc, flush=True)\n"
        + SIGTERM_AGAIN_THEN_HANG
    )
    assert done.returncode == 143, done.stderr
    assert done.stdout == "stopped; rerun to resume\nstill stopping\n"
    assert done.stderr.splitlines() == [SIGTERM_BOUND_HIT]


def test_a_stop_begun_in_prefects_sigterm_handler_gets_the_bound_and_a_repeat_leaves_it_going():
    """During the flow Prefect's engine holds SIGTERM and raises its TerminationSignal; the flow's stop then
    takes SIGTERM back (`stop_began`), so a second one does not raise in the middle of the stop."""
    done = ctrl_c(
        "from prefect.exceptions import TerminationSignal\n"
        "run_end.FORCE_EXIT_S = 1.5\n"
        "def prefects(signum, frame):\n"
        "    raise TerminationSignal(signum)\n"
        "with run_end.bounded_interrupt():\n"
        "    signal.signal(signal.SIGTERM, prefects)\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(60)\n"
        "    except TerminationSignal:\n"
        "        run_end.stop_began(signal.SIGTERM)\n"
        + SIGTERM_AGAIN_THEN_HANG
    )
    assert done.returncode == 143, done.stderr
    assert done.stdout == "still stopping\n"
    assert done.stderr.splitlines() == [SIGTERM_BOUND_HIT]
