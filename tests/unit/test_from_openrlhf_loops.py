"""`rlhf from-openrlhf` on OpenRLHF 0.8's loop recipes (its examples/scripts at v0.8.11): each becomes one
config of the matching stage, the loop's rounds and the steps' sizes mapped, what has no counterpart listed.
The expected values are read off the scripts by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

import flows.cli.from_openrlhf
from configs.errors import ConfigError
from configs.schema import PipelineConfig
from flows.cli.from_openrlhf import converted
from flows.cli.main import main

pytestmark = pytest.mark.timeout(60)

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "openrlhf_scripts"


def convert(name: str, *sets: str) -> tuple[PipelineConfig, str]:
    text, _ = converted((SCRIPTS / name).read_text(), name, sets)
    return flows.cli.from_openrlhf.load(text, name), text


def not_mapped(text: str) -> list[str]:
    return [line.removeprefix("#   ") for line in text.split("# Not mapped", 1)[1].splitlines()[1:]]


def test_rejection_sampling_loop_is_the_rs_stage():
    cfg, text = convert("v0.8.11_train_rejection_sampling_llama.sh")
    rs = cfg.rs
    assert rs.enabled and rs.rounds == 10  # TRAINING_ITERS=10 from iter=0
    # the generate step: --rollout_batch_size $ROLLOUT_BATCH_SIZE (10240), --best_of_n 4, --temperature 0.9 (its
    # line has no `\`: the heredoc holds it all the same), --max_new_tokens 2048, --max_num_seqs 64
    assert (rs.prompts_per_round, rs.samples_per_prompt, rs.temperature, rs.max_new_tokens, rs.generate_batch_size) == (
        10240, 4, 0.9, 2048, 64)
    assert rs.threshold is None  # OpenRLHF's rs processor keeps every prompt's best
    # train_sft: --learning_rate 2e-6, --micro_train_batch_size 2, --train_batch_size 128 on one rank, --max_epochs 1
    assert (rs.lr, rs.micro_batch_size, rs.grad_accum_steps, rs.epochs, rs.gradient_checkpointing) == (2e-6, 2, 64, 1, True)
    assert (cfg.infra.zero_stage, cfg.infra.precision, cfg.data.max_len) == (2, "bf16", 4096)
    # --pretrain $POLICY_MODEL_PATH: the first round's policy, not the last round's output the loop reassigns
    assert cfg.model.name_or_path == "OpenRLHF/Llama-3-8b-sft-mixture"
    assert cfg.inputs == {"sft_model": "OpenRLHF/Llama-3-8b-sft-mixture"}
    prompts = cfg.data.prompts
    assert prompts is not None and (prompts.paths, prompts.input_key, prompts.apply_chat_template) == (
        ["OpenRLHF/prompt-collection-v0.1"], "context_messages", True)
    assert (cfg.reward.source, cfg.reward.rm_paths, cfg.reward.batch_size) == ("rm", ["OpenRLHF/Llama-3-8b-rm-mixture"], 4)
    assert cfg.data.sft is None and "the rs stage holds SFT rows out for its eval/loss" in text
    assert "#   rs          off: no SFT data (data.sft) (the script's train_sft in its rejection-sampling loop)" in text
    assert "while (($iter < $TRAINING_ITERS)) (line 27): $TRAINING_ITERS = 10, from iter=0; each round from the last " \
           "one's policy (line 31)" in text
    assert "--only data_prep,rs\n" in text
    lines = not_mapped(text)
    assert len(lines) == len(set(lines))  # `echo $generate_commands` names the same step: listed once
    assert "checkSuccess() {...}: OpenRLHF's exit check between steps: a failed step fails the stage's run here, and " \
           "Prefect reports it (line 4)" in lines
    assert "iter=$(cat $ITER_LOG_PATH): resuming at the logged round: a rerun of the stage resumes from its last " \
           "finished round by itself (line 24)" in lines
    assert "--tp_size 4: no tensor parallelism: each rank samples its share of the prompts (line 48)" in lines
    assert "--enable_prefix_caching: the stage samples with HF generate, not a vLLM engine (line 47)" in lines
    assert any(line.startswith("--prompt_max_len 2048: a prompt is bounded with its row by data.max_len") for line in lines)
    assert any(line.startswith("--dataset ./checkpoint/llama-3-8b-rejection/rm.jsonl: the loop's kept samples") for line in lines)
    # SFT rows named: the rs stage runs
    cfg, text = convert("v0.8.11_train_rejection_sampling_llama.sh", "data.sft.paths=[rows.jsonl]")
    assert cfg.data.sft is not None and "#   rs          runs (the script's" in text


def test_iterative_dpo_loop_is_dpo_iterative():
    cfg, text = convert("v0.8.11_train_iterative_dpo_llama.sh")
    it, dpo = cfg.dpo.iterative, cfg.dpo
    assert it.rounds == 5  # TRAINING_ITERS=5
    assert (it.prompts_per_round, it.samples_per_prompt, it.temperature, it.max_new_tokens, it.generate_batch_size) == (
        10240, 8, 1.0, 2048, 64)
    assert (dpo.lr, dpo.micro_batch_size, dpo.grad_accum_steps, dpo.epochs, dpo.loss) == (5e-7, 2, 64, 1, "sigmoid")
    # a round's 10240 prompts, one pair each, one epoch over batches of 128: 80 steps a round, 5 rounds
    assert dpo.max_steps == 400
    assert (cfg.infra.zero_stage, cfg.data.max_len, cfg.inputs) == (3, 4096, {"sft_model": "OpenRLHF/Llama-3-8b-sft-mixture"})
    assert (cfg.reward.source, cfg.reward.rm_paths) == ("rm", ["OpenRLHF/Llama-3-8b-rm-mixture"])
    assert cfg.data.prompts is not None and cfg.data.prompts.input_key == "context_messages"
    assert "#   dpo         off: no preference data (data.preference) (the script's train_dpo in its iterative DPO loop)" in text
    lines = not_mapped(text)
    assert ("--ref_pretrain OpenRLHF/Llama-3-8b-sft-mixture: each round's reference is the policy it starts from (the "
            "script keeps the first round's) (line 83)") in lines
    assert any(line.startswith("--prompt_key prompt: the loop's pairs (the rm step's output)") for line in lines)
    assert "ITER_LOG_PATH=null" not in text and any(line.startswith("iter=$(cat $ITER_LOG_PATH)") for line in lines)


def test_conditional_sft_recipe_is_the_csft_stage():
    cfg, text = convert("v0.8.11_train_conditional_llama.sh")
    csft, sft = cfg.csft, cfg.data.sft
    assert csft.enabled and csft.normalize_reward  # --normalize_reward
    assert (csft.lr, csft.micro_batch_size, csft.grad_accum_steps, csft.epochs, csft.gradient_checkpointing) == (
        5e-6, 2, 64, 1, True)
    assert sft is not None and (sft.paths, sft.input_key, sft.apply_chat_template, sft.max_samples) == (
        ["OpenRLHF/preference_dataset_mixture2_and_safe_pku"], "chosen", True, 128000)
    # --micro_batch_size follows the `--normalize_reward` line without a `\`: in a heredoc, still the step's
    assert (cfg.reward.rm_paths, cfg.reward.batch_size, cfg.data.max_len) == (["OpenRLHF/Llama-3-8b-rm-mixture"], 4, 4096)
    assert cfg.inputs == {"sft_model": "OpenRLHF/Llama-3-8b-sft-mixture"}
    assert "conditional SFT here takes single-turn rows: set data.sft.input_key and data.sft.output_key" in text
    assert "#   csft        runs (the script's train_sft in its conditional SFT recipe)" in text
    lines = not_mapped(text)
    assert ("if [ ! -e $RM_OUTPUT ]: a step skipped when its output exists: a rerun of the stage reuses what it saved "
            "by itself (line 46)") in lines
    assert "--output_path ./checkpoint/llama-2-8b-csft/rm.jsonl: the scored rows stay in the stage's work dir (line 27)" in lines
    # the SFT rows' keys set: the derived prompts follow them
    cfg, _ = convert("v0.8.11_train_conditional_llama.sh", "data.sft.input_key=question", "data.sft.output_key=response")
    assert cfg.data.prompts is not None and (cfg.data.prompts.input_key, cfg.data.prompts.label_key) == ("question", "response")


def test_knowledge_distillation_is_the_kd_stage():
    cfg, text = convert("v0.8.11_train_knowledge_distillation.sh")
    kd = cfg.kd
    assert kd.enabled and (kd.teacher, kd.teacher_path, kd.student) == ("path", "meta-llama/Meta-Llama-3-70B-Instruct", "sft")
    assert (kd.kd_coef, kd.lr, kd.micro_batch_size, kd.grad_accum_steps, kd.epochs) == (0.4, 5e-6, 2, 128, 1)
    assert cfg.inputs == {"sft_model": "meta-llama/Meta-Llama-3-8B-Instruct"}  # the student
    sft = cfg.data.sft
    assert sft is not None and (sft.paths, sft.input_key, sft.output_key, sft.max_samples) == (
        ["Open-Orca/OpenOrca"], "question", "response", 500000)
    assert (cfg.infra.zero_stage, cfg.model.attn_implementation, cfg.data.max_len) == (3, "flash_attention_2", 2048)
    assert "#   kd          runs (the script's train_kd)" in text and "--only data_prep,kd\n" in text
    lines = not_mapped(text)
    assert "--teacher_offload: no counterpart yet: the frozen teacher stays on each rank's device (line 24)" in lines
    assert any(line.startswith("--save_steps -1: -1: OpenRLHF saves at the end only") for line in lines)
    # LoRA flags have no place in the kd stage, which trains the whole student
    text, _ = converted("deepspeed --module openrlhf.cli.train_kd --pretrain s --teacher_model t --dataset d --lora_rank 8\n", "kd.sh")
    assert "--lora_rank 8: the kd stage trains the whole model (no LoRA) (line 1)" in not_mapped(text)


LOOP = """\
STEPS=6
N=2
i={start}
while [ $i {op} $STEPS ]; do
  read -r -d '' gen <<EOF
