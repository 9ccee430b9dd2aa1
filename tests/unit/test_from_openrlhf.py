"""`rlhf from-openrlhf`: OpenRLHF launch scripts (its examples/scripts, at HEAD and at v0.8.11 for the flat
flags, and its README's command lines) as configs that `rlhf run --config` loads, with hand-checked keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import flows.cli.from_openrlhf
from configs import load_config
from configs.errors import ConfigError
from configs.from_openrlhf.page import COMMAND, page
from configs.schema import PipelineConfig
from flows.cli.from_openrlhf import converted, run
from flows.cli.main import main

pytestmark = pytest.mark.timeout(60)

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "openrlhf_scripts"
DOC = Path(__file__).resolve().parents[2] / "docs" / "from-openrlhf.md"
CALLING_NO_TRAINER = ("serve_remote_rm.sh", "train_nonrl_slurm.sh")
TRAINER_SCRIPTS = sorted(p.name for p in SCRIPTS.glob("*.sh") if p.name not in CALLING_NO_TRAINER)


def convert(name: str, *sets: str) -> tuple[PipelineConfig, str]:
    text, _ = converted((SCRIPTS / name).read_text(), name, sets)
    return flows.cli.from_openrlhf.load(text, name), text  # as `rlhf run --config` loads it


def not_mapped(text: str) -> list[str]:
    """The lines of the config's not-mapped block."""
    return [line.removeprefix("#   ") for line in text.split("# Not mapped", 1)[1].splitlines()[1:]]


def test_the_examples_are_all_here():
    assert len(TRAINER_SCRIPTS) == 30
    assert {"train_sft.sh", "train_rm.sh", "train_dpo_llama.sh", "train_ppo_with_reward_fn.sh", "train_ppo_ray_hybrid_engine.sh",
            "train_reinforce_baseline_hybrid_engine.sh", "train_dapo_ray_hybrid_engine.sh",
            "train_reinforce_baseline_ray_agent_async.sh", "train_sft_mixtral_lora.sh"} <= set(TRAINER_SCRIPTS)


@pytest.mark.parametrize("name", TRAINER_SCRIPTS)
def test_every_script_that_calls_a_trainer_converts_to_a_config_that_loads(name, tmp_path):
    out = tmp_path / "my.yaml"
    summary = run(str(SCRIPTS / name), str(out), [])
    assert f"{SCRIPTS / name}: OpenRLHF's train_" in summary
    load_config(str(out), [])
    text = out.read_text()
    assert text.startswith("# Converted by `rlhf from-openrlhf` from ")
    assert "# Stages of `rlhf run --config" in text and "# Not mapped" in text
    # every flag it mapped is named beside a key; every one it did not, with a reason
    assert all(line.count(": ") >= 1 and line.endswith(")") for line in not_mapped(text) if line)


def test_train_sft_sh_keys():
    cfg, text = convert("train_sft.sh")
    assert cfg.model.name_or_path == "meta-llama/Meta-Llama-3-8B"
    assert (cfg.sft.lr, cfg.data.max_len, cfg.infra.zero_stage, cfg.sft.micro_batch_size) == (5e-6, 2048, 2, 2)
    assert cfg.sft.grad_accum_steps == 128  # a global batch of 256 over micro batches of 2 on one rank
    assert (cfg.sft.epochs, cfg.sft.packing, cfg.sft.gradient_checkpointing, cfg.infra.precision) == (1, True, True, "bf16")
    assert cfg.model.attn_implementation == "flash_attention_2"
    sft = cfg.data.sft
    assert cfg.data.source == "files" and sft is not None
    assert (sft.paths, sft.input_key, sft.output_key, sft.max_samples) == (["Open-Orca/OpenOrca"], "question", "response", 500000)
    # no --data.apply_chat_template: OpenRLHF's template, stated
    assert (sft.apply_chat_template, sft.input_template) == (False, "User: {}\nAssistant: ")
    assert cfg.inputs == {}  # SFT trains from the base model: nothing pinned
    assert "  lr: 5.0e-06" in text and "# --adam.lr 5e-6" in text
    assert "# --data.max_len 2048" in text and "# --ds.zero_stage 2" in text and "# --train.micro_batch_size 2" in text
    assert "#   sft         runs (the script's train_sft)" in text
    assert "rlhf run --config my.yaml --only data_prep,sft" in text


