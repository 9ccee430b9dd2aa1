"""flows/pre_run.py: the checks `rlhf run`, `rlhf check` and the flow make before any stage."""

from __future__ import annotations

import pytest

from configs import load_config
from configs.errors import ConfigError, PipelineError, RewardError
from flows import pre_run
from flows.cli.main import main
from stages.dag import preflight
from tests.markers import cpu_only

pytestmark = pytest.mark.timeout(60)

BAD = ["reward.func_path=missing.py", "infra.num_workers=4", "infra.num_cpus=2"]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths (the state folder, the reward file) resolve here
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_the_tiny_preset_has_no_problem_and_nothing_is_written(tmp_path):
    assert list(pre_run.problems(load_config(None, []))) == []
    pre_run.check(load_config(None, []), ["sft"], ["sft", "eval"])
    assert list(tmp_path.iterdir()) == []


def test_problems_are_every_failed_check_in_order_and_check_raises_the_first():
    cfg = load_config(None, BAD)
    found = list(pre_run.problems(cfg, [], ["evall", "rl"]))
    assert [type(p) for p in found] == [ConfigError, RewardError, PipelineError]
    assert str(found[0]).startswith("--only evall: unknown stage")
    assert str(found[1]).startswith("reward.func_path=missing.py: no such file")
    assert str(found[2]).startswith("infra.num_workers=4 x infra.cpus_per_worker=2 needs 8 CPUs")
    with pytest.raises(ConfigError, match=r"^--only evall: unknown stage"):
        pre_run.check(cfg, [], ["evall"])


def test_check_makes_no_check_after_the_first_that_fails(monkeypatch):
    made = []

    def failing(cfg, only):
        made.append("failing")
        raise PipelineError("the first problem")

    monkeypatch.setattr(preflight, "CHECKS", (failing, lambda cfg, only: made.append("later")))
    with pytest.raises(PipelineError, match=r"^the first problem$"):
        pre_run.check(load_config(None, []))
    assert made == ["failing"]


def test_the_request_rlhf_run_checked_passes_at_once_while_its_flow_runs_and_no_other():
    cfg = load_config(None, BAD)
    with pre_run.checked(cfg, ["sft"], []):
        pre_run.check(load_config(None, BAD), ["sft"], [])  # the flow loads the same config again
        with pytest.raises(RewardError):
            pre_run.check(cfg, ["rm"], [])
        with pytest.raises(RewardError):
            pre_run.check(load_config(None, [*BAD, "seed=7"]), ["sft"], [])
    with pytest.raises(RewardError):
        pre_run.check(cfg, ["sft"], [])


@cpu_only
def test_rlhf_check_reports_liger_kernels_asked_for_on_a_machine_without_a_gpu(capsys):
    assert [str(p) for p in pre_run.problems(load_config(None, ["model.use_liger_kernel=true"]))] == [LIGER_NO_GPU]
    assert main(["check", "model.use_liger_kernel=true"]) == 2
    assert capsys.readouterr().err == f"error: {LIGER_NO_GPU}\n"


LIGER_NO_GPU = ("model.use_liger_kernel needs a CUDA GPU (Liger's kernels are Triton) and this machine has none; "
                "set model.use_liger_kernel=false")
