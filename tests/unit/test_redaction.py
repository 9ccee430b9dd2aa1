"""Credentials in URLs stay out of what the pipeline shows: printed lines, MLflow params and tags, errors and
the command lines of the servers it starts. Expected texts written out by hand."""

from __future__ import annotations

import pytest

from configs.errors import RewardError
from configs.redaction import logged, redacted
from flows.cli.serve import BACKEND_URI_ENV, mlflow_ui_command
from stages.common.dist_env import free_port
from stages.rewards.remote import RemoteScorer

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("text", "shown"), [
    ("postgresql+psycopg2://rlhf:s3cret@db:5432/mlflow", "postgresql+psycopg2://rlhf:***@db:5432/mlflow"),
    ("tracking.uri=http://alice:pa%40ss@mlflow.lan:5000", "tracking.uri=http://alice:***@mlflow.lan:5000"),
    ("https://ghp_abc123@reward.lan/get_reward", "https://***@reward.lan/get_reward"),  # a token as the user
    ("http://u:@h/x and mysql://a:b@c/d", "http://u:***@h/x and mysql://a:***@c/d"),  # every URL of the text
    ("sqlite:////home/a/.rlhf/mlflow.db", "sqlite:////home/a/.rlhf/mlflow.db"),  # nothing to hide
    ("http://127.0.0.1:5001/get_reward", "http://127.0.0.1:5001/get_reward"),
    ("mail me at a@b.c, or http://h/p?x=@", "mail me at a@b.c, or http://h/p?x=@"),  # no scheme; @ past the host
])
def test_redacted_hides_the_credentials_of_every_url(text, shown):
    assert redacted(text) == shown


def test_logged_values_are_text_redacted_and_cut():
    assert logged(["http://u:pw@h/x", 3]) == "['http://u:***@h/x', 3]"
    assert logged("x" * 7000) == "x" * 6000 and logged("ab", 1) == "a"


def test_the_mlflow_ui_reads_its_store_from_the_environment_not_its_command_line():
    command = mlflow_ui_command(5000)
    assert "--backend-store-uri" not in command and BACKEND_URI_ENV == "MLFLOW_BACKEND_STORE_URI"


def test_a_reward_server_error_names_the_url_without_its_password():
    url = f"http://rlhf:s3cret@127.0.0.1:{free_port()}/get_reward"  # nothing listens
    with pytest.raises(RewardError) as err:
        RemoteScorer(url, timeout_s=1, retries=0).score(["p"], ["r"], [None])
    assert str(err.value).startswith(f"reward server {url.replace('s3cret', '***')}: failed after 1 try")
    assert "s3cret" not in str(err.value)