def test_train_sft_mixtral_lora_keys():
    cfg, _ = convert("train_sft_mixtral_lora.sh")
    assert (cfg.sft.lora.rank, cfg.sft.lora.alpha, cfg.sft.aux_loss_coef, cfg.infra.zero_stage) == (64, 64, 0.001, 3)
    assert cfg.sft.grad_accum_steps == 32  # 128 / 4


def test_ppo_script_keys():
    cfg, text = convert("train_ppo_ray_hybrid_engine.sh")
    algorithm, rollout = cfg.rl.algorithm, cfg.rl.rollout
    assert algorithm.advantage_estimator == "gae"  # the script names none: OpenRLHF's default, PPO
    assert (algorithm.init_kl_coef, cfg.rl.actor.lr, cfg.rl.critic.lr) == (0.01, 5e-7, 9e-6)
    assert cfg.inputs == {"sft_model": "OpenRLHF/Llama-3-8b-sft-mixture", "reward_model": "OpenRLHF/Llama-3-8b-rm-700k"}
    assert cfg.reward.source == "rm" and cfg.model.name_or_path == "OpenRLHF/Llama-3-8b-sft-mixture"
    assert (cfg.rl.actor.num_workers, cfg.rl.critic.num_workers, cfg.rl.placement.ref_num_workers) == (8, 8, 8)
    assert (cfg.rl.placement.reward_num_workers, cfg.rl.placement.colocate_all) == (8, True)
    assert (rollout.engine, rollout.num_engines, rollout.vllm_gpu_memory_utilization) == ("vllm", 4, 0.5)
    assert (rollout.batch_size, rollout.n_samples_per_prompt, cfg.rl.train_batch_size, cfg.rl.micro_train_batch_size) == (1024, 1, 128, 1)
    assert (rollout.prompt_max_len, rollout.generate_max_len, cfg.data.max_len) == (2048, 2048, 2048)
    assert algorithm.rollout_is_cap == 5.0  # the upper end of OpenRLHF's default threshold
    prompts = cfg.data.prompts
    assert prompts is not None and (prompts.paths, prompts.input_key) == (["OpenRLHF/prompt-collection-v0.1"], "context_messages")
    assert "#   sft         off: inputs.sft_model stands in for its output" in text
    assert "#   rl          runs (the script's train_ppo_ray)" in text
    assert "--only data_prep,rl\n" in text
    assert "# OpenRLHF's default (no --algo.advantage.estimator)" in text
    # no --critic.model_name_or_path: OpenRLHF's gae critic starts from the reward model, ours from the SFT model
    assert cfg.rl.critic.init_from == "reward_model"
    assert "# OpenRLHF's default (no --critic.model_name_or_path): the critic starts from the reward model" in text


PPO_CALL = "python3 -m openrlhf.cli.train_ppo_ray --pretrain sft --prompt_data p.jsonl --input_key q --label_key a "


@pytest.mark.parametrize(("flags", "init_from", "init_path"), [
    ("--reward_pretrain rm --critic_pretrain sft", "sft", None),  # the policy's model
    ("--reward_pretrain rm --critic_pretrain rm", "reward_model", None),  # the pinned reward model
    ("--reward_pretrain rm --critic_pretrain /other/rm", "path", "/other/rm"),
    ("--reward_pretrain rm1,rm2", "path", "rm1"),  # OpenRLHF's default: the first of several reward models
    ("--remote_rm_url http://rm:5000/get_reward", "sft", None),  # a remote reward: OpenRLHF's critic from --pretrain
    ("--remote_rm_url http://rm:5000/get_reward --critic_pretrain /other/rm", "path", "/other/rm"),
])
def test_critic_pretrain_names_where_the_critic_starts(flags, init_from, init_path):
    cfg = PipelineConfig.model_validate(yaml.safe_load(converted(PPO_CALL + flags, "ppo.sh")[0]))
    assert (cfg.rl.critic.init_from, cfg.rl.critic.init_path) == (init_from, init_path)


