"""OpenRLHF's own launch scripts (tests/data/openrlhf_scripts, from its examples/scripts) converted by `rlhf
from-openrlhf` and run with `rlhf run`, as a user of OpenRLHF would bring them: the hub names pointed at small
local stand-ins of the same family and format with `--set` (the suite's Llama-3 and Qwen2 checkpoints; files
shaped like OpenOrca, OpenRLHF's preference mixture, its prompt collection and dapo-math-17k), sizes scaled
down (a loop recipe's rounds and prompts per round too), and the device flags a GPU cluster needs turned into
this machine's. Each runs the stages the converted config says are the script's (`--only`, read from the
config's own header), with OpenRLHF's `reward_func.py` and `agent_func.py` (tests/data/openrlhf_examples) as
they ship."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flows.cli.from_openrlhf import converted
from tests.flow.conftest import mlflow_client
from tests.model_families import save_family_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DATA = Path(__file__).parent.parent / "data"
SCRIPTS, EXAMPLES = DATA / "openrlhf_scripts", DATA / "openrlhf_examples"

# what a 2-core machine without a GPU needs of a GPU script, whatever it trains
CPU = ["model.attn_implementation=sdpa", "infra.gpus_per_worker=0", "infra.precision=fp32", "infra.zero_stage=2",
       "data.max_len=256"]
RL = ["rl.rollout.batch_size=2", "rl.rollout.n_samples_per_prompt=2", "rl.train_batch_size=4",
      "rl.micro_train_batch_size=2", "rl.rollout.micro_batch_size=4", "rl.rollout.prompt_max_len=96",
      "rl.rollout.generate_max_len=8", "rl.actor.num_workers=1", "rl.placement.ref_num_workers=1",
      "rl.rollout.engine=hybrid", "rl.rollout.num_engines=1", "rl.placement.colocate_all=true"]


def steps(section: str) -> list[str]:
    return [f"{section}.{key}" for key in ("max_steps=2", "grad_accum_steps=1", "eval_every=2", "save_every=2")]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Local stand-ins for the scripts' hub models and datasets, in their formats."""
    root = tmp_path_factory.mktemp("openrlhf_local")
    pairs = [(a, a % 7 + 1) for a in range(1, 41)]
    ask = lambda a, b: f"What is {a} plus {b}?"  # noqa: E731
    user = lambda a, b: [{"role": "user", "content": ask(a, b)}]  # noqa: E731
    files = {
        # Open-Orca/OpenOrca: id, system_prompt, question, response
        "openorca": write_jsonl(root / "openorca.jsonl", [{"id": str(i), "system_prompt": "", "question": ask(a, b),
                                                          "response": f"{a + b}"} for i, (a, b) in enumerate(pairs)]),
        # OpenRLHF/preference_dataset_mixture2_and_safe_pku: chosen / rejected conversations
        "preference": write_jsonl(root / "preference.jsonl", [
            {"chosen": [*user(a, b), {"role": "assistant", "content": f"{a + b}"}],
             "rejected": [*user(a, b), {"role": "assistant", "content": f"{a + b + 1}"}]} for a, b in pairs]),
        # OpenRLHF/prompt-collection-v0.1: context_messages, no label
        "prompt_collection": write_jsonl(root / "prompts.jsonl", [{"context_messages": user(a, b)} for a, b in pairs]),
        # zhuzilin/dapo-math-17k: prompt (a conversation) and label
        "dapo": write_jsonl(root / "dapo.jsonl", [{"prompt": user(a, b), "label": str(a + b)} for a, b in pairs]),
    }
    corpus = [f"{ask(a, b)} {a + b}" for a, b in pairs] * 3
    models = {family: save_family_checkpoint(family, root / family, corpus) for family in ("llama3", "qwen2")}
    return {"root": root, "files": files, "models": models}


