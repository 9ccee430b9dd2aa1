"""The GPU scripts on a CPU with a small model, so that they cannot rot between GPU checks.
benchmarks/gpu_stages.py: every stage's own `run` in one process, where Ray, MLflow and Prefect cannot be
imported (as on the bare GPU machine it is made for). ZeRO-2 only: the ZeRO-3 chain runs the same script
code (the in-process RL backend: tests/unit/test_rl_in_process.py). benchmarks/gpu_grpo.py: our side."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.markers import cpu_only

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)

NO_SERVICES = "import sys; sys.modules.update(ray=None, mlflow=None, prefect=None); "


@cpu_only
def test_every_stage_runs_in_one_process_without_ray_and_its_checkpoints_load_and_generate(tmp_path):
    out = tmp_path / "gpu_stages.json"
    code = (NO_SERVICES + "from benchmarks import gpu_stages; sys.exit(gpu_stages.main(['--device', 'cpu', '--tiny', "
            f"'--steps', '2', '--zero', '2', '--out', {str(out)!r}, '--workdir', {str(tmp_path / 'work')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {(r["stage"], r["zero"]): r for r in result["rows"]}
    assert list(rows) == [("data_prep", "-"), *[(s, 2) for s in ("sft", "rm", "rl", "dpo", "eval")]]
    assert result["errors"] == [] and all(r["status"] == "ok" for r in rows.values())
    for stage, model in (("sft", "sft_model"), ("rm", "reward_model"), ("rl", "rl_model"), ("dpo", "dpo_model")):
        assert rows[stage, 2]["checkpoint"] == f"{model} ok"
        assert rows[stage, 2]["train_tokens_per_s"] > 0
    assert rows["rl", 2]["gen_tokens_per_s"] > 0
    assert rows["rl", 2]["mfu"] is None and rows["rl", 2]["peak_mem_gib"] is None  # no GPU here
    # eval scored the four models with the reward function
    assert {f"{m}/reward" for m in ("base", "sft", "rl", "dpo")} <= set(rows["eval", 2]["metrics"])
    assert "| rl | 2 |" in done.stdout


def test_the_gpu_grpo_comparison_runs_our_loop_in_a_trial_process_and_tables_it(tmp_path):
    """benchmarks/gpu_grpo.py with our system only (TRL's trials need the bench extra): the data, a trial in a
    fresh process through the RL stage's in-process workers, its timers, the table."""
    out = tmp_path / "gpu_grpo.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_grpo", "--device", "cpu", "--tiny", "--steps", "2",
                           "--repeats", "1", "--systems", "ours", "--out", str(out), "--workdir", str(tmp_path / "work")],
                          cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["failed"] == {} and list(result["trials"]) == ["ours"]
    (trial,) = result["trials"]["ours"]
    assert trial["samples"] == 2 * 4 * 4  # 2 rollout steps of 4 prompts x 4 samples
    assert trial["response_tokens"] > 0 and all(trial[p] > 0 for p in ("generation_s", "experience_s", "training_s"))
    assert "| ours: `stages.rl`" in done.stdout and "ours / TRL" not in done.stdout
