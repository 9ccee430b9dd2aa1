"""The credentials of `rlhf cluster up`'s services, made once per cluster folder and kept there, readable
by its owner only: PostgreSQL's password (scram), the MLflow server's basic-auth user and password (and the
key its login forms are signed with), Prefect's API auth string, and the Ray cluster's token.

They reach the servers and clients through the environment and files, never a command line; `client.env`
in the cluster folder holds what a client sets (`set -a; . client.env; set +a`), so no password is printed.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from configs.errors import PipelineError

SECRETS_FILE = "secrets.json"
CLIENT_ENV_FILE = "client.env"
RAY_TOKEN_FILE = "ray-auth-token"
USER = "rlhf"  # MLflow's admin and Prefect's auth-string user
# what a client sets (`credentials_env`): kept from the services `up` starts, each given only its own
CREDENTIAL_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PREFECT_API_AUTH_STRING", "RAY_AUTH_MODE",
                   "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")


@dataclass(frozen=True)
class ClusterSecrets:
    postgres_password: str
    mlflow_password: str
    mlflow_form_key: str  # MLflow's auth app signs its forms' CSRF tokens with it
    prefect_token: str
    ray_token: str

    @property
    def prefect_auth_string(self) -> str:
        return f"{USER}:{self.prefect_token}"


def write_private(path: Path, text: str) -> None:
    """A file only its owner may read, made so from the start (no moment open to others)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def read_private(path: Path) -> str:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise PipelineError(f"{path}: readable by other users (mode {mode:o}); chmod 600 it, or remove the cluster "
                            "folder's secrets and start again")
    return path.read_text()


def ensure(root: Path) -> ClusterSecrets:
    """The cluster folder's credentials: those of an earlier `up` (its data was made with them), else new."""
    path = root / SECRETS_FILE
    if path.is_file():
        try:
            return ClusterSecrets(**json.loads(read_private(path)))
        except (ValueError, TypeError) as exc:
            raise PipelineError(f"{path}: not this cluster's credentials ({exc}); remove it only with the cluster's "
                                "data (postgres/, mlflow/), which were made with it") from None
    made = ClusterSecrets(*(secrets.token_urlsafe(24) for _ in range(5)))
    write_private(path, json.dumps(asdict(made), indent=1))
    return made


def ray_token_path(root: Path, made: ClusterSecrets) -> Path:
    path = root / RAY_TOKEN_FILE
    if not path.is_file() or read_private(path).strip() != made.ray_token:
        write_private(path, made.ray_token)
    return path


def ray_env(root: Path, made: ClusterSecrets) -> dict[str, str]:
    """What every Ray node and client of the cluster sets: token authentication, with the cluster's token."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(ray_token_path(root, made))}


def mlflow_login(made: ClusterSecrets) -> dict[str, str]:
    """MLflow's client login: the pipeline's driver and every Ray node's stage workers, which up- and download."""
    return {"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": made.mlflow_password}


def credentials_env(root: Path, made: ClusterSecrets) -> dict[str, str]:
    """The credentials a client of the services sets beside their addresses."""
    return {**mlflow_login(made), "PREFECT_API_AUTH_STRING": made.prefect_auth_string, **ray_env(root, made)}


def write_client_env(root: Path, env: dict[str, str]) -> Path:
    """`client.env`: addresses and credentials as shell assignments, for `set -a; . client.env; set +a`."""
    path = root / CLIENT_ENV_FILE
    write_private(path, "".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items()))
    return path
