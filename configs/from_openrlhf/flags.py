"""OpenRLHF's trainer flags and what each becomes here: the one table `rlhf from-openrlhf` converts
with and docs/from-openrlhf.md is generated from (`python -m configs.from_openrlhf.page`).

A row names a flag in both of OpenRLHF's spellings, the flat flags of 0.5 to 0.10.1 (`--pretrain`,
`--actor_learning_rate`) and the nested ones of 0.10.2 on (`--actor.model_name_or_path`,
`--actor.adam.lr`); the trainers that take it; the keys of ours it sets and how its value converts,
or, with no keys, why it is not mapped. A key may name a trainer's own places: `{stage}` (its stage's
section), `{model}` (each model it trains: `rl.actor` and `rl.critic` for PPO) and `{data}` (the
dataset it reads). Every flag OpenRLHF's trainers took in those versions has a row; one without is
reported as unknown to the trainer. train_prm and train_kto were gone by 0.10.2: they take flat flags only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from configs.from_openrlhf.values import (
    Choice,
    CriticStart,
    Factor,
    Listed,
    MetricKey,
    Number,
    Pair,
    PerRank,
    RewardModel,
    RewardUrl,
    Switch,
    Symmetric,
    Text,
    Value,
    Why,
    Words,
)

SFT, RM, PRM, DPO, KTO, PPO, KD = "train_sft", "train_rm", "train_prm", "train_dpo", "train_kto", "train_ppo_ray", "train_kd"
ALL = (SFT, RM, PRM, DPO, KTO, PPO, KD)
TRAINING = (SFT, RM, PRM, DPO, KTO, KD)  # the DeepSpeed trainers of one model
NESTED = (SFT, RM, DPO, PPO)  # the trainers OpenRLHF kept when its flags became nested (0.10.2)


@dataclass(frozen=True)
class Trainer:
    name: str
    stage: str  # the stage of ours it becomes
    models: tuple[str, ...]  # the config sections of the models it trains
    data: str | None  # the dataset section it reads; None: its data has no counterpart (`no_data` says why)
    no_data: str = ""
    from_sft: bool = True  # its starting model is an SFT model: pinned as inputs.sft_model, so sft does not run
    sets: dict[str, object] = field(default_factory=dict)  # keys the trainer itself fixes


TRAINERS = {t.name: t for t in (
    Trainer(SFT, "sft", ("sft",), "data.sft", from_sft=False),
    Trainer(RM, "rm", ("rm",), "data.preference"),
    Trainer(PRM, "prm", ("prm",), "data.prm"),
    Trainer(DPO, "dpo", ("dpo",), "data.preference"),
    # train_kto reads single responses, each desirable or not: unpaired preference rows
    Trainer(KTO, "dpo", ("dpo",), "data.preference", sets={"dpo.loss": "kto", "data.preference.unpaired": True}),
    Trainer(PPO, "rl", ("rl.actor", "rl.critic"), "data.prompts"),
    # train_kd's student starts from --pretrain (an SFT model, kd.student: sft) and reads SFT rows
    Trainer(KD, "kd", ("kd",), "data.sft", sets={"kd.enabled": True}),
)}


TEXT = Text()  # frozen: one instance serves every flag that takes text


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # OpenRLHF's spellings, flat and nested
    trainers: tuple[str, ...]
    keys: tuple[str, ...] = ()  # ours; empty: not mapped
    value: Value = TEXT
    why: str = ""  # not mapped: why; mapped: a caveat shown beside the key
    absent: object = None  # OpenRLHF's default where ours differs: set when the script leaves the key unset
    absent_unless: tuple[str, ...] = ()  # flags that make OpenRLHF ignore that default
    also: dict[str, object] = field(default_factory=dict)  # keys set to these values with the row's own
    needs: tuple[str, ...] = ()  # flags without which OpenRLHF ignores this one

    @property
    def mapped(self) -> bool:
        return bool(self.keys)


# reasons shared by many rows
MLFLOW = "runs go to MLflow (`rlhf ui`, `rlhf runs`)"
CHECKPOINTS = "checkpoints are the stage run's MLflow artifacts (registered as models); a rerun resumes from the last one by itself"
NOT_YET = "no counterpart yet"
LAUNCHER = "set by the launcher"
NO_RING = ("ring attention is not supported: a sequence stays on one rank; for long ones use {model}.gradient_checkpointing "
           "and {model}.packing")
NO_DYNAMIC_BATCH = "batches by token count are not supported: batches count rows"
NO_MUON = "the Muon optimizer is not supported: AdamW only"
NO_VLM = "VLM (image) training is not supported"
NO_SLEEP = "no counterpart yet: engines and models are not put to sleep between phases"
EPS = "no counterpart yet: AdamW's eps is 1e-8, OpenRLHF's default"
REENTRANT = "no counterpart yet: checkpointing is non-reentrant"


def readme(spelled: str) -> str:
    """The caveat of a spelling OpenRLHF's README uses where its trainer's own argument parser has another."""
    return f"as OpenRLHF's README spells it; the trainer's own argument parser takes {spelled}"


SCHEDULE = Choice({name: name for name in ("cosine_with_min_lr", "linear", "constant_with_warmup", "constant")})
DTYPES = Choice({"bf16": "bf16", "fp16": "fp16"})
ATTENTION = Choice({"flash_attention_2": "flash_attention_2", "sdpa": "sdpa", "eager": "eager",
                        "flash_attention_3": Why("flash_attention_3 is not supported (auto, sdpa, eager, flash_attention_2)")})


GROUPS: tuple[tuple[str, tuple[Flag, ...]], ...] = (
    ("Model, precision and DeepSpeed", (
        Flag(("--pretrain", "--model.model_name_or_path"), TRAINING, ("model.name_or_path",)),
        Flag(("--pretrain", "--actor.model_name_or_path"), (PPO,), ("model.name_or_path",)),
        Flag(("--zero_stage", "--ds.zero_stage"), ALL, ("infra.zero_stage",), Choice({str(i): i for i in range(4)})),
        Flag(("--bf16",), ALL, ("infra.precision",), Switch(value="bf16")),
        Flag(("--param_dtype", "--ds.param_dtype"), ALL, ("infra.precision",), DTYPES, absent="bf16"),
        Flag(("--flash_attn",), ALL, ("model.attn_implementation",), Switch(value="flash_attention_2")),
        Flag(("--attn_implementation", "--ds.attn_implementation"), ALL, ("model.attn_implementation",), ATTENTION),
        Flag(("--adam_offload", "--ds.adam_offload"), ALL, ("infra.offload_optimizer",), Switch()),
        Flag(("--overlap_comm", "--ds.overlap_comm"), ALL, ("infra.overlap_comm",), Switch()),
        Flag(("--gradient_checkpointing", "--model.gradient_checkpointing_enable"), TRAINING, ("{model}.gradient_checkpointing",), Switch()),
        Flag(("--gradient_checkpointing", "--actor.gradient_checkpointing_enable"), (PPO,), ("{model}.gradient_checkpointing",), Switch()),
        # OpenRLHF's README writes these trainers' flags as PPO's actor's: read as what they mean there
        Flag(("--actor.model_name_or_path",), (SFT, RM, DPO), ("model.name_or_path",), why=readme("--model.model_name_or_path")),
        Flag(("--actor.gradient_checkpointing_enable",), (SFT, RM, DPO), ("{model}.gradient_checkpointing",), Switch(),
             why=readme("--model.gradient_checkpointing_enable")),
        Flag(("--gradient_checkpointing_use_reentrant", "--model.gradient_checkpointing_reentrant"), TRAINING, why=REENTRANT),
        Flag(("--gradient_checkpointing_use_reentrant", "--actor.gradient_checkpointing_reentrant"), (PPO,), why=REENTRANT),
        Flag(("--seed", "--train.seed"), ALL, ("seed",), Number(integer=True)),
        Flag(("--ring_attn_size", "--ring_head_stride", "--ds.ring_attn_size", "--ds.ring_attn_head_stride"), (SFT, RM, DPO, PPO),
             why=NO_RING),
        Flag(("--ds_tensor_parallel_size", "--ds.tensor_parallel_size"), (SFT, RM, PRM, DPO, PPO, KD),
             why="DeepSpeed tensor parallelism is not supported: ZeRO data parallelism only (infra.zero_stage: 3 "
                 "shards a model across the ranks)"),
        Flag(("--deepcompile", "--ds.deepcompile"), ALL, why="not supported: DeepSpeed runs its engines uncompiled; for speed use "
                                                                  "{model}.packing and model.use_liger_kernel"),
        Flag(("--torch_compile",), ALL, why="not supported"),
        Flag(("--disable_trace_cache",), ALL, why="not supported"),
        Flag(("--zpg", "--ds.zpg"), ALL, why="ZeRO++ partitions are not supported"),
        Flag(("--grad_accum_dtype", "--ds.grad_accum_dtype"), ALL, why="no counterpart yet: gradients accumulate in the training precision"),
        Flag(("--use_liger_kernel", "--ds.use_liger_kernel"), (SFT, PRM, DPO, KTO, PPO, KD), ("model.use_liger_kernel",), Switch(),
             why="a CUDA GPU and liger-kernel (the gpu extra); every causal LM a stage runs"),
        Flag(("--use_ms",), ALL, why="ModelScope is not supported: hub ids are Hugging Face's"),
        Flag(("--ds.experts_implementation",), NESTED, why="no counterpart yet: MoE experts run as transformers loads them"),
        Flag(("--load_in_4bit", "--ds.load_in_4bit"), ALL, ("{model}.lora.load_in_4bit",), Switch()),
        Flag(("--full_determinism", "--train.full_determinism_enable"), ALL, ("infra.deterministic",), Switch()),
        Flag(("--local_rank",), ALL, why=LAUNCHER),
    )),
    ("Data", (
        Flag(("--dataset", "--data.dataset"), TRAINING, ("{data}.paths",), Listed()),
        Flag(("--prompt_data", "--data.prompt_dataset"), (PPO,), ("{data}.paths",), Listed()),
        Flag(("--dataset_probs", "--data.dataset_probs"), TRAINING, ("{data}.probs",), Listed(numbers=True)),
        Flag(("--prompt_data_probs", "--data.prompt_probs"), (PPO,), ("{data}.probs",), Listed(numbers=True)),
        Flag(("--dataset_split", "--train_split", "--data.dataset_split"), TRAINING, ("{data}.split",)),
        Flag(("--prompt_split", "--data.prompt_split"), (PPO,), ("{data}.split",)),
        Flag(("--max_samples", "--data.max_samples"), ALL, ("{data}.max_samples",), Number(integer=True)),
        Flag(("--max_len", "--data.max_len"), (SFT, PRM, KTO, KD), ("data.max_len",), Number(integer=True), absent=2048),
        Flag(("--max_len", "--data.max_len"), (RM, DPO), ("data.max_len",), Number(integer=True), absent=512),
        Flag(("--max_len", "--data.max_len"), (PPO,), ("data.max_len",), Number(integer=True),
             why="the prompt and the response together (rl.rollout bounds each)"),
        Flag(("--input_key", "--data.input_key"), (SFT, PRM, KTO, PPO, KD), ("{data}.input_key",)),
        Flag(("--prompt_key", "--data.prompt_key"), (RM, DPO), ("{data}.input_key",)),
        Flag(("--output_key", "--data.output_key"), (SFT, KTO, KD), ("{data}.output_key",)),
        Flag(("--chosen_key", "--data.chosen_key"), (RM, DPO), ("{data}.chosen_key",)),
        Flag(("--rejected_key", "--data.rejected_key"), (RM, DPO), ("{data}.rejected_key",)),
        Flag(("--label_key", "--data.label_key"), (PRM, KTO, PPO), ("{data}.label_key",)),
        Flag(("--apply_chat_template", "--data.apply_chat_template"), (SFT, RM, DPO, KTO, PPO, KD), ("{data}.apply_chat_template",),
             Switch(), absent=False),
        Flag(("--input_template", "--data.input_template"), (SFT, KTO, KD), ("{data}.input_template",), absent="User: {}\nAssistant: ",
             absent_unless=("--apply_chat_template", "--data.apply_chat_template")),
        Flag(("--input_template", "--data.input_template"), (RM, DPO, PPO), ("{data}.input_template",)),
        Flag(("--multiturn", "--data.multiturn"), (SFT,), ("{data}.multiturn",), Switch()),
        Flag(("--tokenizer_chat_template", "--data.tokenizer_chat_template"), (SFT, RM, DPO), ("data.tokenizer_chat_template",),
             why="every dataset's, and saved with the base model's tokenizer"),
        Flag(("--disable_fast_tokenizer", "--data.disable_fast_tokenizer"), ALL, why="no counterpart yet: the fast tokenizer is used"),
        Flag(("--dataloader_num_workers", "--data.dataloader_num_workers"), (SFT, RM, DPO, PPO),
             why="no counterpart yet: data is prepared once, by data_prep"),
        Flag(("--eval_dataset", "--eval.dataset"), (PPO,), ("data.eval_prompts.paths",), Listed(),
             why="the held-out prompts of RL's evals and the eval stage, read with the prompts' keys"),
        Flag(("--eval_split", "--eval.split"), (PPO,), ("data.eval_prompts.split",), needs=("--eval_dataset", "--eval.dataset")),
        Flag(("--eval_dataset", "--eval.dataset"), TRAINING,
             why="no counterpart yet: a trainer's held-out rows come from its training source (data.*.eval_split or eval_ratio)"),
        Flag(("--eval_split", "--eval.split"), TRAINING, why="applies to --eval_dataset, which has no counterpart here"),
        Flag(("--pretrain_data", "--pretrain_data_probs", "--pretrain_split"), (PPO,), why="no counterpart yet: PPO-ptx"),
        Flag(("--image_key", "--data.image_key", "--max_images_per_prompt", "--data.max_images_per_prompt"), (PPO,), why=NO_VLM),
    )),
    ("Optimizer and schedule", (
        Flag(("--learning_rate", "--adam.lr"), TRAINING, ("{model}.lr",), Number()),
        Flag(("--actor_learning_rate", "--actor.adam.lr"), (PPO,), ("rl.actor.lr",), Number()),
        Flag(("--critic_learning_rate", "--critic.adam.lr"), (PPO,), ("rl.critic.lr",), Number()),
        Flag(("--lr_warmup_ratio",), ALL, ("{model}.warmup_ratio",), Number()),
        Flag(("--actor.lr_warmup_ratio",), (PPO,), ("rl.actor.warmup_ratio",), Number()),
        Flag(("--critic.lr_warmup_ratio",), (PPO,), ("rl.critic.warmup_ratio",), Number()),
        Flag(("--min_lr_ratio",), (SFT, RM, DPO), ("{model}.min_lr_ratio",), Number()),
        Flag(("--actor.min_lr_ratio",), (PPO,), ("rl.actor.min_lr_ratio",), Number()),
        Flag(("--critic.min_lr_ratio",), (PPO,), ("rl.critic.min_lr_ratio",), Number()),
        Flag(("--lr_scheduler",), ALL, ("{model}.lr_scheduler",), SCHEDULE),
        Flag(("--actor.lr_scheduler",), (PPO,), ("rl.actor.lr_scheduler",), SCHEDULE),
        Flag(("--critic.lr_scheduler",), (PPO,), ("rl.critic.lr_scheduler",), SCHEDULE),
        Flag(("--max_norm",), ALL, ("{model}.grad_clip",), Number()),
        Flag(("--actor.max_norm",), (PPO,), ("rl.actor.grad_clip",), Number()),
        Flag(("--critic.max_norm",), (PPO,), ("rl.critic.grad_clip",), Number()),
        Flag(("--l2", "--adam.weight_decay"), TRAINING, ("{model}.weight_decay",), Number()),
        Flag(("--l2",), (PPO,), ("{model}.weight_decay",), Number()),
        Flag(("--actor.adam.weight_decay",), (PPO,), ("rl.actor.weight_decay",), Number()),
        Flag(("--critic.adam.weight_decay",), (PPO,), ("rl.critic.weight_decay",), Number()),
        Flag(("--adam_betas", "--adam.betas"), TRAINING, ("{model}.adam_betas",), Pair()),
        Flag(("--adam_betas",), (PPO,), ("rl.actor.adam_betas", "rl.critic.adam_betas"), Pair(whole=True)),
        Flag(("--actor.adam.betas",), (PPO,), ("rl.actor.adam_betas",), Pair()),
        Flag(("--critic.adam.betas",), (PPO,), ("rl.critic.adam_betas",), Pair()),
        Flag(("--adam.eps",), TRAINING, why=EPS),
        Flag(("--actor.adam.eps", "--critic.adam.eps"), (PPO,), why=EPS),
        Flag(("--optim", "--muon.lr", "--muon.momentum", "--muon.nesterov", "--muon.no_nesterov", "--muon.ns_steps"),
             (SFT, RM, DPO), why=NO_MUON),
        Flag(("--actor.optim", "--actor.muon.lr", "--actor.muon.momentum", "--actor.muon.nesterov", "--actor.muon.no_nesterov",
              "--actor.muon.ns_steps", "--critic.optim", "--critic.muon.lr", "--critic.muon.momentum", "--critic.muon.nesterov",
              "--critic.muon.no_nesterov", "--critic.muon.ns_steps"), (PPO,), why=NO_MUON),
        Flag(("--aux_loss_coef", "--model.aux_loss_coef"), TRAINING, ("{model}.aux_loss_coef",), Number()),
        Flag(("--aux_loss_coef", "--actor.aux_loss_coef"), (PPO,), ("rl.actor.aux_loss_coef",), Number()),
        Flag(("--enable_ema", "--train.enable_ema"), (PPO,), ("rl.actor.ema_beta",), Switch(value=0.992),
             why="OpenRLHF's beta, unless --ema_beta gives one"),
        Flag(("--ema_beta", "--train.ema_beta"), (PPO,), ("rl.actor.ema_beta",), Number(), needs=("--enable_ema", "--train.enable_ema")),
    )),
    ("Batches, epochs and steps", (
        Flag(("--micro_train_batch_size", "--train.micro_batch_size"), TRAINING, ("{stage}.micro_batch_size",), Number(integer=True)),
        Flag(("--train_batch_size", "--train.batch_size"), TRAINING, ("{stage}.grad_accum_steps",), PerRank(),
             why="the global batch: accumulation steps = it / (micro batch x infra.num_workers)"),
        Flag(("--max_epochs", "--train.max_epochs"), (SFT,), ("{stage}.epochs",), Number(integer=True), absent=2),
        Flag(("--max_epochs", "--train.max_epochs"), (RM, PRM, DPO, KTO, KD), ("{stage}.epochs",), Number(integer=True)),
        Flag(("--save_steps", "--ckpt.save_steps"), ALL, ("{stage}.save_every",),
             Number(integer=True, positive="-1: OpenRLHF saves at the end only; the pipeline checkpoints every save_every steps")),
        Flag(("--eval_steps", "--eval.steps"), ALL, ("{stage}.eval_every",),
             Number(integer=True, positive="-1: OpenRLHF evaluates at the end only; the pipeline evaluates every eval_every steps")),
        Flag(("--logging_steps", "--logger.logging_steps"), ALL, why="metrics are logged to MLflow every step"),
        Flag(("--use_dynamic_batch", "--train_max_tokens_per_gpu", "--rollout_max_tokens_per_gpu", "--train.dynamic_batch_enable",
              "--train.max_tokens_per_gpu", "--rollout.max_tokens_per_gpu"), (PPO,), why=NO_DYNAMIC_BATCH),
        Flag(("--packing_samples", "--ds.packing_samples"), (SFT, RM, PRM, DPO, PPO), ("{stage}.packing",), Switch()),
    )),
    ("LoRA", (
        Flag(("--lora_rank", "--ds.lora.rank"), ALL, ("{model}.lora.rank",), Number(integer=True)),
        Flag(("--lora_alpha", "--ds.lora.alpha"), ALL, ("{model}.lora.alpha",), Number(integer=True)),
        Flag(("--lora_dropout", "--ds.lora.dropout"), ALL, ("{model}.lora.dropout",), Number()),
        Flag(("--target_modules", "--ds.lora.target_modules"), ALL, ("{model}.lora.target_modules",), Words(single="all-linear")),
    )),
    ("Reward models, PRM, DPO, KTO and KD", (
        Flag(("--value_head_prefix", "--ds.value_head_prefix"), (RM,), ("rm.value_head_prefix",)),
        Flag(("--value_prefix_head",), (RM,), ("rm.value_head_prefix",), why=readme("--value_head_prefix")),
        Flag(("--value_head_prefix", "--ds.value_head_prefix"), (PPO,),
             why="a reward model's checkpoint names its own head (config.json value_head_prefix)"),
        Flag(("--loss", "--model.loss_type"), (RM,), (),
             Choice({"sigmoid": Why("the Bradley-Terry sigmoid loss is ours"),
                         "logexpwithlogit": Why("no counterpart yet: only the sigmoid loss")})),
        Flag(("--margin_loss", "--model.margin_loss_enable"), (RM,), ("data.preference.margin_key",), Switch(value="margin"),
             why="the margin column, named margin as OpenRLHF reads it"),
        Flag(("--compute_fp32_loss", "--model.compute_fp32_loss_enable"), (RM,), why=NOT_YET),
        Flag(("--placeholder_token",), (PRM,), ("prm.placeholder_token",)),
        Flag(("--reward_tokens",), (PRM,), ("prm.reward_tokens",), Words(count=2)),
        Flag(("--beta", "--model.beta"), (DPO,), ("dpo.beta",), Number()),
        Flag(("--beta",), (KTO,), ("dpo.beta",), Number(), absent=0.01),
        Flag(("--ipo", "--model.ipo_enable"), (DPO,), ("dpo.loss",), Switch(value="ipo")),
        Flag(("--label_smoothing", "--model.label_smoothing"), (DPO,), ("dpo.label_smoothing",), Number(),
             why="cDPO: with the sigmoid loss"),
        Flag(("--nll_loss_coef", "--model.nll_loss_coef"), (DPO,), ("dpo.nll_loss_coef",), Number()),
        Flag(("--desirable_loss_weight",), (KTO,), ("dpo.desirable_weight",), Number()),
        Flag(("--undesirable_loss_weight",), (KTO,), ("dpo.undesirable_weight",), Number()),
        Flag(("--ref_pretrain", "--ref.model_name_or_path"), (DPO,),
             why="the reference is the policy's starting weights (the SFT model)"),
        Flag(("--ref_offload", "--ref.offload"), (DPO, KTO),
             why="the reference's log-probs are computed before the policy loads, and the reference is freed then: it is "
                 "never on the device beside the policy"),
        Flag(("--pretrain_mode", "--model.pretrain_mode_enable"), (SFT,), ("sft.pretrain_mode",), Switch()),
        Flag(("--pretrain_mode",), (KD,), why="no counterpart yet: the student learns the SFT rows' responses"),
        Flag(("--teacher_model",), (KD,), ("kd.teacher_path",), also={"kd.teacher": "path"},
             why="a checkpoint with the student's tokenizer and vocabulary"),
        Flag(("--kd_coef",), (KD,), ("kd.kd_coef",), Number()),
        Flag(("--teacher_offload",), (KD,), why="no counterpart yet: the frozen teacher stays on each rank's device"),
    )),
    ("RL: models and placement", (
        Flag(("--actor_num_nodes", "--actor.num_nodes"), (PPO,), ("rl.actor.num_workers",), Factor(default=1),
             why="nodes x GPUs per node"),
        Flag(("--actor_num_gpus_per_node", "--actor.num_gpus_per_node"), (PPO,), ("rl.actor.num_workers",), Factor(default=8),
             why="nodes x GPUs per node"),
        Flag(("--critic_num_nodes", "--critic.num_nodes"), (PPO,), ("rl.critic.num_workers",), Factor(default=1),
             why="nodes x GPUs per node"),
        Flag(("--critic_num_gpus_per_node", "--critic.num_gpus_per_node"), (PPO,), ("rl.critic.num_workers",), Factor(default=8),
             why="nodes x GPUs per node"),
        Flag(("--ref_num_nodes", "--ref.num_nodes"), (PPO,), ("rl.placement.ref_num_workers",), Factor(default=1),
             why="nodes x GPUs per node"),
        Flag(("--ref_num_gpus_per_node", "--ref.num_gpus_per_node"), (PPO,), ("rl.placement.ref_num_workers",), Factor(default=8),
             why="nodes x GPUs per node"),
        Flag(("--reward_num_nodes", "--reward.num_nodes"), (PPO,), ("rl.placement.reward_num_workers",), Factor(default=1),
             why="nodes x GPUs per node"),
        Flag(("--reward_num_gpus_per_node", "--reward.num_gpus_per_node"), (PPO,), ("rl.placement.reward_num_workers",),
             Factor(default=8), why="nodes x GPUs per node"),
        Flag(("--colocate_actor_ref", "--train.colocate_actor_ref"), (PPO,), ("rl.placement.colocate_actor_ref",), Switch()),
        Flag(("--colocate_critic_reward", "--train.colocate_critic_reward"), (PPO,), ("rl.placement.colocate_critic_reward",), Switch()),
        Flag(("--colocate_all_models", "--train.colocate_all"), (PPO,), ("rl.placement.colocate_all",), Switch()),
        Flag(("--critic_pretrain", "--critic.model_name_or_path"), (PPO,), ("rl.critic.init_from", "rl.critic.init_path"),
             CriticStart(), why="a reward model's backbone and value head; without the flag OpenRLHF starts a gae critic "
                                "from the reward model, ours from the SFT model: the converter writes OpenRLHF's"),
        Flag(("--ref_reward_offload",), (PPO,), ("rl.placement.ref_offload", "rl.placement.reward_offload"), Switch()),
        Flag(("--ref.offload",), (PPO,), ("rl.placement.ref_offload",), Switch()),
        Flag(("--reward.offload",), (PPO,), ("rl.placement.reward_offload",), Switch()),
        Flag(("--actor_init_on_gpu",), (PPO,), why=NOT_YET),
        Flag(("--deepspeed_enable_sleep", "--ds.enable_sleep"), (PPO,), why=NO_SLEEP),
        Flag(("--save_value_network", "--critic.save_value_network"), (PPO,), ("rl.critic.save_value_network",), Switch(),
             why="the rl stage's critic_model output"),
        Flag(("--freezing_actor_steps", "--critic.freezing_steps"), (PPO,), ("rl.critic.freezing_steps",), Number(integer=True)),
        Flag(("--freeze_visual_encoder", "--actor.freeze_visual_encoder"), (PPO,), why=NO_VLM),
    )),
    ("RL: rollout", (
        Flag(("--vllm_num_engines", "--vllm.num_engines"), (PPO,), ("rl.rollout.num_engines",),
             Number(integer=True, positive="0: no vLLM engines"), also={"rl.rollout.engine": "vllm"},
             why="vLLM from `rlhf vllm-env`; engine hf: HF generate"),
        Flag(("--vllm_tensor_parallel_size", "--vllm.tensor_parallel_size"), (PPO,),
             why="no counterpart yet: each rollout engine is one worker (no tensor parallelism)"),
        Flag(("--vllm_gpu_memory_utilization", "--vllm.gpu_memory_utilization"), (PPO,), ("rl.rollout.vllm_gpu_memory_utilization",),
             Number()),
        Flag(("--enable_prefix_caching", "--vllm.enable_prefix_caching"), (PPO,), ("rl.rollout.enable_prefix_caching",), Switch()),
        Flag(("--vllm_sync_backend", "--vllm.sync_backend"), (PPO,), ("rl.rollout.weight_sync",),
             Choice({"nccl": "broadcast", "gloo": "broadcast"}), why="a broadcast over NCCL on GPUs, gloo on CPUs"),
        Flag(("--vllm_sync_with_ray", "--vllm.sync_with_ray"), (PPO,), why="no counterpart yet: weights sync by rl.rollout.weight_sync"),
        Flag(("--enforce_eager", "--vllm.enforce_eager"), (PPO,), why="no counterpart yet: vLLM's own default"),
        Flag(("--vllm_enable_sleep", "--vllm.enable_sleep"), (PPO,), why=NO_SLEEP),
        Flag(("--vllm_generate_batch_size", "--rollout.vllm_generate_batch_size"), (PPO,),
             why="not supported: a draw is one step's prompts (dynamic filtering refills a step from fresh prompts, "
                 "rl.rollout.async_queue_size draws steps ahead)"),
        Flag(("--rollout_batch_size", "--rollout.batch_size"), (PPO,), ("rl.rollout.batch_size",), Number(integer=True), absent=1024),
        Flag(("--micro_rollout_batch_size", "--rollout.micro_batch_size"), (PPO,), ("rl.rollout.micro_batch_size",), Number(integer=True)),
        Flag(("--n_samples_per_prompt", "--rollout.n_samples_per_prompt"), (PPO,), ("rl.rollout.n_samples_per_prompt",),
             Number(integer=True), absent=1),
        Flag(("--micro_train_batch_size", "--train.micro_batch_size"), (PPO,), ("rl.micro_train_batch_size",), Number(integer=True),
             absent=1),
        Flag(("--train_batch_size", "--train.batch_size"), (PPO,), ("rl.train_batch_size",), Number(integer=True)),
        Flag(("--max_epochs", "--train.max_epochs"), (PPO,), ("rl.max_epochs",), Number(integer=True)),
        Flag(("--num_episodes", "--train.num_episodes"), (PPO,), ("rl.num_episodes",), Number(integer=True)),
        Flag(("--temperature", "--rollout.temperature"), (PPO,), ("rl.rollout.temperature",), Number()),
        Flag(("--top_p", "--rollout.top_p"), (PPO,), ("rl.rollout.top_p",), Number()),
        Flag(("--prompt_max_len",), (PPO,), ("rl.rollout.prompt_max_len",), Number(integer=True)),
        Flag(("--generate_max_len", "--max_new_tokens", "--rollout.max_new_tokens"), (PPO,), ("rl.rollout.generate_max_len",),
             Number(integer=True)),
        Flag(("--async_train", "--train.async_enable"), (PPO,), ("rl.rollout.async_train",), Switch()),
        Flag(("--async_queue_size", "--train.async_queue_size"), (PPO,), ("rl.rollout.async_queue_size",), Number(integer=True),
             why="steps drawn ahead, each launched before an update: staleness is that many updates, not timing's"),
        Flag(("--partial_rollout", "--train.partial_rollout_enable"), (PPO,),
             why="not supported: the weights reach an engine between two draws, never during one; "
                 "rl.rollout.async_queue_size sets the off-policyness"),
        Flag(("--agent_func_path", "--train.agent_func_path"), (PPO,), ("rl.agent.path",),
             why="an OpenRLHF agent file runs unchanged: AgentInstanceBase behind a MultiTurnAgentExecutor, or an "
                 "AgentExecutorBase with its own execute() (docs/algorithms.md#multi-turn-agents)"),
        Flag(("--eval_n_samples_per_prompt", "--eval.n_samples_per_prompt"), (PPO,), ("eval.samples_per_prompt",), Number(integer=True)),
        Flag(("--eval_temperature", "--eval.temperature"), (PPO,), ("eval.sample_temperature",), Number()),
        Flag(("--best_metric_key", "--ckpt.best_metric_key"), (PPO,), ("rl.best_metric",), MetricKey(),
             why="the best eval step's policy is the stage's output (OpenRLHF keeps its checkpoint beside the last step's)"),
    )),
    ("RL: algorithm", (
        Flag(("--advantage_estimator", "--algo.advantage.estimator"), (PPO,), ("rl.algorithm.advantage_estimator",),
             Choice({name: name for name in ("gae", "reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo")}),
             absent="gae"),
        Flag(("--gamma", "--algo.advantage.gamma"), (PPO,), ("rl.algorithm.gamma",), Number()),
        Flag(("--lambd", "--algo.advantage.lambd"), (PPO,), ("rl.algorithm.lambd",), Number()),
        Flag(("--no_advantage_std_norm", "--algo.advantage.no_std_norm"), (PPO,), ("rl.algorithm.advantage_std_norm",), Switch(value=False)),
        Flag(("--init_kl_coef", "--algo.kl.init_coef"), (PPO,), ("rl.algorithm.init_kl_coef",), Number()),
        Flag(("--kl_target", "--algo.kl.target"), (PPO,), ("rl.algorithm.kl_target",), Number()),
        Flag(("--kl_horizon", "--algo.kl.horizon"), (PPO,), ("rl.algorithm.kl_horizon",), Number(integer=True)),
        Flag(("--use_kl_loss", "--algo.kl.use_loss"), (PPO,), ("rl.algorithm.use_kl_loss",), Switch()),
        Flag(("--kl_estimator", "--algo.kl.estimator"), (PPO,), ("rl.algorithm.kl_estimator",), Choice({k: k for k in ("k1", "k2", "k3")})),
        Flag(("--use_kl_estimator_k3",), (PPO,), ("rl.algorithm.kl_estimator",), Switch(value="k3")),
        Flag(("--eps_clip", "--actor.eps_clip"), (PPO,), ("rl.algorithm.eps_clip_low", "rl.algorithm.eps_clip_high"), Number()),
        Flag(("--eps_clip_low_high", "--actor.eps_clip_low_high"), (PPO,), ("rl.algorithm.eps_clip_low", "rl.algorithm.eps_clip_high"),
             Pair()),
        Flag(("--dual_clip", "--actor.dual_clip"), (PPO,), ("rl.algorithm.dual_clip",), Number()),
        Flag(("--value_clip", "--critic.value_clip"), (PPO,), ("rl.algorithm.value_clip",), Number()),
        Flag(("--entropy_loss_coef", "--actor.entropy_coef"), (PPO,), ("rl.algorithm.entropy_coef",), Number()),
        Flag(("--dynamic_filtering", "--algo.dynamic_filtering_enable"), (PPO,), ("rl.algorithm.dynamic_filtering",), Switch()),
        Flag(("--dynamic_filtering_reward_range", "--algo.dynamic_filtering_range"), (PPO,),
             ("rl.algorithm.dynamic_filtering_range",), Pair(), needs=("--dynamic_filtering", "--algo.dynamic_filtering_enable")),
        Flag(("--enable_vllm_is_correction",), (PPO,), ("rl.algorithm.rollout_is_cap",), Switch(value=2.0),
             why="truncated importance weights, capped at OpenRLHF's threshold (2 unless given)"),
        Flag(("--algo.advantage.is_correction_enable",), (PPO,), ("rl.algorithm.rollout_is_cap",), Switch(value=5.0),
             also={"rl.algorithm.rollout_is_floor": 0.5},
             why="importance weights within OpenRLHF's threshold (0.5 to 5 unless given)"),
        Flag(("--vllm_is_truncated_threshold",), (PPO,), ("rl.algorithm.rollout_is_cap",), Number(),
             needs=("--enable_vllm_is_correction",)),
        Flag(("--algo.advantage.is_correction_threshold",), (PPO,), ("rl.algorithm.rollout_is_floor", "rl.algorithm.rollout_is_cap"),
             Pair(), needs=("--algo.advantage.is_correction_enable",)),
        Flag(("--vllm_is_correction_type", "--algo.advantage.is_correction_type"), (PPO,), ("rl.algorithm.rollout_is_type",),
             Choice({"tis": "tis", "icepop": "icepop", "seq-mask-tis": "seq-mask-tis"})),
        Flag(("--use_icepop",), (PPO,), ("rl.algorithm.rollout_is_type",), Switch(value="icepop")),
        Flag(("--policy_loss_type", "--actor.policy_loss_type"), (PPO,), ("rl.algorithm.policy_loss_type",),
             Choice({"ppo": "ppo", "gspo": "gspo"})),
        Flag(("--ptx_coef",), (PPO,), why="no counterpart yet: PPO-ptx"),
        Flag(("--perf",), (PPO,), why="not supported"),
    )),
    ("RL: reward", (
        Flag(("--reward_pretrain", "--reward.model_name_or_path"), (PPO,), ("reward.source", "inputs.reward_model", "reward.rm_paths"),
             RewardModel()),
        Flag(("--remote_rm_url", "--reward.remote_url"), (PPO,), ("reward.source", "reward.url", "reward.func_path"), RewardUrl()),
        Flag(("--normalize_reward", "--reward.normalize_enable"), (PPO,), ("reward.normalize",), Switch(),
             needs=("--reward_pretrain", "--reward.model_name_or_path"),
             why="with the mean and std the RM's config.json stores (OpenRLHF's mean and std)"),
        Flag(("--reward_clip_range", "--reward.clip_range"), (PPO,), ("rl.algorithm.reward_clip",), Symmetric()),
        Flag(("--overlong_buffer_len", "--reward.overlong_buffer_len"), (PPO,), ("rl.algorithm.overlong_buffer_len",), Number(integer=True)),
        Flag(("--overlong_penalty_factor", "--reward.overlong_penalty_factor"), (PPO,), ("rl.algorithm.overlong_penalty_factor",), Number()),
        Flag(("--stop_properly_penalty_coef", "--reward.stop_properly_penalty_coef"), (PPO,),
             ("rl.algorithm.stop_properly_penalty_coef",), Number()),
    )),
    ("Checkpoints, logging and the launcher", (
        Flag(("--save_path", "--ckpt.output_dir"), ALL, why=CHECKPOINTS),
        Flag(("--ckpt_path", "--ckpt.path"), ALL, why=CHECKPOINTS),
        Flag(("--save_hf_ckpt", "--ckpt.save_hf"), ALL, why="every checkpoint the pipeline publishes is a Hugging Face one"),
        Flag(("--disable_ds_ckpt", "--ckpt.disable_ds"), ALL, why=CHECKPOINTS),
        Flag(("--max_ckpt_num", "--ckpt.max_num"), ALL, ("{stage}.max_checkpoints",),
             Number(integer=True, positive="0 or less: OpenRLHF keeps the newest checkpoint only, as the default 1 does"), absent=3),
        Flag(("--max_ckpt_mem", "--ckpt.max_mem"), ALL, why="no counterpart yet: checkpoints are counted ({stage}.max_checkpoints), not sized"),
        Flag(("--load_checkpoint", "--ckpt.load_enable"), ALL, why=CHECKPOINTS),
        Flag(("--use_ds_universal_ckpt", "--universal_ckpt", "--ds.use_universal_ckpt"), ALL, why=CHECKPOINTS),
        Flag(("--use_wandb", "--wandb_org", "--wandb_group", "--wandb_project", "--wandb_run_name", "--logger.wandb.key",
              "--logger.wandb.org", "--logger.wandb.group", "--logger.wandb.project", "--logger.wandb.run_name"), ALL, why=MLFLOW),
        Flag(("--use_tensorboard", "--logger.tensorboard_dir"), ALL, why=MLFLOW),
    )),
)

ROWS: tuple[Flag, ...] = tuple(row for _, rows in GROUPS for row in rows)


def _index() -> dict[tuple[str, str], Flag]:
    index: dict[tuple[str, str], Flag] = {}
    for row in ROWS:
        for trainer in row.trainers:
            for name in row.names:
                if "." in name and trainer not in NESTED:
                    continue  # OpenRLHF had dropped the other trainers when its flags became nested
                if (trainer, name) in index:
                    raise ValueError(f"{name} is in two rows for {trainer}")
                index[trainer, name] = row
    return index


INDEX = _index()


def row_for(trainer: str, flag: str) -> Flag | None:
    """The row of `flag` as `trainer` takes it; None: the trainer has no such flag."""
    return INDEX.get((trainer, flag))
