"""Which stage failures are rerun: Ray losing a worker and an unreachable tracking server are;
the user's errors and bugs are not."""

import socket

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from prefect.states import Failed
from ray import exceptions as ray_errors

from configs import load_config
from configs.errors import DataError, PipelineError, RewardError
from flows import retries
from flows.pipeline import stage_failure
from flows.stage_task import StageOutcome, unwrap


def unreachable_mlflow_error(monkeypatch) -> MlflowException:
    """What MLflow raises when its tracking server does not answer (after its own HTTP retries)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(MlflowException) as caught:
        MlflowClient(f"http://127.0.0.1:{port}").get_experiment_by_name("e")
    return caught.value


def test_ray_and_network_faults_are_transient(monkeypatch):
    assert retries.transient(ray_errors.ActorDiedError())
    assert retries.transient(ray_errors.WorkerCrashedError())
    assert retries.transient(unreachable_mlflow_error(monkeypatch))


@pytest.mark.parametrize("error", [ValueError("bug"), DataError("data.sft: no rows"), MlflowException("bad param"), None])
def test_other_errors_are_not(error):
    assert not retries.transient(error)


def died_in_constructor(error: BaseException) -> ray_errors.ActorDiedError:
    """What Ray raises for the calls of an actor whose constructor raised `error` (the creation task's
    RayTaskError is the ActorDiedError's argument)."""
    return ray_errors.ActorDiedError(ray_errors.RayTaskError("RewardWorker.__init__", "Traceback ...", error))


def test_an_actor_whose_constructor_raised_is_judged_by_that_error():
    user = RewardError("reward.func_path=r.py: defines no reward_func(queries, prompts, labels)")
    died = died_in_constructor(user)
    assert died.actor_init_failed and retries.creation_error(died) is user
    assert not retries.transient(died)
    assert unwrap(died) is user and unwrap(ray_errors.RayTaskError("run", "Traceback ...", died)) is user
    assert not retries.transient(died_in_constructor(KeyError("x")))  # a bug in a constructor: no rerun either
    assert retries.transient(died_in_constructor(ConnectionError("hub unreachable")))
    assert retries.creation_error(ray_errors.ActorDiedError()) is None  # lost by Ray: transient, as above


def test_a_user_error_is_never_transient_whatever_led_to_it():
    def timed_out_reward() -> None:
        try:
            raise TimeoutError("ray.get timed out")
        except TimeoutError:
            raise RewardError("reward.func_path=r.py: reward_func did not return within reward.timeout_s=1 s") from None

    with pytest.raises(RewardError) as raised:
        timed_out_reward()
    assert isinstance(raised.value.__context__, TimeoutError)
    assert not retries.transient(raised.value)


def test_the_retry_condition_reads_the_failed_outcome():
    lost = StageOutcome("sft", "failed", 1.0, error=ray_errors.ActorDiedError())
    bug = StageOutcome("sft", "failed", 1.0, error=KeyError("x"))
    assert retries.retry_if_transient(None, None, Failed(data=lost))
    assert not retries.retry_if_transient(None, None, Failed(data=bug))


def test_retries_and_backoff_per_stage():
    cfg = load_config("tiny", ["infra.retries=2", "infra.retry_delay_s=5", "infra.stage_retries={rl: 3, eval: 0}"])
    assert retries.task_options(cfg, "sft")["retries"] == 2
    assert retries.task_options(cfg, "sft")["retry_delay_seconds"] == [5, 10]
    assert retries.task_options(cfg, "rl")["retry_delay_seconds"] == [5, 10, 20]
    assert retries.task_options(cfg, "eval")["retries"] == 0


def test_the_flow_ends_with_one_line_naming_the_stage():
    user = DataError("data.sft: row 3: empty response")
    assert stage_failure(StageOutcome("sft", "failed", 1.0, error=user)) is user
    bug = stage_failure(StageOutcome("rl", "failed", 1.0, run_id="abc", error=KeyError("critic")))
    assert isinstance(bug, PipelineError)
    assert str(bug) == "stage rl failed (an unexpected error): KeyError: 'critic'; traceback in MLflow run abc (tag rlhf.error)"
    lost = stage_failure(StageOutcome("sft", "failed", 1.0, error=ray_errors.ActorDiedError()))
    assert str(lost).startswith("stage sft failed (a transient fault, retries exhausted): ActorDiedError: ")