def test_the_critics_flags_are_ignored_without_a_critic_and_the_value_network_is_kept_with_one():
    cfg = PipelineConfig.model_validate(yaml.safe_load(converted(PPO_CALL + "--reward_pretrain rm --save_value_network", "a.sh")[0]))
    assert cfg.rl.critic.save_value_network and cfg.rl.critic.init_from == "reward_model"
    text, _ = converted(PPO_CALL + "--reward_pretrain rm --advantage_estimator group_norm --n_samples_per_prompt 4 "
                                   "--critic_pretrain /other/rm --save_value_network", "b.sh")
    cfg = PipelineConfig.model_validate(yaml.safe_load(text))
    assert (cfg.rl.critic.init_from, cfg.rl.critic.save_value_network) == ("sft", False)
    lines = not_mapped(text)
    assert "--critic_pretrain /other/rm: OpenRLHF ignores it: advantage_estimator group_norm trains no critic (line 1)" in lines
    assert "--save_value_network: OpenRLHF ignores it: advantage_estimator group_norm trains no critic (line 1)" in lines


def test_flat_ppo_script_keys():
    cfg, text = convert("v0.8.11_train_grpo_ray_hybrid_engine.sh")
    algorithm = cfg.rl.algorithm
    assert (algorithm.advantage_estimator, algorithm.init_kl_coef, algorithm.kl_estimator, algorithm.use_kl_loss) == ("group_norm", 1e-3, "k3", True)
    assert (cfg.rl.actor.lr, cfg.rl.rollout.n_samples_per_prompt, cfg.rl.micro_train_batch_size) == (5e-7, 8, 8)
    assert (cfg.rl.rollout.prompt_max_len, cfg.rl.rollout.generate_max_len, cfg.data.max_len) == (1024, 1024, 2048)
    assert cfg.inputs["sft_model"] == "OpenRLHF/Llama-3-8b-sft-mixture"
    assert "flat flags (OpenRLHF 0.5 to 0.10.1)" in text


def test_dapo_and_reward_function_scripts():
    cfg, _ = convert("train_dapo_ray_hybrid_engine.sh")
    algorithm = cfg.rl.algorithm
    assert (algorithm.eps_clip_low, algorithm.eps_clip_high, algorithm.dynamic_filtering) == (0.2, 0.27, True)
    assert (cfg.reward.source, cfg.reward.func_path) == ("func", "/openrlhf/examples/python/reward_func.py")
    cfg, _ = convert("v0.8.11_train_ppo_llama_with_remote_rm.sh")
    assert (cfg.reward.source, cfg.reward.url) == ("remote", "http://localhost:5000/get_reward")
    assert cfg.infra.offload_optimizer and cfg.rl.placement.colocate_actor_ref


def test_dpo_kto_rm_and_prm_scripts():
    cfg, _ = convert("train_dpo_llama.sh")
    preference = cfg.data.preference
    assert preference is not None and preference.paths == ["OpenRLHF/preference_dataset_mixture2_and_safe_pku"]
    assert (cfg.dpo.lr, cfg.dpo.beta, cfg.dpo.loss, cfg.dpo.grad_accum_steps, cfg.data.max_len) == (5e-7, 0.1, "sigmoid", 256, 8192)
    assert cfg.data.sft is not None and cfg.data.sft.multiturn  # the chosen conversations stand in as SFT rows
    cfg, text = convert("v0.8.11_train_kto_llama.sh")
    assert (cfg.dpo.loss, cfg.dpo.beta, cfg.dpo.lr, cfg.data.source) == ("kto", 0.1, 5e-7, "files")
    kto = cfg.data.preference
    assert kto is not None and kto.unpaired and kto.paths == ["Dylan2048/ultrafeedback-unpaired-preferences"]
    assert (kto.input_key, kto.output_key, kto.label_key, kto.input_template) == ("instruction", "response", "score",
                                                                                  "User: {}\nAssistant: ")
    assert not any(line.startswith("--dataset") for line in not_mapped(text))
    assert "off: data.preference.unpaired: KTO's rows, no pairs" in text  # the rm stage
    cfg, _ = convert("train_rm.sh")
    assert (cfg.rm.lr, cfg.rm.micro_batch_size, cfg.rm.grad_accum_steps, cfg.infra.zero_stage) == (9e-6, 1, 256, 3)
    cfg, _ = convert("v0.8.11_train_prm_mistral.sh")
    assert (cfg.prm.placeholder_token, cfg.prm.reward_tokens, cfg.prm.lr) == ("ки", ("+", "-"), 1e-6)
    prm = cfg.data.prm
    assert prm is not None and (prm.paths, prm.input_key, prm.label_key) == (["zhuzilin/Math-Shepherd"], "input", "value")
    assert (cfg.prm.eval_every, cfg.prm.save_every, cfg.prm.grad_accum_steps) == (100, 500, 32)


