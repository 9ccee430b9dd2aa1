"""The RL stage's GPU layout walked on a CPU: a local Ray cluster that declares GPUs (logical ones, no CUDA),
`infra.gpus_per_worker: 1`, engine actors and broadcast weight sync, as the GPU presets set. Every Python
branch a GPU run takes before its first CUDA kernel runs here: the placement's GPU bundles, the actors'
GPU shares, the weight group's backend chosen by what torch sees (gloo: no CUDA here)."""

import pytest
import ray
from ray.util import placement_group_table

from configs import load_config
from runtime import resources, rl_driver
from tests.stage.conftest import LENGTH_REWARD, make_ctx
from tests.stage.rl_runs import RL_FAST

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GPU_LAYOUT = ["infra.gpus_per_worker=1", "rl.rollout.engine=hf", "rl.rollout.weight_sync=broadcast",
              "rl.placement.colocate_all=true", "rl.algorithm.advantage_estimator=group_norm"]


@pytest.fixture(scope="module")
def logical_gpu_cluster():
    """Two CPUs and one GPU that Ray schedules and torch cannot see."""
    with resources.local_cluster(num_cpus=2, log_to_driver=False, num_gpus=1):
        assert ray.cluster_resources().get("GPU") == 1
        yield


def test_rl_on_a_gpu_layout_places_on_gpu_bundles_and_syncs_by_broadcast_over_gloo(
        logical_gpu_cluster, prepared, tmp_path, capfd):
    reward = tmp_path / "length.py"
    reward.write_text(LENGTH_REWARD)
    cfg = load_config(None, [*RL_FAST, *GPU_LAYOUT, f"reward.func_path={reward}"])
    logged = []
    ctx = make_ctx("rl", cfg, tmp_path, lambda metrics, step: logged.append((step, metrics)))
    inputs = {"sft_model": prepared["base_model"], "prompts": prepared["prompts"], "eval_data": prepared["eval_data"]}
    result = rl_driver.run(ctx, inputs)

    out = capfd.readouterr().out
    assert "[rl] weight sync: broadcast over a gloo group" in out, out[-2000:]
    # the stage's placement group asked Ray for the GPU: one bundle of 2 CPUs and 1 GPU, every role in it
    bundles = [b for pg in placement_group_table().values() for b in pg["bundles"].values()]
    assert {"CPU": 2.0, "GPU": 1.0} in bundles, bundles
    steps = {s: m for s, m in logged if "train/reward" in m}
    assert sorted(steps) == [1, 2]
    # step 2 samples from the engine after the step-1 update, received by broadcast: the trainer's log-probs
    assert steps[2]["rollout/logprob_gap"] < 1e-4
    assert (result.outputs["rl_model"] / "model.safetensors").is_file()