def run_script(cli, workdir: Path, prefect_server: str, monkeypatch, script: str, sets: list[str]):
    """The script converted with `sets`, then `rlhf run` of the stages the config's header names; the parent run."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    text, _ = converted((SCRIPTS / script).read_text(), script, sets, "converted.yaml")
    (workdir / "converted.yaml").write_text(text)
    only = re.search(r"^# The script's stage alone: rlhf run --config converted.yaml --only (\S+)$", text, re.M)
    assert only is not None, text[:2000]
    done = cli("run", "--config", "converted.yaml", "--only", only.group(1))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = mlflow_client(workdir)
    experiment = client.get_experiment_by_name("rlhf-pipeline")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`rlhf.kind` = 'pipeline'")
    statuses = {k.removeprefix("stage."): v.split()[0] for k, v in parent.data.tags.items() if k.startswith("stage.")}
    assert {s: statuses.get(s) for s in only.group(1).split(",")} == dict.fromkeys(only.group(1).split(","), "ran")
    return client, parent


def stage_run(client, parent, stage: str):
    return client.get_run(parent.data.tags[f"stage.{stage}"].split()[1])


def test_train_sft_sh(cli, workdir, prefect_server, monkeypatch, local):
    openorca = local["files"]["openorca"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "train_sft.sh", [
        *CPU, f"model.name_or_path={local['models']['llama3']}", f"data.sft.paths=[{openorca}]",
        f"data.prompts.paths=[{openorca}]", *steps("sft")])
    sft = stage_run(client, parent, "sft")
    assert sft.data.params["sft.packing"] == "True" and "eval/loss" in sft.data.metrics  # --ds.packing_samples


def test_train_rm_sh(cli, workdir, prefect_server, monkeypatch, local):
    preference, model = local["files"]["preference"], local["models"]["llama3"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "train_rm.sh", [
        *CPU, f"model.name_or_path={model}", f"inputs.sft_model={model}", f"data.sft.paths=[{preference}]",
        f"data.preference.paths=[{preference}]", f"data.prompts.paths=[{preference}]", *steps("rm")])
    assert "eval/accuracy" in stage_run(client, parent, "rm").data.metrics


def test_train_dpo_llama_sh(cli, workdir, prefect_server, monkeypatch, local):
    preference, model = local["files"]["preference"], local["models"]["llama3"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "train_dpo_llama.sh", [
        *CPU, f"model.name_or_path={model}", f"inputs.sft_model={model}", f"data.sft.paths=[{preference}]",
        f"data.preference.paths=[{preference}]", f"data.prompts.paths=[{preference}]", *steps("dpo")])
    dpo = stage_run(client, parent, "dpo")
    assert dpo.data.params["dpo.beta"] == "0.1" and "eval/reward_accuracy" in dpo.data.metrics  # --model.beta 0.1


def test_train_ppo_with_reward_fn_sh(cli, workdir, prefect_server, monkeypatch, local):
    """OpenRLHF's reward_func.py as it ships: its `extra_logs` become the RL run's metrics. The prompt collection
    has no responses, so the config names no SFT rows (inputs.sft_model stands in for sft)."""
    model = local["models"]["llama3"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "train_ppo_with_reward_fn.sh", [
        *CPU, *RL, "rl.max_steps=1", "rl.critic.num_workers=1", f"model.name_or_path={model}", f"inputs.sft_model={model}",
        f"data.prompts.paths=[{local['files']['prompt_collection']}]", f"reward.func_path={EXAMPLES / 'reward_func.py'}"])
    rl = stage_run(client, parent, "rl")
    assert {"train/reward", "reward/dummy_scores", "critic/value_loss"} <= set(rl.data.metrics), sorted(rl.data.metrics)


@pytest.fixture(scope="module")
def reward_model(local):
    """A stand-in for OpenRLHF/Llama-3-8b-rm-700k in its format: the Llama-3 backbone with a one-output linear
    head `score`, what AutoModelForSequenceClassification(num_labels=1) saves and OpenRLHF's reward models are,
    with the reward mean and std OpenRLHF's RM trainer stores in config.json (the script's
    --reward.normalize_enable reads them)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    source, path = local["models"]["llama3"], local["root"] / "llama3-rm"
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    model.config.mean, model.config.std = 0.25, 1.5
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_train_ppo_ray_hybrid_engine_sh(cli, workdir, prefect_server, monkeypatch, local, reward_model):
    """PPO scored by a pinned reward model (`--reward.model_name_or_path`): RL runs on it without an rm stage."""
    model = local["models"]["llama3"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "train_ppo_ray_hybrid_engine.sh", [
        *CPU, *RL, "rl.max_steps=1", "rl.critic.num_workers=1", "rl.placement.reward_num_workers=1",
        f"model.name_or_path={model}", f"inputs.sft_model={model}", f"inputs.reward_model={reward_model}",
        f"data.prompts.paths=[{local['files']['prompt_collection']}]"])
    assert "stage.rm" not in parent.data.tags or parent.data.tags["stage.rm"].startswith("skipped")
    rl = stage_run(client, parent, "rl")
    # the pinned folder is logged once as an input run of its own, which the RL run names
    assert rl.data.params["reward.source"] == "rm" and rl.data.tags["rlhf.input.reward_model"].startswith("runs:/")
    assert rl.data.params["reward.normalize"] == "True"  # --reward.normalize_enable, with the checkpoint's mean and std
    assert {"train/reward", "critic/value_loss"} <= set(rl.data.metrics), sorted(rl.data.metrics)


