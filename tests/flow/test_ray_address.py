"""`infra.ray_address` pointing at a cluster started with `ray start --head` is used instead of a
local one, and the pipeline leaves that cluster running."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.flow.conftest import run_cli

pytestmark = pytest.mark.slow

SHORT = [
    "data.synthetic.num_train=400", "data.synthetic.num_eval=20", "data.synthetic.num_prompts=40", "eval.max_samples=20",
    "sft.max_steps=10", "rm.max_steps=5", "prm.max_steps=5", "rl.max_steps=1", "rl.eval_every=1",
    "eval.samples_per_prompt=1",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture
def head():
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    ray_bin = Path(sys.executable).parent / "ray"
    proc = subprocess.Popen([str(ray_bin), "start", "--head", "--block", "--num-cpus=2", f"--port={port}",
                             "--include-dashboard=false", f"--temp-dir={temp_dir}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("ray start --head did not open its port")
    yield port, proc
    os.killpg(proc.pid, signal.SIGKILL)  # the head and every Ray process it started share its session
    proc.wait(timeout=60)
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_pipeline_runs_on_the_cluster_named_in_the_config(head, tmp_path):
    port, proc = head
    result = run_cli(tmp_path, "run", *SHORT, f"infra.ray_address=127.0.0.1:{port}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"[ray] connected to cluster at 127.0.0.1:{port}" in result.stdout
    assert "Started a local Ray instance" not in result.stdout + result.stderr
    assert proc.poll() is None  # the pipeline disconnects; it does not stop a cluster it did not start
