"""`rlhf verify` on a real run of the tiny pipeline, cut to a few steps a stage: every stage rerun in a scratch
store comes out identical (exit 0) and the user's store is left as it was; a file and a metric point changed in one
stage's stored outputs are named, the other stage verified beside it identical (exit 1); a Ctrl-C during
a rerun stops it within seconds, leaving no scratch folder and no process."""

from __future__ import annotations

import contextlib
import hashlib
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from artifacts import run_tags
from tests.flow.conftest import CLI, as_a_cli_process, cli_env, main_in_process, mlflow_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # on a busy 2-core machine the run and two verifies took 9 min

# the tiny preset cut to a few steps a stage and short generations: what is checked is the comparison, not the models
QUICK = [
    "data.synthetic.num_train=200", "data.synthetic.num_eval=21", "data.synthetic.num_prompts=20", "eval.max_samples=20",
    "eval.max_new_tokens=8", "eval.samples_per_prompt=1", "sft.max_steps=6", "sft.eval_every=3", "sft.save_every=3",
    "rm.max_steps=4", "prm.max_steps=4", "rl.max_steps=2", "rl.rollout.batch_size=4", "rl.rollout.n_samples_per_prompt=4",
    "rl.rollout.generate_max_len=8", "rl.train_batch_size=8", "rl.micro_train_batch_size=4", "rl.eval_every=2",
    "rl.save_every=1", "dpo.max_steps=2", "dpo.micro_batch_size=4",
]
STAGES = ("data_prep", "sft", "rm", "prm", "rl", "dpo", "eval")  # what the preset runs (rs, kd, csft, lora_merge: off)
SCRATCH = re.compile(r"\[verify\] \w+: rerunning MLflow run \w+ in (\S+)/store")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, prefect_server) -> tuple[Path, str]:
    """(its folder, the pipeline run's id) of one finished `rlhf run` of QUICK."""
    ws = tmp_path_factory.mktemp("verify")
    with as_a_cli_process(ws):
        done = main_in_process("run", *QUICK)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = mlflow_client(ws)
    experiment = client.get_experiment_by_name("rlhf-pipeline")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`rlhf.kind` = 'pipeline'")
    return ws, parent.info.run_id


def verify(ws: Path, *args: str) -> subprocess.CompletedProcess:
    with as_a_cli_process(ws):
        return main_in_process("verify", *args)