def test_unmapped_flags_are_listed_with_their_reasons():
    _, text = convert("train_ppo_with_reward_fn.sh")
    lines = not_mapped(text)
    assert "--logger.wandb.key {wandb_token}: runs go to MLflow (`rlhf ui`, `rlhf runs`) (line 47)" in lines
    assert ("--vllm.tensor_parallel_size 2: no counterpart yet: each rollout engine is one worker (no tensor parallelism) "
            "(line 22)") in lines
    _, text = convert("train_reinforce_baseline_hybrid_engine.sh")
    lines = not_mapped(text)
    assert ("--ds.ring_attn_size 2: ring attention is not supported: a sequence stays on one rank; for long ones use "
            "{model}.gradient_checkpointing and {model}.packing (line 77)") in lines
    assert "--train.dynamic_batch_enable: batches by token count are not supported: batches count rows (line 50)" in lines
    _, text = convert("train_vlm_math_hybrid_engine.sh")
    assert "--data.image_key images: VLM (image) training is not supported (line 72)" in not_mapped(text)


def test_the_agent_and_async_training_are_kept_together():
    cfg, text = convert("train_reinforce_baseline_ray_agent_async.sh")
    assert cfg.rl.agent.path == "${AGENT_FUNC_PATH}" and cfg.rl.rollout.async_train
    assert "(the script sets AGENT_FUNC_PATH=examples/python/agent_func.py)" in text
    assert not any(line.startswith("--train.async_enable") for line in not_mapped(text))


def test_a_missing_backslash_and_a_readme_elision():
    _, text = convert("readme_v0.8.11_ppo.sh")
    assert "--use_wandb {wandb_token}: not passed to the trainer: its command ends on line 50 (a missing `\\`?) (line 51)" in not_mapped(text)
    cfg, _ = convert("readme_v0.8.11_reward_fn.sh")  # `...` on a line of its own: the command goes on
    assert cfg.reward.func_path == "/path/to/reward_func.py"


@pytest.mark.parametrize("launch", ["deepspeed --module", "deepspeed --num_gpus 2 --module", "python -m", "python3 -m",
                                    "torchrun --nproc_per_node 2 -m"])
