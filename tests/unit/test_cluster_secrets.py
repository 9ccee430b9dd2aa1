"""The cluster folder's credentials: made once, kept for the owner only, reused by the next `up` (its data
was made with them), given to clients as a file to source, never as text to print."""

import os
import stat
import subprocess

import pytest

from configs.errors import PipelineError
from flows.services import cluster_secrets

pytestmark = pytest.mark.timeout(30)


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_made_once_for_the_owner_only_and_reused(tmp_path):
    first = cluster_secrets.ensure(tmp_path)
    assert mode(tmp_path / cluster_secrets.SECRETS_FILE) == 0o600
    assert cluster_secrets.ensure(tmp_path) == first
    values = [first.postgres_password, first.mlflow_password, first.mlflow_form_key, first.prefect_token, first.ray_token]
    assert len(set(values)) == 5 and all(len(v) >= 32 for v in values)  # MLflow wants 12+ characters for a password
    assert first.prefect_auth_string == f"rlhf:{first.prefect_token}"


def test_a_credentials_file_others_can_read_is_refused(tmp_path):
    cluster_secrets.ensure(tmp_path)
    (tmp_path / cluster_secrets.SECRETS_FILE).chmod(0o644)
    with pytest.raises(PipelineError, match=r"secrets.json: readable by other users \(mode 644\); chmod 600 it"):
        cluster_secrets.ensure(tmp_path)


def test_the_client_file_sets_each_value_as_given_in_a_shell(tmp_path):
    made = cluster_secrets.ensure(tmp_path)
    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "ODD": "a b'c$d", **cluster_secrets.credentials_env(tmp_path, made)}
    path = cluster_secrets.write_client_env(tmp_path, env)
    assert mode(path) == 0o600 and mode(tmp_path / cluster_secrets.RAY_TOKEN_FILE) == 0o600
    assert (tmp_path / cluster_secrets.RAY_TOKEN_FILE).read_text() == made.ray_token
    shown = subprocess.run(["bash", "-c", f"set -a; . {path}; set +a; env"], capture_output=True, text=True, timeout=10,
                           env={"PATH": os.environ["PATH"]}).stdout.splitlines()
    for key, value in env.items():
        assert f"{key}={value}" in shown
    assert env["RAY_AUTH_MODE"] == "token" and env["MLFLOW_TRACKING_USERNAME"] == "rlhf"
