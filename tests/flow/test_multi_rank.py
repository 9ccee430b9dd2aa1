"""Two DeepSpeed ranks per training stage on the local Ray cluster, ZeRO-3: the whole DAG runs (SFT as a
LoRA adapter, which the later stages receive merged, RL with two policy and two critic ranks, DPO as
iterative KTO ranked by the RM),
ranks agree through gloo, the gathered checkpoints are complete HF models, and lora_merge merges the
SFT adapter."""

import pytest
from transformers import AutoModelForCausalLM

from artifacts import run_tags, store
from tests.flow.conftest import mlflow_client

pytestmark = pytest.mark.slow

FAST = [
    "data.synthetic.num_train=200", "data.synthetic.num_eval=21", "data.synthetic.num_prompts=20",
    "eval.max_samples=20", "sft.max_steps=6", "sft.eval_every=3", "sft.save_every=3",
    "rm.max_steps=4", "prm.max_steps=4", "sft.micro_batch_size=8", "rm.micro_batch_size=8", "prm.micro_batch_size=8",
    # RL: two policy ranks and two critic ranks (PPO), sharing the two 1-CPU bundles with the other actors
    "rl.algorithm.advantage_estimator=gae", "rl.actor.num_workers=2", "rl.critic.num_workers=2", "rl.max_steps=1",
    "rl.rollout.batch_size=4", "rl.rollout.n_samples_per_prompt=4", "rl.train_batch_size=8", "rl.micro_train_batch_size=4",
    "rl.eval_every=2", "eval.samples_per_prompt=1", "rl.rollout.engine=hf",  # ZeRO-3 partitions the weights a hybrid rank samples with
    # DPO as iterative KTO: each round's samples drawn by both ranks in lockstep (ZeRO-3) and ranked by
    # the pipeline's RM (also the PPO reward); the KL reference point is averaged over the two ranks
    "dpo.loss=kto", "dpo.max_steps=2", "dpo.micro_batch_size=4", "dpo.iterative.rounds=2",
    "dpo.iterative.prompts_per_round=4", "dpo.iterative.samples_per_prompt=2", "dpo.iterative.max_new_tokens=8",
    "reward.source=rm",
    # SFT trains a LoRA adapter (gathered from the ZeRO-3 partitions); lora_merge makes it a full model
    "sft.lora.rank=4", "sft.lora.alpha=8",
    # held-out answers of at most 8 tokens (the preset's 40): what the evals check here is that the ranks generate
    # in lockstep and the stages finish, not what the models answer
    "eval.max_new_tokens=8",
]


def test_two_ranks_with_zero3(workdir, monkeypatch, prefect_server, cli):
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)  # `cli`: the run in this process, without a CLI process's start
    result = cli("run", *FAST, "infra.num_workers=2", "infra.cpus_per_worker=1", "infra.zero_stage=3")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    client = mlflow_client(workdir)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)  # for the artifact download below
    exp = client.get_experiment_by_name("rlhf-pipeline")
    runs = client.search_runs([exp.experiment_id], f"tags.`{run_tags.TAG_STATUS}` = '{run_tags.COMPLETE}'")
    assert {r.data.tags[run_tags.TAG_STAGE] for r in runs} == {"data_prep", "sft", "rm", "prm", "rl", "dpo", "lora_merge", "eval"}
    (sft,) = [r for r in runs if r.data.tags[run_tags.TAG_STAGE] == "sft"]
    assert sft.data.params["infra.num_workers"] == "2" and sft.data.params["infra.zero_stage"] == "3"
    (rl,) = [r for r in runs if r.data.tags[run_tags.TAG_STAGE] == "rl"]
    assert "critic/value_loss" in rl.data.metrics
    history = client.get_metric_history(rl.info.run_id, "rollout/reward_std")
    assert history and all(m.value > 0 for m in history)  # the pipeline's RM scores differ between samples
    (dpo,) = [r for r in runs if r.data.tags[run_tags.TAG_STAGE] == "dpo"]
    assert {"train/kl", "eval/reward_accuracy", "round/pairs"} <= set(dpo.data.metrics)
    assert dpo.data.tags[run_tags.TAG_INPUT_PREFIX + "reward_model"].startswith("runs:/")
    (merge,) = [r for r in runs if r.data.tags[run_tags.TAG_STAGE] == "lora_merge"]
    assert merge.data.metrics["merge/models"] == 1 and merge.data.metrics["merge/max_logit_diff"] < 1e-4
    adapter = store.download(store.ArtifactRef("sft_model", sft.info.run_id), workdir / "dl")
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "model.safetensors").exists()
    merged = store.download(store.ArtifactRef("merged_models", merge.info.run_id), workdir / "dl") / "sft_model"
    for path in (merged, *(store.download(store.ArtifactRef(name, run.info.run_id), workdir / "dl")
                           for name, run in (("rl_model", rl), ("dpo_model", dpo)))):
        model = AutoModelForCausalLM.from_pretrained(path)
        assert sum(p.numel() for p in model.parameters()) > 800_000