def store_digest(ws: Path) -> str:
    """Every file of the store (its database and artifacts) by path and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in (ws / ".rlhf").rglob("*") if p.is_file() and "prefect" not in p.relative_to(ws).parts):
        digest.update(f"{path.relative_to(ws)}:{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()


def report(result: subprocess.CompletedProcess) -> dict[str, str]:
    """`{stage: what its line says}` from the lines after `verify RUN:`."""
    lines = result.stdout.split("\nverify ", 1)[1].splitlines()[1:]
    return dict(line.split(": ", 1) for line in lines if line)


def stage_run(ws: Path, stage: str):
    client = mlflow_client(ws)
    experiment = client.get_experiment_by_name("rlhf-pipeline")
    (run,) = client.search_runs([experiment.experiment_id], f"tags.`{run_tags.TAG_STAGE}` = '{stage}'")
    return run


def scratch_folders(result: subprocess.CompletedProcess) -> set[Path]:
    return {Path(m) for m in SCRATCH.findall(result.stdout)}


@contextlib.contextmanager
def changed_byte(path: Path):
    """One byte of `path` flipped for the block, put back after it."""
    original = path.read_bytes()
    path.write_bytes(original[:100] + bytes([original[100] ^ 0xFF]) + original[101:])
    try:
        yield
    finally:
        path.write_bytes(original)


@contextlib.contextmanager
def changed_metric(ws: Path, run_id: str, key: str, step: int, value: float):
    """The stored value of `key` at `step` of run `run_id` replaced for the block (MLflow has no call that edits
    a logged point: the store's table, as damage or an edit would leave it)."""
    db = sqlite3.connect(ws / ".rlhf" / "mlflow.db")
    where = "run_uuid = ? and key = ? and step = ?"
    ((before,),) = db.execute(f"select value from metrics where {where}", (run_id, key, step)).fetchall()
    db.execute(f"update metrics set value = ? where {where}", (value, run_id, key, step))
    db.commit()
    try:
        yield before
    finally:
        db.execute(f"update metrics set value = ? where {where}", (before, run_id, key, step))
        db.commit()
        db.close()


def test_every_stage_reruns_identical_then_a_changed_file_and_metric_are_named(finished):
    ws, run_id = finished
    before = store_digest(ws)
    clean = verify(ws, run_id)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    lines = report(clean)
    assert list(lines) == list(STAGES), clean.stdout[-2000:]
    for stage, said in lines.items():
        assert re.fullmatch(r"identical \(\d+ files, \d+ metrics\)", said), f"{stage}: {said}"
    assert store_digest(ws) == before  # not a byte of the user's store written
    (scratch,) = scratch_folders(clean)
    assert not scratch.exists()

    rm = stage_run(ws, "rm")
    weights = Path(rm.info.artifact_uri.removeprefix("file://")) / "reward_model" / "model.safetensors"
    last_step = max(m.step for m in mlflow_client(ws).get_metric_history(rm.info.run_id, "eval/loss"))
    with changed_byte(weights), changed_metric(ws, rm.info.run_id, "eval/loss", last_step, 7.25) as was:
        changed = store_digest(ws)
        tampered = verify(ws, run_id, "--stages", "rm", "--stages", "prm")
        assert store_digest(ws) == changed
    assert tampered.returncode == 1, tampered.stdout[-3000:] + tampered.stderr[-3000:]
    lines = report(tampered)
    assert list(lines) == ["rm", "prm"]
    assert lines["rm"] == f"differs: first at reward_model/model.safetensors; metric eval/loss at step {last_step}: 7.25 vs {was!r}"
    assert re.fullmatch(r"identical \(\d+ files, \d+ metrics\)", lines["prm"]), lines["prm"]


def test_bad_stage_names_and_an_unfinished_run_are_one_line(finished):
    ws, run_id = finished
    unknown = verify(ws, run_id, "--stages", "sft,nope")
    assert unknown.returncode == 2 and unknown.stderr.strip().startswith("error: --stages nope: unknown stage"), unknown.stderr
    nowhere = verify(ws, "0123456789abcdef0123456789abcdef")
    assert nowhere.returncode == 2
    assert nowhere.stderr.strip() == (f"error: run 0123456789abcdef0123456789abcdef: no such run in sqlite:///{ws}/.rlhf/mlflow.db; "
                                      "`rlhf runs` lists the pipeline runs")
    client = mlflow_client(ws)
    experiment_id = stage_run(ws, "sft").info.experiment_id
    failed = client.create_run(experiment_id, tags={"rlhf.kind": "pipeline", "rlhf.config": "tiny"}).info.run_id
    client.set_terminated(failed, "FAILED")
    result = verify(ws, failed)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: run {failed}: the pipeline run is FAILED, not finished; verify takes a "
                                     "finished run (`rlhf runs` shows each one's status), or one of its complete stage runs")


def family(pid: int) -> dict[psutil.Process, str]:
    found = {}
    for p in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found[p] = " ".join(p.cmdline())[:80]
    return found


def living(processes: dict[psutil.Process, str]) -> list[str]:
    alive = []
    for p, title in processes.items():
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(title)
    return alive


def test_a_ctrl_c_during_a_rerun_stops_within_seconds_and_leaves_nothing(finished):
    ws, run_id = finished
    proc = subprocess.Popen([*CLI, "verify", run_id, "--stages", "rl"], cwd=ws, env=cli_env(ws), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen, deadline = [], time.monotonic() + 240
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("[rl] running") or time.monotonic() > deadline:
            break
    assert seen and seen[-1].startswith("[rl] running"), "".join(seen[-40:])
    time.sleep(3)  # into its steps
    started = family(proc.pid)
    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    took = time.monotonic() - stopped_at
    output = "".join(seen) + rest
    assert proc.returncode == 130, output[-3000:]
    assert took < 15, took
    assert "interrupted: verify stopped" in output
    (scratch,) = {Path(m) for m in SCRATCH.findall(output)}
    assert not scratch.exists()
    assert started  # its Ray cluster and stage workers
    deadline = time.monotonic() + 10
    while living(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not living(started), living(started)