def test_each_launcher_form(launch):
    script = (f"set -x\nexport WANDB_MODE=offline\n{launch} openrlhf.cli.train_dpo \\\n   --pretrain OpenRLHF/Llama-3-8b-sft-mixture \\\n"
              "   --dataset OpenRLHF/preference_dataset_mixture2_and_safe_pku --ipo \\\n"
              "   --learning_rate=5e-7 --train_batch_size 64 --micro_train_batch_size 8\n")
    text, _ = converted(script, "cmd.sh")
    cfg = PipelineConfig.model_validate(yaml.safe_load(text))
    assert (cfg.dpo.loss, cfg.dpo.lr) == ("ipo", 5e-7)
    ranks = 2 if "2" in launch else 1
    assert (cfg.infra.num_workers, cfg.dpo.grad_accum_steps) == (ranks, 8 // ranks)


def test_label_smoothing_is_cdpo_and_yields_to_ipo():
    base = "deepspeed --module openrlhf.cli.train_dpo --pretrain m --dataset d --label_smoothing 0.1"
    cfg = PipelineConfig.model_validate(yaml.safe_load(converted(base, "a.sh")[0]))
    assert (cfg.dpo.loss, cfg.dpo.label_smoothing) == ("sigmoid", 0.1)
    text, _ = converted(base + " --ipo", "b.sh")
    assert PipelineConfig.model_validate(yaml.safe_load(text)).dpo.loss == "ipo"
    assert "--label_smoothing 0.1: cDPO's label smoothing goes with the sigmoid loss, and --ipo is set (line 1)" in not_mapped(text)


def test_pretrain_mode_and_the_chat_template_are_mapped():
    base = "deepspeed --module openrlhf.cli.train_sft --pretrain m --input_key text --pretrain_mode"
    template = " --tokenizer_chat_template '{% for m in messages %}{{ m.content }}{% endfor %}'"
    cfg = PipelineConfig.model_validate(yaml.safe_load(converted(base + " --dataset d.jsonl" + template, "a.sh")[0]))
    assert cfg.sft.pretrain_mode and cfg.data.sft is not None and cfg.data.sft.input_key == "text"
    assert cfg.data.tokenizer_chat_template == "{% for m in messages %}{{ m.content }}{% endfor %}"
    text, _ = converted(base, "b.sh")  # no dataset: the synthetic task has no plain text
    assert not PipelineConfig.model_validate(yaml.safe_load(text)).sft.pretrain_mode
    assert "--pretrain_mode: the script names no dataset, and the synthetic task standing in has no plain text (line 1)" \
        in not_mapped(text)


def test_a_kto_script_without_output_key_reads_conversations():
    text, _ = converted("deepspeed --module openrlhf.cli.train_kto --pretrain m --dataset d --apply_chat_template", "k.sh")
    cfg = PipelineConfig.model_validate(yaml.safe_load(text))
    kto, sft = cfg.data.preference, cfg.data.sft
    assert kto is not None and kto.unpaired and kto.output_key == kto.input_key == "input"
    assert sft is not None and sft.multiturn and cfg.dpo.loss == "kto"


def test_set_overrides_keys_of_the_result():
    cfg, text = convert("train_sft.sh", "model.name_or_path=/models/llama3", "sft.micro_batch_size=1", "data.max_len=512")
    assert (cfg.model.name_or_path, cfg.sft.micro_batch_size, cfg.data.max_len) == ("/models/llama3", 1, 512)
    assert "# --set sft.micro_batch_size=1 (was --train.micro_batch_size 2)" in text
    with pytest.raises(ConfigError, match=r"^--set 'sft.lrr=1': unknown key 'sft.lrr' \(expected one of: lr, "):
        convert("train_sft.sh", "sft.lrr=1")
    with pytest.raises(ConfigError, match=r"^train_sft.sh \(converted\): sft.lr: Input should be greater than 0"):
        convert("train_sft.sh", "sft.lr=-1")


@pytest.mark.parametrize(("script", "model", "stage"), [
    ("readme_v0.11.0_sft.sh", "meta-llama/Meta-Llama-3-8B", "sft"),
    ("readme_v0.11.0_rm.sh", "OpenRLHF/Llama-3-8b-sft-mixture", "rm"),
    ("readme_v0.11.0_ppo.sh", "OpenRLHF/Llama-3-8b-sft-mixture", "rl.actor"),
])
def test_the_readmes_commands_name_their_model(script, model, stage):
    """OpenRLHF's current README writes every trainer's model and checkpointing as the actor's
    (`--actor.model_name_or_path`, `--actor.gradient_checkpointing_enable`); train_sft and train_rm parse
    `--model.*`. The converter reads the README's spelling as what it means, and says so beside the key."""
    cfg, text = convert(script)
    assert cfg.model.name_or_path == model
    section = cfg.rl.actor if stage == "rl.actor" else getattr(cfg, stage)
    assert section.gradient_checkpointing is True
    assert not [line for line in not_mapped(text) if line.startswith("--actor.")]
    if stage != "rl.actor":  # PPO's own parser spells them so
        assert "the trainer's own argument parser takes --model.model_name_or_path" in text
        assert "the trainer's own argument parser takes --model.gradient_checkpointing_enable" in text


def test_the_readmes_head_prefix_spelling_is_the_rms_head_prefix():
    script = "deepspeed --module openrlhf.cli.train_rm --pretrain m --dataset d --value_prefix_head score\n"
    text, _ = converted(script, "rm.sh")
    cfg = flows.cli.from_openrlhf.load(text, "rm.sh")
    assert cfg.rm.value_head_prefix == "score"
    assert "the trainer's own argument parser takes --value_head_prefix" in text


def test_derived_datasets_follow_the_users_set():
    """The README's reward-function command names a placeholder prompt set; `--set` names the user's file and
    key, and the SFT rows derived from the prompts follow them (not the placeholder)."""
    cfg, text = convert("readme_v0.11.0_reward_fn.sh", "data.prompts.paths=[my.jsonl]", "data.prompts.input_key=question")
    assert cfg.data.prompts is not None and cfg.data.sft is not None
    assert (cfg.data.prompts.paths, cfg.data.prompts.input_key) == (["my.jsonl"], "question")
    assert (cfg.data.sft.paths, cfg.data.sft.input_key, cfg.data.sft.output_key) == (["my.jsonl"], "question", "answer")
    assert "# --set data.prompts.paths=[my.jsonl] (was --data.prompt_dataset your_prompt_dataset)" in text


def test_a_script_with_data_and_no_model_it_reads_is_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.sh").write_text("deepspeed --module openrlhf.cli.train_sft --dataset d --input_key q --output_key r\n")
    assert main(["from-openrlhf", "s.sh"]) == 2
    assert capsys.readouterr().err == (
        "error: s.sh (converted): model.name_or_path: missing: a config of data files names the model to train (a hub "
        "id or a local HF checkpoint); only a config with base: tiny builds the tiny model\n")


def test_the_cli_writes_the_config_and_reads_stdin(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sft.yaml"
    assert main(["from-openrlhf", str(SCRIPTS / "train_sft.sh"), "-o", str(out), "--set", "seed=7"]) == 0
    assert load_config(str(out), []).seed == 7
    assert "keys from its flags" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("python -m openrlhf.cli.train_sft --pretrain m --dataset d\n"))
    assert main(["from-openrlhf", "-"]) == 0
    assert "from <stdin>: OpenRLHF's train_sft" in capsys.readouterr().out


@pytest.mark.parametrize(("script", "message"), [
    ("echo hello\n", "error: s.sh: calls none of OpenRLHF's trainers (train_sft, train_rm, train_prm, train_dpo, train_kto, "
                     "train_ppo_ray, train_kd)\n"),
    ("ray job submit -- python3 -m openrlhf.cli.train_ppo_ray \\\n  --pretrain m \\\n  --actor_learning_rate abc\n",
     "error: s.sh line 3: --actor_learning_rate 'abc': expected a number\n"),
    ("deepspeed --module openrlhf.cli.train_sft --max_len\n", "error: s.sh line 1: --max_len: expected an integer (got no value)\n"),
    ("deepspeed --module openrlhf.cli.train_sft --bf16 yes\n", "error: s.sh line 1: --bf16 'yes': takes no value (got 'yes')\n"),
    ("python -m openrlhf.cli.train_ppo_ray --advantage_estimator ppo\n",
     "error: s.sh line 1: --advantage_estimator 'ppo': expected one of: gae, reinforce, reinforce_baseline, rloo, group_norm, "
     "dr_grpo\n"),
    ("python -m openrlhf.cli.train_sft --pretrain 'm\n", "error: s.sh line 1: a ' is never closed\n"),
    # an array that doubles per line: 2^40 words if spliced as written, refused at 10,000 (line 15: 2^14)
    ("A=(--bf16)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 40 + "python -m openrlhf.cli.train_sft \"${A[@]}\"\n",
     "error: s.sh line 15: A=( ... ) holds 16384 words, over 10000; a trainer call has a few hundred\n"),
    ("#" * (1 << 20) + "\n", "error: s.sh: over 1048576 characters; a launch script is a few thousand: give the one "
                            "that calls the trainer\n"),
])
@pytest.mark.timeout(30)
def test_bad_input_is_one_error_line(script, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.sh").write_text(script)
    assert main(["from-openrlhf", "s.sh"]) == 2
    assert capsys.readouterr().err == message


def test_a_script_that_calls_another_module_says_so():
    with pytest.raises(ConfigError, match=r"^serve_remote_rm.sh: calls none of .*; it calls openrlhf.cli.serve_rm$"):
        converted((SCRIPTS / "serve_remote_rm.sh").read_text(), "serve_remote_rm.sh")
    with pytest.raises(ConfigError, match=r"^train_nonrl_slurm.sh: calls none of OpenRLHF's trainers"):
        converted((SCRIPTS / "train_nonrl_slurm.sh").read_text(), "train_nonrl_slurm.sh")


def test_frozen_model_offload_reward_normalization_and_liger_kernels():
    flat, _ = converted("python -m openrlhf.cli.train_ppo_ray --pretrain m --prompt_data p --reward_pretrain r "
                        "--ref_reward_offload --normalize_reward --use_liger_kernel\n", "s.sh")
    cfg = flows.cli.from_openrlhf.load(flat, "s.sh")
    assert cfg.rl.placement.ref_offload and cfg.rl.placement.reward_offload  # the flat flag: both frozen models
    assert cfg.reward.normalize is True and cfg.model.use_liger_kernel
    nested, _ = converted("python -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path m --data.prompt_dataset p "
                          "--reward.model_name_or_path r --reward.offload\n", "s.sh")
    cfg = flows.cli.from_openrlhf.load(nested, "s.sh")
    assert cfg.rl.placement.reward_offload and not cfg.rl.placement.ref_offload  # the nested flags: one each
    assert cfg.reward.normalize is None  # no --reward.normalize_enable: as the checkpoint says (false in OpenRLHF's)
    # a reward function has no statistics: OpenRLHF ignores the flag, and so does the conversion, saying why
    cfg, text = convert("train_ppo_with_reward_fn.sh")
    assert cfg.reward.normalize is None
    assert "--reward.normalize_enable: takes effect only with --reward_pretrain (line 42)" in not_mapped(text)
    dpo, _ = converted("deepspeed --module openrlhf.cli.train_dpo --pretrain m --dataset d --ref_offload\n", "s.sh")
    assert any(line.startswith("--ref_offload: the reference's log-probs are computed before the policy loads")
               for line in not_mapped(dpo))


def test_an_unknown_flag_is_listed_not_an_error():
    text, _ = converted("deepspeed --module openrlhf.cli.train_rm --pretrain m --dataset d --reward_pretrain r\n", "s.sh")
    assert "--reward_pretrain r: unknown to OpenRLHF's train_rm (line 1)" in not_mapped(text)


def test_the_docs_page_is_what_the_table_generates():
    assert DOC.read_text() == page(), f"docs/from-openrlhf.md is stale: run `{COMMAND}`"


def test_ema_best_metric_and_checkpoint_count_are_mapped():
    base = "python -m openrlhf.cli.train_ppo_ray --pretrain m --prompt_data d --remote_rm_url r.py"
    text, _ = converted(base + " --ema_beta 0.9 --enable_ema --best_metric_key eval_gsm8k_pass1 --max_ckpt_num 5", "a.sh")
    cfg = PipelineConfig.model_validate(yaml.safe_load(text))
    # --ema_beta before --enable_ema on the line: still the beta given, not OpenRLHF's default
    assert (cfg.rl.actor.ema_beta, cfg.rl.best_metric, cfg.rl.max_checkpoints) == (0.9, "sampled_reward", 5)
    text, _ = converted(base + " --train.enable_ema --ckpt.best_metric_key eval_math_pass8 --eval.n_samples_per_prompt 8", "b.sh")
    cfg = PipelineConfig.model_validate(yaml.safe_load(text))
    assert (cfg.rl.actor.ema_beta, cfg.rl.best_metric, cfg.rl.max_checkpoints) == (0.992, "pass_at_k", 3)  # OpenRLHF's defaults
    text, _ = converted(base + " --ema_beta 0.5 --best_metric_key none --ckpt.max_mem 10", "c.sh")
    cfg = PipelineConfig.model_validate(yaml.safe_load(text))
    assert (cfg.rl.actor.ema_beta, cfg.rl.best_metric) == (None, None)
    lines = not_mapped(text)
    assert "--ema_beta 0.5: takes effect only with --enable_ema (line 1)" in lines
    assert "--best_metric_key none: none: OpenRLHF's output is the last step's policy, as the default here (line 1)" in lines
    assert any(line.startswith("--ckpt.max_mem 10: no counterpart yet: checkpoints are counted") for line in lines)
    text, _ = converted("deepspeed --module openrlhf.cli.train_sft --pretrain m --dataset d --max_ckpt_num 2", "d.sh")
    assert PipelineConfig.model_validate(yaml.safe_load(text)).sft.max_checkpoints == 2


def test_a_ppo_eval_dataset_is_read_with_the_prompts_keys_and_a_trainers_is_listed():
    script = ("python3 -m openrlhf.cli.train_ppo_ray --pretrain m --prompt_data p --input_key q --label_key a "
              "--apply_chat_template --eval_dataset e --eval_split test --remote_rm_url http://x/get_reward\n")
    text, _ = converted(script, "ppo.sh", ())
    cfg = flows.cli.from_openrlhf.load(text, "ppo.sh")
    held = cfg.data.eval_prompts
    assert held is not None and (held.paths, held.split, held.input_key, held.label_key, held.apply_chat_template) == (
        ["e"], "test", "q", "a", True)
    assert cfg.data.prompts is not None and cfg.data.prompts.paths == ["p"]
    text, _ = converted("deepspeed --module openrlhf.cli.train_sft --pretrain m --dataset d --eval_dataset e\n", "sft.sh", ())
    assert any(line.startswith("--eval_dataset e: no counterpart yet") for line in not_mapped(text))
