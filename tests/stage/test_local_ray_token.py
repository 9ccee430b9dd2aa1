"""The local Ray cluster a run starts asks every caller for its token: Ray's servers listen on every interface
whatever the node's address (with `_node_ip_address="127.0.0.1"` the same sockets listened on `::`, measured
2026-12-07 with Ray 2.60), so the token is what keeps another machine's, or another user's, process out."""

import os
import subprocess
import sys

import pytest
import ray

pytestmark = pytest.mark.timeout(180)

CONNECT = """
import sys, ray
try:
    ray.init(address=sys.argv[1], log_to_driver=False)
    ray.get(ray.remote(lambda: 1).remote(), timeout=60)
    print("connected")
except Exception as exc:
    print("refused:", type(exc).__name__, str(exc)[:300].replace(chr(10), " "))
"""


def connect(address: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", CONNECT, address], env=env, capture_output=True, text=True, timeout=120)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]


def test_a_caller_without_the_token_is_refused(ray_cluster):
    address = ray.get_runtime_context().gcs_address
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    # this user's token (~/.ray/auth_token, made by Ray with the first local cluster), presented as the pipeline's
    # processes present it (flows.services.ray_cluster.token_env)
    assert connect(address, base | {"RAY_AUTH_MODE": "token"}) == "connected"
    assert connect(address, base | {"RAY_AUTH_MODE": "disabled"}).startswith("refused")
    assert connect(address, base | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}).startswith("refused")
