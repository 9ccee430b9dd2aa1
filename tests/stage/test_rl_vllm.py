"""The vLLM rollout engine (the CPU build, in its own environment made by `rlhf vllm-env`): token-in
token-out samples whose log-probs are the policy's, seeded per prompt, weight sync, and the RL stage
running on it. The environment is built once per machine under ~/.cache (RLHF_VLLM_PYTHON: use another)."""


import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from configs import load_config
from flows.cli import vllm_env
from runtime import rollout_engines
from runtime.vllm_engine import VLLMRolloutEngine, runtime_env
from stages.dag.contract import NodeInputs
from tests.stage.rl_runs import run_rl

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.slow,
              pytest.mark.timeout(1800)]  # the first test may build the vLLM environment


@pytest.fixture(scope="module")
def vllm_python() -> str:
    return vllm_env.machine_cache_python()


@pytest.fixture(scope="module")
def engine(prepared, vllm_python):
    cfg = load_config(None, ["rl.rollout.engine=vllm", f"rl.rollout.vllm_python={vllm_python}", "rl.rollout.vllm_kv_cache_mib=64"])
    rollout_engines.check(cfg, cluster_gpus=0)
    actor = VLLMRolloutEngine.options(num_cpus=0, runtime_env=runtime_env(vllm_python, 2)).remote(
        NodeInputs({"sft_model": str(prepared["base_model"])}), rollout_engines.vllm_options(cfg, 0), 2)
    ray.get(actor.ready.remote())
    yield actor
    ray.kill(actor)


@pytest.fixture
def base_weights_after(engine, prepared):
    """For a test that loads other weights into the module's engine: the base model's go back after it, so
    the tests that compare the engine with the base model pass in any order."""
    yield
    base = AutoModelForCausalLM.from_pretrained(prepared["base_model"])
    ray.get(engine.load_weights.remote(base.state_dict()))


def hf_log_probs(model, sample) -> list[float]:
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(sample.prompt_ids) - 1 : -1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(sample.response_ids)[:, None])[:, 0].tolist()


def prompt_ids(prepared, n: int) -> list[list[int]]:
    from stages.common import checkpoint
    from stages.data.prepared import read_split

    tok = checkpoint.load_tokenizer(prepared["base_model"])
    return [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in read_split(prepared["eval_data"], "eval")[:n]]


def max_gap(model, samples) -> float:
    return max(abs(a - b) for s in samples for a, b in zip(s.log_probs, hf_log_probs(model, s), strict=True))


def test_samples_carry_the_policy_log_probs_and_do_not_depend_on_the_batch(engine, prepared):
    model = AutoModelForCausalLM.from_pretrained(prepared["base_model"]).eval()
    prompts = prompt_ids(prepared, 6)
    samples = ray.get(engine.generate.remote(prompts, 7, 1.0, 12))
    assert [s.prompt_ids for s in samples] == prompts and all(s.response_ids for s in samples)
    assert max_gap(model, samples) < 1e-4
    # prompt i is sampled with seed 7 + i, whatever else is in the batch
    alone = ray.get(engine.generate.remote([prompts[3]], 10, 1.0, 12))[0]
    assert alone.response_ids == samples[3].response_ids
    greedy = ray.get(engine.generate.remote(prompts[:2], 0, None, 12))
    for s in greedy:
        out = model.generate(torch.tensor([s.prompt_ids]), max_new_tokens=12, do_sample=False)
        assert out[0, len(s.prompt_ids) :].tolist()[: len(s.response_ids)] == s.response_ids


def test_weight_sync_replaces_the_engine_policy(engine, prepared, base_weights_after):
    model = AutoModelForCausalLM.from_pretrained(prepared["base_model"]).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    before = ray.get(engine.generate.remote(prompt_ids(prepared, 4), 3, 1.0, 12))
    assert max_gap(model, before) > 1e-2  # the engine still holds the old weights
    ray.get(engine.load_weights.remote(model.state_dict()))
    after = ray.get(engine.generate.remote(prompt_ids(prepared, 4), 3, 1.0, 12))
    assert max_gap(model, after) < 1e-4


def test_weights_broadcast_parameter_by_parameter_replace_the_engine_policy(engine, prepared, base_weights_after):
    """The engine's worker joins a gloo group with a sender (here this process, as the policy's rank 0 does)
    and takes each checkpoint tensor as it arrives."""
    from stages.common.dist_env import free_port
    from stages.rl import weight_sync

    model = AutoModelForCausalLM.from_pretrained(prepared["base_model"]).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    wanted = ray.get(engine.weight_specs.remote())
    assert {name for name, _, _ in wanted} <= dict(model.named_parameters(remove_duplicate=False)).keys()
    master = ("127.0.0.1", free_port())
    joined = engine.join_weight_group.remote(master, 1, 2, "gloo")
    group = weight_sync.WeightGroup(master, 0, 2, "gloo")
    ray.get(joined)
    received = engine.receive_weights.remote(wanted)
    weight_sync.send(group, model, wanted, zero3=False)
    ray.get(received)
    assert max_gap(model, ray.get(engine.generate.remote(prompt_ids(prepared, 4), 3, 1.0, 12))) < 1e-4


def test_grpo_runs_on_the_vllm_engine_with_weights_broadcast_into_its_workers(prepared, vllm_python, tmp_path, capsys):
    reward = tmp_path / "length.py"
    reward.write_text("def reward_func(queries, prompts, labels):\n    return [float(len(q) - len(p)) for q, p in zip(queries, prompts)]\n")
    result, logged = run_rl(prepared, tmp_path, ["rl.rollout.engine=vllm", f"rl.rollout.vllm_python={vllm_python}",
                                                 "rl.rollout.vllm_kv_cache_mib=64", f"reward.func_path={reward}"])
    steps = {s: m for s, m in logged if "train/reward" in m}
    assert sorted(steps) == [1, 2]
    # step 2 samples after the step-1 update reached the engine, broadcast into vLLM's worker
    assert "[rl] weight sync: broadcast over a gloo group (the policy's rank 0 and 1 engine(s))" in capsys.readouterr().out
    assert steps[2]["train/kl"] > 0 and steps[2]["rollout/logprob_gap"] < 1e-4
    assert {"eval/accuracy", "eval/sampled_accuracy"} <= set(result.metrics)
    assert (result.outputs["rl_model"] / "model.safetensors").exists()
