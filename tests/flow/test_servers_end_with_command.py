"""The servers `rlhf ui` and `rlhf serve` start end with the command, however it ends: a SIGKILL of the command,
which no handler of its own sees, leaves no server answering and no process of it behind."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from stages.common.dist_env import free_port
from tests.flow.conftest import CLI, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
STARTS_WITHIN_S = 90  # `mlflow ui` imports MLflow and opens the store before it answers
ENDS_WITHIN_S = 30


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def wait_for(condition, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def gone(procs: list[psutil.Process]) -> bool:
    return not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_rlhf_ui_killed_leaves_no_mlflow_ui(tmp_path):
    port = free_port()
    command = subprocess.Popen([*CLI, "ui", "--port", str(port)], cwd=tmp_path, env=cli_env(tmp_path),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    server: list[psutil.Process] = []
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/health"), STARTS_WITHIN_S, "the MLflow UI never answered")
        server = descendants(command.pid)
        assert server, "the UI runs as the command's child"
        command.send_signal(signal.SIGKILL)
        command.wait(timeout=10)
        wait_for(lambda: gone(server), ENDS_WITHIN_S, f"left running: {[p.pid for p in server if p.is_running()]}")
        assert not answers(f"http://127.0.0.1:{port}/health")
    finally:
        command.kill()
        for p in server:
            with contextlib.suppress(psutil.Error):
                p.kill()


PARENT = """
import sys, time
from pathlib import Path
from flows.cli import serve
port = int(sys.argv[1])
started = serve.launch([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                       f"http://127.0.0.1:{port}/", "a test server", Path(sys.argv[2]))
started.ready()
print(started.proc.pid, flush=True)
time.sleep(600)
"""


def test_a_server_rlhf_serve_launches_ends_with_it(tmp_path):
    """`rlhf serve` starts its servers with `serve.launch` in sessions of their own (a Ctrl-C in the terminal
    is the serve's to handle); a SIGKILL of the serve takes them down too."""
    port = free_port()
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(port), str(tmp_path / "server.log")],
                              env={**cli_env(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        server = psutil.Process(int(parent.stdout.readline()))
        assert answers(f"http://127.0.0.1:{port}/") and server.ppid() == parent.pid
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_for(lambda: gone([server]), ENDS_WITHIN_S, f"the server {server.pid} outlived the command that started it")
        assert not answers(f"http://127.0.0.1:{port}/")
    finally:
        parent.kill()
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] and "http.server" in p.info["cmdline"] and str(port) in p.info["cmdline"]:
                p.kill()