def test_train_reinforce_baseline_ray_agent_async_sh(cli, workdir, prefect_server, monkeypatch, local):
    """OpenRLHF's agent_func.py as it ships (an AgentInstanceBase of 1-3 steps): two RL steps of multi-turn
    episodes, async as the script asks (the second step's episodes played while the policy trains on the
    first's: an engine of its own, not the hybrid layout), no reward section needed (the agent gives the rewards)."""
    dapo = local["files"]["dapo"]
    model = local["models"]["qwen2"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "train_reinforce_baseline_ray_agent_async.sh", [
        *CPU, *RL, "rl.rollout.engine=hf", "rl.placement.colocate_all=false", "rl.placement.colocate_models=true",
        "infra.cpus_per_worker=1", "rl.max_steps=2", "rl.rollout.weight_sync=object_store", "rl.agent.max_turns=4",
        f"model.name_or_path={model}", f"inputs.sft_model={model}", f"data.sft.paths=[{dapo}]", f"data.prompts.paths=[{dapo}]",
        f"rl.agent.path={EXAMPLES / 'agent_func.py'}"])
    rl = stage_run(client, parent, "rl")
    turns = client.get_metric_history(rl.info.run_id, "rollout/turns")
    assert len(turns) == 2 and all(t.value > 1 for t in turns), [t.value for t in turns]
    assert [m.value for m in client.get_metric_history(rl.info.run_id, "rollout/staleness")] == [0, 1]
    assert "reward/dummy_scores" in rl.data.metrics  # the agent's extra_logs


def test_train_rejection_sampling_llama_sh(cli, workdir, prefect_server, monkeypatch, local, reward_model):
    """OpenRLHF 0.8's rejection-sampling loop as the rs stage: two rounds of sampling from the prompt collection,
    scoring with the reward model and training on each prompt's best, SFT rows held out for eval/loss."""
    model, openorca = local["models"]["llama3"], local["files"]["openorca"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "v0.8.11_train_rejection_sampling_llama.sh", [
        *CPU, f"model.name_or_path={model}", f"inputs.sft_model={model}", f"reward.rm_paths=[{reward_model}]",
        f"data.prompts.paths=[{local['files']['prompt_collection']}]", f"data.sft.paths=[{openorca}]",
        "data.sft.input_key=question", "data.sft.output_key=response", "rs.rounds=2", "rs.prompts_per_round=2",
        "rs.samples_per_prompt=2", "rs.max_new_tokens=8", "rs.generate_batch_size=4", *steps("rs")])
    rs = stage_run(client, parent, "rs")
    assert rs.data.params["rs.temperature"] == "0.9" and rs.data.params["rs.lr"] == "2e-06"  # the loop's, as converted
    assert len(client.get_metric_history(rs.info.run_id, "round/kept_share")) == 2
    assert "eval/loss" in rs.data.metrics


def test_train_iterative_dpo_llama_sh(cli, workdir, prefect_server, monkeypatch, local, reward_model):
    """OpenRLHF 0.8's iterative DPO loop as dpo.iterative: two rounds of pairs from the policy's own samples,
    ranked by the reward model; preference pairs held out for eval."""
    model, preference = local["models"]["llama3"], local["files"]["preference"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "v0.8.11_train_iterative_dpo_llama.sh", [
        *CPU, f"model.name_or_path={model}", f"inputs.sft_model={model}", f"reward.rm_paths=[{reward_model}]",
        f"data.prompts.paths=[{local['files']['prompt_collection']}]", f"data.preference.paths=[{preference}]",
        "dpo.iterative.rounds=2", "dpo.iterative.prompts_per_round=2", "dpo.iterative.samples_per_prompt=2",
        "dpo.iterative.max_new_tokens=8", "dpo.iterative.generate_batch_size=4", *steps("dpo")])
    dpo = stage_run(client, parent, "dpo")
    assert dpo.data.params["dpo.iterative.temperature"] == "1.0" and dpo.data.params["dpo.lr"] == "5e-07"
    assert "eval/reward_accuracy" in dpo.data.metrics


def test_train_conditional_llama_sh(cli, workdir, prefect_server, monkeypatch, local, reward_model):
    """OpenRLHF 0.8's conditional SFT recipe as the csft stage: the SFT rows scored by the reward model, each
    prompt given its score, then trained on; single-turn rows, as the converted config asks."""
    model, openorca = local["models"]["llama3"], local["files"]["openorca"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "v0.8.11_train_conditional_llama.sh", [
        *CPU, f"model.name_or_path={model}", f"inputs.sft_model={model}", f"reward.rm_paths=[{reward_model}]",
        f"data.sft.paths=[{openorca}]", "data.sft.input_key=question", "data.sft.output_key=response", *steps("csft")])
    csft = stage_run(client, parent, "csft")
    assert csft.data.params["csft.normalize_reward"] == "True" and "eval/loss" in csft.data.metrics


def test_train_knowledge_distillation_sh(cli, workdir, prefect_server, monkeypatch, local):
    """train_kd as the kd stage: the student pinned as the SFT model, the teacher a checkpoint by path."""
    model = local["models"]["llama3"]
    client, parent = run_script(cli, workdir, prefect_server, monkeypatch, "v0.8.11_train_knowledge_distillation.sh", [
        *CPU, f"model.name_or_path={model}", f"inputs.sft_model={model}", f"kd.teacher_path={model}",
        f"data.sft.paths=[{local['files']['openorca']}]", *steps("kd")])
    kd = stage_run(client, parent, "kd")
    assert kd.data.params["kd.kd_coef"] == "0.4" and "eval/kl" in kd.data.metrics