openrlhf.cli.batch_inference --eval_task generate_vllm --pretrain m --dataset p --best_of_n {n}
EOF
  python -m $gen
  deepspeed --module openrlhf.cli.batch_inference --eval_task rm --pretrain r --post_processor {processor}
  deepspeed --module openrlhf.cli.{trainer} --pretrain m --train_batch_size 8 --micro_train_batch_size 2
  i=$((i + 1))
done
"""


@pytest.mark.parametrize(("start", "op", "rounds"), [("0", "-lt", 6), ("1", "-le", 6), ("2", "-lt", 4)])
def test_the_rounds_are_the_bound_less_the_counters_start(start, op, rounds):
    script = LOOP.format(start=start, op=op, n="$N", processor="rs", trainer="train_sft")
    cfg = flows.cli.from_openrlhf.load(converted(script, "loop.sh")[0], "loop.sh")
    assert (cfg.rs.rounds, cfg.rs.samples_per_prompt) == (rounds, 2)


def test_a_round_count_the_script_does_not_set_is_listed():
    script = LOOP.format(start="$(cat log)", op="-lt", n="2", processor="iter_dpo", trainer="train_dpo")
    text, _ = converted(script, "loop.sh", ["dpo.iterative.rounds=3", "dpo.max_steps=3"])
    assert "while [ $i -lt $STEPS ]: the round count is not a number the script sets: set dpo.iterative.rounds with " \
           "--set (line 4)" in not_mapped(text)


def test_steps_in_no_loop_are_one_round():
    script = LOOP.format(start="0", op="-lt", n="4", processor="iter_dpo", trainer="train_dpo")
    script = script.replace("while [ $i -lt $STEPS ]; do", "").replace("done", "")
    cfg = flows.cli.from_openrlhf.load(converted(script, "once.sh")[0], "once.sh")
    # OpenRLHF's default 2048 prompts (no --rollout_batch_size), one pair each, over batches of 8: 256 steps
    assert (cfg.dpo.iterative.rounds, cfg.dpo.iterative.samples_per_prompt, cfg.dpo.max_steps) == (1, 4, 256)


@pytest.mark.parametrize(("processor", "trainer", "n", "message"), [
    ("rs", "train_dpo", "2", "error: s.sh line 9: batch_inference --post_processor rs with train_dpo: OpenRLHF's loop "
                             "recipes pair rs and csft with train_sft, iter_dpo with train_dpo; convert the trainer's "
                             "command alone\n"),
    ("null", "train_sft", "2", "error: s.sh line 9: batch_inference --post_processor null with train_sft: OpenRLHF's "
                               "loop recipes pair rs and csft with train_sft, iter_dpo with train_dpo; convert the "
                               "trainer's command alone\n"),
    ("rs", "train_sft", "four", "error: s.sh line 6: --best_of_n 'four': expected an integer\n"),
])
def test_a_recipe_this_project_cannot_run_is_one_error_line(processor, trainer, n, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("s.sh").write_text(LOOP.format(start="0", op="-lt", n=n, processor=processor, trainer=trainer))
    assert main(["from-openrlhf", "s.sh"]) == 2
    assert capsys.readouterr().err == message


def test_a_scoring_step_without_a_processor_is_an_error():
    script = LOOP.format(start="0", op="-lt", n="2", processor="rs", trainer="train_sft").replace(" --post_processor rs", "")
    with pytest.raises(ConfigError, match=r"^s.sh line 6: batch_inference names no --post_processor \(rs, iter_dpo, csft\)"):
        converted(script, "s.sh")


def test_a_generate_step_before_conditional_sft_is_listed():
    script = ("deepspeed --module openrlhf.cli.batch_inference --eval_task generate --pretrain m --dataset p\n"
              "deepspeed --module openrlhf.cli.batch_inference --eval_task rm --pretrain r --dataset d --input_key q "
              "--output_key a --post_processor csft\n"
              "deepspeed --module openrlhf.cli.train_sft --pretrain m --dataset x\n")
    text, _ = converted(script, "c.sh")
    cfg = flows.cli.from_openrlhf.load(text, "c.sh")
    assert cfg.csft.enabled and cfg.data.sft is not None and (cfg.data.sft.input_key, cfg.data.sft.output_key) == ("q", "a")
    assert ("batch_inference --eval_task generate: the csft stage samples nothing: it scores and trains on data.sft "
            "(line 1)") in not_mapped(text)
