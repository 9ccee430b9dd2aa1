"""The typed schema of a pipeline config: one section per stage plus model, data, infra, tracking, seed.

Every section forbids unknown keys, so a typo fails at load time instead of being ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from configs.dpo_objectives import DPO_OBJECTIVES
from configs.estimators import ESTIMATORS, Estimator, LossAggregation
from configs.reward_sources import REWARD_SOURCES, consumed_model


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def section_type(annotation: Any) -> type[BaseModel] | None:
    """The section class a field holds (`DatasetConfig | None` holds `DatasetConfig`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := section_type(arg)) is not None:
            return found
    return None


class TinyArchitecture(Section):
    """A small Llama-style model built from scratch; the keys are transformers' `LlamaConfig` fields."""

    hidden_size: int = Field(128, gt=0)
    intermediate_size: int = Field(384, gt=0)
    num_hidden_layers: int = Field(4, gt=0)
    num_attention_heads: int = Field(4, gt=0)
    num_key_value_heads: int = Field(4, gt=0)
    max_position_embeddings: int = Field(128, gt=0)


class TinyModelConfig(TinyArchitecture):
    """A small Llama-style model built from scratch (used when `model.name_or_path` is empty); the keys are
    transformers' `LlamaConfig` fields."""

    vocab_size: int = Field(96, gt=0, description="target size of the BPE tokenizer trained on the task")


class ModelConfig(Section):
    name_or_path: str | None = Field(None, description="hub id or local HF checkpoint; empty: the tiny model, built for a "
                                     "config based on the tiny preset (base: tiny); a config of data files must name one")
    tiny: TinyModelConfig = TinyModelConfig()
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = Field(
        "auto", description="auto: flash_attention_2 on a CUDA GPU with flash-attn installed, else PyTorch sdpa")
    trust_remote_code: bool = Field(False, description="run the model repository's own modelling code (transformers' trust_remote_code)")
    use_liger_kernel: bool = Field(False, description="Liger's Triton kernels (RMSNorm, rotary embeddings, SwiGLU) in every "
                                                      "causal LM a stage trains or runs (OpenRLHF's --ds.use_liger_kernel); "
                                                      "needs a CUDA GPU and liger-kernel (the gpu extra)")


class SyntheticTaskConfig(Section):
    """Multi-step arithmetic ("Compute 17+5-8") with worked, checkable answers."""

    num_train: int = Field(4000, gt=0, description="training problems: the SFT rows, preference pairs and PRM rows")
    num_eval: int = Field(200, gt=0, description="held-out problems: every dataset's eval split and eval's prompts")
    num_prompts: int = Field(1000, gt=0, description="RL prompts (with answers as labels)")
    min_terms: int = Field(2, ge=2, description="fewest numbers in a problem")
    max_terms: int = Field(3, ge=2, description="most numbers in a problem")
    max_operand: int = Field(20, gt=1, description="largest number in a problem")
    flawed_share: float = Field(0.25, ge=0.0, lt=1.0, description="share of SFT solutions with an arithmetic slip")
    min_slip: int = Field(1, gt=0, description="smallest error a flawed step makes")
    max_slip: int = Field(2, gt=0, description="largest error a flawed step makes")
    two_turn_share: float = Field(0.0, ge=0.0, lt=1.0, description="share of SFT rows written as two turns: the "
                                  "problem's first operation, then the whole problem with its first step given (the "
                                  "turns of the agents/chained_arithmetic.py environment)")

    @model_validator(mode="after")
    def _ranges_ordered(self) -> SyntheticTaskConfig:
        if self.min_terms > self.max_terms:
            raise ValueError(f"min_terms ({self.min_terms}) must not exceed max_terms ({self.max_terms})")
        if self.min_slip > self.max_slip:
            raise ValueError(f"min_slip ({self.min_slip}) must not exceed max_slip ({self.max_slip})")
        return self


class DatasetConfig(Section):
    """A dataset read from files or the hub, mapped onto the pipeline's columns (OpenRLHF key names)."""

    paths: list[str] = Field(min_length=1, description="hub names, .json/.jsonl/.parquet/.csv files, json@DIR or save_to_disk folders")
    probs: list[float] | None = Field(None, description="mixing probabilities, one per path")
    subset: str | None = Field(None, description="the hub dataset's config name, e.g. main for openai/gsm8k")
    split: str = Field("train", description="the split read for training")
    eval_split: str | None = Field(None, description="a split of the same source used for eval")
    eval_ratio: float = Field(0.05, ge=0.0, lt=1.0, description="held-out share when eval_split is unset")
    eval_min_rows: int = Field(100, ge=0, description="with eval_ratio: hold out at least this many rows (shared by the "
                                                      "paths; never more than a fifth of a source)")
    max_samples: int | None = Field(None, gt=0, description="rows taken from each source; empty: all")
    input_key: str = Field("input", description="the prompt column: text or a chat list (with multiturn, the whole conversation)")
    output_key: str = Field("output", description="SFT: the response column")
    chosen_key: str = Field("chosen", description="preference: the preferred response's column")
    rejected_key: str = Field("rejected", description="preference: the other response's column")
    margin_key: str | None = Field(None, description="preference: a column of margins the RM loss subtracts; empty: 0")
    label_key: str = Field("label", description="prompts: the column passed to the reward as the label (e.g. the answer)")
    label_pattern: str | None = Field(None, description=r"regex whose first group, last match, is the reference answer in the label "
                                                        r"column, e.g. '####\s*(-?[\d,.]+)' for GSM8K")
    apply_chat_template: bool = Field(True, description="render prompts with the tokenizer's chat template")
    input_template: str | None = Field(None, description='e.g. "User: {}\\nAssistant: " when not using the chat template')
    multiturn: bool = Field(False, description="input_key holds a whole conversation; every assistant turn is trained")
    unpaired: bool = Field(False, description="preference: rows of one response each (output_key) and a boolean label_key, "
                                              "desirable or not, for dpo.loss=kto (OpenRLHF's train_kto data); no rm stage")

    @model_validator(mode="after")
    def _probs_match(self) -> DatasetConfig:
        if self.probs is not None:
            if len(self.probs) != len(self.paths):
                raise ValueError(f"probs has {len(self.probs)} entries for {len(self.paths)} paths")
            if any(p <= 0 for p in self.probs):
                raise ValueError("probs must all be positive")
        if self.input_template is not None and "{}" not in self.input_template:
            raise ValueError("input_template must contain {} where the prompt goes")
        if self.label_pattern is not None:
            try:
                groups = re.compile(self.label_pattern).groups
            except re.error as exc:
                raise ValueError(f"label_pattern is not a regex ({exc})") from None
            if groups < 1:
                raise ValueError("label_pattern needs a group around the answer, e.g. '####\\s*(-?[\\d,.]+)'")
        return self


# DataConfig's dataset sections (data.source: files), each a DatasetConfig
FILE_DATASETS = ("sft", "preference", "prompts", "prm", "eval_prompts")


class DataConfig(Section):
    source: Literal["synthetic", "files"] = Field("synthetic", description="synthetic: the arithmetic task; files: the "
                                                                       "sft, preference and prompts datasets")
    synthetic: SyntheticTaskConfig = SyntheticTaskConfig()
    sft: DatasetConfig | None = Field(None, description="files: SFT rows (prompt, response); empty: a config that pins "
                                                       "inputs.sft_model (OpenRLHF's PPO, RM and DPO start from one) "
                                                       "and runs no other stage that trains on them")
    preference: DatasetConfig | None = Field(None, description="files: preference pairs for rm and dpo; empty: both skipped")
    prompts: DatasetConfig | None = Field(None, description="files: RL prompts with labels; eval's held-out prompts come from its eval split")
    prm: DatasetConfig | None = Field(None, description="files: PRM rows (Math-Shepherd's format): input_key the text with "
                                                        "prm.placeholder_token ending each step, label_key one of "
                                                        "prm.reward_tokens per step; empty: no prm stage")
    eval_prompts: DatasetConfig | None = Field(
        None, description="files: held-out prompts with labels from a dataset of their own, every row of its `split`, for "
                          "RL's periodic evals and the eval stage (OpenRLHF's --eval.dataset, --eval.split); data.prompts "
                          "then trains on all its rows; empty: data.prompts' eval split or eval_ratio share")
    tokenizer_chat_template: str | None = Field(
        None, description="a Jinja chat template (or a file holding one) that replaces the tokenizer's for every dataset and "
                          "is saved with the base model's tokenizer (OpenRLHF's --tokenizer_chat_template)")
    max_len: int = Field(2048, gt=0, description="longest row in tokens (OpenRLHF's --max_len); a longer row is dropped "
                                                 "and counted (rows/<set>/<split>/dropped), or with strict_lengths an error")
    strict_lengths: bool = Field(False, description="a row longer than max_len is an error naming its file and line, "
                                                    "not dropped")
    num_proc: int | None = Field(None, gt=0, description="processes that render and tokenize data prep's rows (HF "
                                                         "datasets' num_proc); empty: the cores data prep's worker has. "
                                                         "Sets of under 10,000 rows use one")

    @model_validator(mode="after")
    def _files_need_prompts(self) -> DataConfig:
        if self.source == "files" and self.prompts is None:
            raise ValueError("source: files needs at least data.prompts (and data.sft, unless inputs.sft_model is pinned)")
        if self.source != "files" and self.eval_prompts is not None:
            raise ValueError("data.eval_prompts is a file dataset: set data.source: files, or leave it empty (the synthetic "
                             "task makes its own held-out prompts)")
        for name in FILE_DATASETS:
            if name != "preference" and (section := getattr(self, name)) is not None and section.unpaired:
                raise ValueError(f"data.{name}.unpaired: only preference rows may be unpaired (data.preference.unpaired)")
        if self.prm is not None:
            # a PRM row is one text, read as written: the labels follow its placeholders
            for key in ("multiturn", "input_template"):
                if getattr(self.prm, key):
                    raise ValueError(f"data.prm.{key}: PRM rows are one text each, read as written (no template)")
        if self.tokenizer_chat_template is not None and not self.tokenizer_chat_template.strip():
            raise ValueError("data.tokenizer_chat_template is empty: give a Jinja template or a file holding one")
        return self


class InfraConfig(Section):
    ray_address: str | None = Field(None, description="a running Ray cluster; empty starts a local one (RAY_ADDRESS overrides)")
    num_cpus: int | None = Field(None, gt=0, description="CPUs of the local Ray cluster (default: all)")
    num_workers: int = Field(1, gt=0, description="data-parallel training workers per stage")
    cpus_per_worker: int = Field(2, gt=0, description="CPUs of each worker's bundle (training rank, RL actor)")
    gpus_per_worker: float = Field(0.0, ge=0.0, description="GPUs of each worker's bundle; 0: CPU only")
    # placement only: results do not depend on it, so no stage's fingerprint reads it
    worker_resources: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="custom Ray resources added to every worker's bundle, e.g. {worker_node: 1}: "
        "stage work runs only on nodes started with them (ray start --resources)")
    zero_stage: Literal[0, 1, 2, 3] = Field(2, description="DeepSpeed ZeRO stage of every trained model")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="training and inference precision; auto: bf16 where a worker computes on a GPU with bf16, "
                            "fp32 on a CPU (OpenRLHF's examples train in bf16)")
    offload_optimizer: bool = Field(False, description="ZeRO-Offload: optimizer state and step on the CPU (OpenRLHF --adam_offload)")
    offload_params: bool = Field(False, description="ZeRO-3 parameter offload to the CPU (zero_stage 3 only)")
    overlap_comm: bool = Field(False, description="overlap gradient reduction with the backward pass")
    deterministic: bool = Field(False, description="the same bytes from the same config on the same machine, killed and "
                                "resumed or not: torch's deterministic algorithms, MKL_CBWR=AUTO,STRICT, cuBLAS's fixed "
                                "workspace (OpenRLHF --full_determinism; its cost: docs/benchmarks.md)")
    # a stage that fails on a transient fault (a Ray worker or node lost, the tracking server not
    # answering) is rerun, resuming from its last checkpoint; other errors fail at once
    retries: int = Field(2, ge=0, description="reruns of a stage after a transient fault")
    retry_delay_s: float = Field(10.0, ge=0.0, description="wait before the first rerun; doubles each time")
    node_wait_s: float = Field(0.0, ge=0.0, description="how long a stage waits for the cluster to have the nodes "
                               "it needs (a lost node coming back) before it fails; 0: fail at once")
    stage_retries: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict, description="per-stage retries, e.g. {rl: 4}")


    @model_validator(mode="after")
    def _offload_needs_zero(self) -> InfraConfig:
        if self.offload_params and self.zero_stage != 3:
            raise ValueError(f"offload_params needs zero_stage: 3 (got {self.zero_stage})")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage 1, 2 or 3")
        return self


class TrackingConfig(Section):
    state_dir: str = Field(".rlhf", description="project-local folder for the MLflow store, downloads and stage work dirs")
    uri: str | None = Field(None, description="MLflow tracking URI; default: SQLite under state_dir (MLFLOW_TRACKING_URI overrides)")
    experiment: str = Field("rlhf-pipeline", description="MLflow experiment holding the pipeline's runs")
    system_metrics: bool = Field(True, description="log MLflow's system metrics (CPU, memory, disk, network, GPU) of "
                                                   "the pipeline's host to each stage run while it runs")


class LoRAConfig(Section):
    """Low-rank adapters (peft). `rank: 0` trains the whole model; above 0 the stage trains and saves
    only the adapter, which records the path of the checkpoint it was trained on."""

    rank: int = Field(0, ge=0, description="adapter rank r; 0: no adapter, the whole model trains")
    alpha: int = Field(16, gt=0, description="scaling: the update is (alpha / rank) B A")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input")
    target_modules: list[str] | Literal["all-linear"] = Field("all-linear", description="module names to adapt, or every linear layer")
    load_in_4bit: bool = Field(False, description="QLoRA: the frozen base in 4-bit NF4 (bitsandbytes, CUDA only)")

    @model_validator(mode="after")
    def _qlora_needs_adapters(self) -> LoRAConfig:
        if self.load_in_4bit and not self.rank:
            raise ValueError("load_in_4bit (QLoRA) trains adapters on a frozen 4-bit base: set lora.rank > 0")
        return self


AUX_LOSS = "weight of an MoE model's router load-balancing loss added to the loss (OpenRLHF --aux_loss_coef); 0: none"
PACKING = ("forward passes over padding-free rows (the samples end to end, position ids restarting per sample): the padded "
           "batch's loss without the compute on pads; pays with flash_attention_2, slower with SDPA (attention over the whole row)")


MAX_CHECKPOINTS = ("resumable checkpoints kept in the work dir, the newest (OpenRLHF's --ckpt.max_num, 3 there): a rerun "
                   "resumes from the newest, the older ones are there to go back to by hand")


class OptimConfig(Section):
    """Optimizer (AdamW) and learning-rate schedule of one trained model. Each stage's default `lr` is the
    one OpenRLHF's example scripts use for a pretrained model; the tiny preset states its own."""

    lr: float = Field(5e-6, gt=0, description="peak learning rate (AdamW)")
    lr_scheduler: Literal["cosine_with_min_lr", "linear", "constant_with_warmup", "constant"] = Field(
        "cosine_with_min_lr", description="OpenRLHF's --lr_scheduler: linear warm-up, then cosine decay to min_lr_ratio, "
                                          "linear decay to 0, or a constant lr (constant: no warm-up either)")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="cosine decay floor as a share of lr (1.0 with no warm-up: constant)")
    warmup_ratio: float = Field(0.05, ge=0.0, lt=1.0, description="share of the steps spent warming the lr up linearly "
                                                                 "(OpenRLHF's --lr_warmup_ratio)")
    adam_betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW's betas (OpenRLHF's --adam_betas)")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW's decoupled weight decay")
    grad_clip: float = Field(1.0, gt=0, description="the gradients' global norm is clipped to this")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass to save memory")

    @field_validator("adam_betas")
    @classmethod
    def _betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"each of AdamW's betas must be in [0, 1), got {list(betas)}")
        return betas

    @property
    def constant_lr(self) -> bool:
        """The schedule keeps the lr at `lr` from the first step: no scheduler is built."""
        if self.lr_scheduler == "constant":
            return True
        return self.warmup_ratio == 0 and (self.lr_scheduler == "constant_with_warmup" or
                                           (self.lr_scheduler == "cosine_with_min_lr" and self.min_lr_ratio == 1))


class TrainingConfig(OptimConfig):
    """What every DeepSpeed training stage shares: optimizer, schedule, batching, eval and checkpoints."""

    epochs: int = Field(1, gt=0, description="passes over the training rows")
    max_steps: int | None = Field(None, gt=0, description="optimizer steps; overrides epochs")
    micro_batch_size: int = Field(32, gt=0, description="rows per rank per forward pass")
    grad_accum_steps: int = Field(1, gt=0, description="micro-batches per optimizer step")
    eval_every: int = Field(50, gt=0, description="optimizer steps between eval passes")
    save_every: int = Field(50, gt=0, description="optimizer steps between resumable checkpoints")
    max_checkpoints: int = Field(1, gt=0, description=MAX_CHECKPOINTS)
    aux_loss_coef: float = Field(0.0, ge=0.0, description=AUX_LOSS)


class AdapterTrainingConfig(TrainingConfig):
    """A training stage that can train LoRA adapters instead of the whole model (sft, rm, prm, dpo); rs, kd and
    csft train whole models and have no `lora` section."""

    lora: LoRAConfig = LoRAConfig()


class SFTConfig(AdapterTrainingConfig):
    """Causal-LM loss on response tokens."""

    lr: float = Field(5e-6, gt=0)
    packing: bool = Field(False, description=PACKING)
    pretrain_mode: bool = Field(False, description="continued pre-training (OpenRLHF's --pretrain_mode): the loss on every "
                                                   "token of plain-text rows, data.sft.input_key only, no chat template "
                                                   "or output; a row over data.max_len is cut to it")


class RewardModelConfig(AdapterTrainingConfig):
    """Bradley-Terry reward model trained from the SFT checkpoint on preference pairs."""

    lr: float = Field(9e-6, gt=0)
    micro_batch_size: int = Field(16, gt=0, description="preference pairs per micro-batch")
    value_head_prefix: str = Field("score", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="name of the scalar head's weights "
                                   "in the checkpoint (OpenRLHF's value_head_prefix)")
    normalize_reward: bool = Field(False, description="scorers return (r - mean) / std with the eval-split statistics")
    packing: bool = Field(False, description=PACKING + "; each reward read at its own sample's last token")


class PRMConfig(AdapterTrainingConfig):
    """Process reward model: next-token CE over the reward tokens at each step placeholder."""

    lr: float = Field(1e-6, gt=0)
    placeholder_token: str = Field("<|step|>", description="ends every step; the reward is read there")
    reward_tokens: tuple[str, str] = Field(("+", "-"), description="the (good, bad) label tokens")
    step_separator: str = Field("\n", description="splits a response into steps when it has no placeholders")
    packing: bool = Field(False, description=PACKING)


class IterativeDPOConfig(Section):
    """Iterative (online) DPO: each round samples responses to fresh prompts from the current policy,
    ranks them with the reward scorer (the `reward` section) and trains on best-versus-worst pairs."""

    rounds: int = Field(0, ge=0, description="0: offline DPO on pref_data; N: N rounds sharing dpo.max_steps")
    prompts_per_round: int = Field(64, gt=0, description="fresh prompts sampled each round")
    samples_per_prompt: int = Field(4, ge=2, description="responses sampled per prompt; the best and the worst make a pair")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: the smallest set of tokens holding this much probability")
    max_new_tokens: int = Field(64, gt=0, description="most tokens sampled per response")
    generate_batch_size: int = Field(64, gt=0, description="sequences per generate call")


class DPOConfig(AdapterTrainingConfig):
    """Direct preference optimisation of the SFT policy against its frozen starting weights."""

    lr: float = Field(5e-7, gt=0)
    micro_batch_size: int = Field(16, gt=0, description="preference pairs (KTO: examples) per micro-batch")
    beta: float = Field(0.1, gt=0, description="strength of the KL anchor to the reference")
    loss: Annotated[str, DPO_OBJECTIVES] = Field("sigmoid", description=DPO_OBJECTIVES.described())
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5, description="cDPO: assumed probability that a pair's label is flipped")
    nll_loss_coef: float = Field(0.0, ge=0.0, description="weight of the chosen responses' NLL added to the loss")
    shared_prompt: bool = Field(True, description="pair losses: the responses of one prompt (a pair's two, and those of "
                                                  "any other pair of that prompt in the micro-batch) as one row, the "
                                                  "prompt computed once (a 4D attention mask; the same log-probs); with "
                                                  "flash_attention_2, which takes no such mask, two padded rows per pair")
    packing: bool = Field(False, description=PACKING + "; the policy's and the reference's passes alike (in place of "
                                                      "shared_prompt's rows)")
    desirable_weight: float = Field(1.0, gt=0, description="KTO: weight of desirable examples")
    undesirable_weight: float = Field(1.0, gt=0, description="KTO: weight of undesirable examples")
    iterative: IterativeDPOConfig = IterativeDPOConfig()

    @model_validator(mode="after")
    def _loss_options(self) -> DPOConfig:
        rounds = self.iterative.rounds
        if rounds and (self.max_steps is None or self.max_steps < rounds):
            raise ValueError(f"iterative.rounds={rounds} splits max_steps between the rounds: set max_steps >= {rounds}")
        for objective in DPO_OBJECTIVES.values():
            if objective.name != self.loss and any(getattr(self, key) != DPOConfig.model_fields[key].default
                                                   for key in objective.options):
                keys = " / ".join(objective.options)
                raise ValueError(f"{keys} {'needs' if len(objective.options) == 1 else 'need'} loss: "
                                 f"{objective.name}, not {self.loss}")
        return self


class RejectionSamplingConfig(TrainingConfig):
    """Rejection sampling (best-of-n), OpenRLHF's `train_rejection_sampling` loop: each round samples
    `samples_per_prompt` responses to `prompts_per_round` fresh prompts with the current policy (the SFT
    policy in the first round), scores them with the `reward` section's source, keeps each prompt's best
    response when its reward reaches `threshold`, and fine-tunes the policy on the kept responses with
    the SFT loss (`epochs` passes, or `max_steps` optimizer steps, per round; a fresh optimizer and
    schedule each round, as OpenRLHF's loop starts a new SFT run)."""

    enabled: bool = Field(False, description="run the rs stage: rs_model, scored beside the other policies by eval")
    lr: float = Field(5e-6, gt=0)
    max_steps: int | None = Field(None, gt=0, description="optimizer steps per round; overrides epochs")
    rounds: int = Field(1, gt=0, description="generate -> reward -> filter -> train rounds, each from the last one's policy")
    prompts_per_round: int = Field(256, gt=0, description="fresh prompts sampled each round")
    samples_per_prompt: int = Field(4, gt=0, description="responses sampled per prompt (the n of best-of-n)")
    threshold: float | None = Field(None, allow_inf_nan=False, description="a prompt's best response is kept only when "
                                    "its reward is at least this; empty: every prompt's best is kept")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: the smallest set of tokens holding this much probability")
    max_new_tokens: int = Field(64, gt=0, description="most tokens sampled per response")
    generate_batch_size: int = Field(64, gt=0, description="sequences per generate call")


class TinyStudentConfig(TinyArchitecture):
    """The shape of a fresh distillation student (`kd.student: tiny`): by default half the tiny model's width
    and depth."""

    hidden_size: int = Field(64, gt=0)
    intermediate_size: int = Field(192, gt=0)
    num_hidden_layers: int = Field(2, gt=0)


class KDConfig(TrainingConfig):
    """Knowledge distillation, OpenRLHF's `train_kd`: a student trained on the SFT data with
    (1 - kd_coef) x its NLL plus kd_coef x the divergence between the teacher's and its own next-token
    distributions on the response tokens (the teacher frozen, in every rank)."""

    enabled: bool = Field(False, description="run the kd stage: kd_model, scored beside the other policies by eval")
    lr: float = Field(5e-6, gt=0)
    teacher: Literal["rl", "dpo", "path"] = Field("rl", description="the teacher: the pipeline's RL or DPO policy (pin "
                                                  "inputs.rl_model / inputs.dpo_model for another run's), or teacher_path")
    teacher_path: str | None = Field(None, description="teacher: path: a local HF checkpoint or hub id with the student's "
                                                       "tokenizer and vocabulary")
    student: Literal["sft", "tiny"] = Field("sft", description="sft: the SFT policy is the student; tiny: a fresh model "
                                                               "of student_tiny's shape with the SFT policy's tokenizer")
    student_tiny: TinyStudentConfig = TinyStudentConfig()
    kd_coef: float = Field(0.4, ge=0.0, le=1.0, description="weight of the divergence; the NLL gets 1 - kd_coef (OpenRLHF's kd_coef)")
    divergence: Literal["forward", "reverse"] = Field("forward", description="forward: KL(teacher || student), OpenRLHF's; "
                                                      "reverse: KL(student || teacher), MiniLLM's mode-seeking one, "
                                                      "token by token on the training sequences")

    @model_validator(mode="after")
    def _teacher_and_student(self) -> KDConfig:
        if (self.teacher == "path") != (self.teacher_path is not None):
            raise ValueError("teacher_path names the teacher exactly when teacher: path (set both, or neither)")
        if self.student != "tiny" and self.student_tiny != KDConfig.model_fields["student_tiny"].default:
            raise ValueError("student_tiny shapes a fresh student: it needs student: tiny")
        return self


class ConditionalSFTConfig(TrainingConfig):
    """Conditional SFT (arXiv:2308.12050, OpenRLHF's `csft` processor): the SFT data scored by a reward
    model (`reward.rm_paths`, else the pipeline's own), each prompt given its response's score through
    `template`, and the SFT policy fine-tuned on the result; at generation (the eval stage) the policy
    is prompted with `target_reward`."""

    enabled: bool = Field(False, description="run the csft stage: csft_model, scored beside the other policies by eval")
    lr: float = Field(5e-6, gt=0)
    template: str = Field("{prompt}<rm_score>: {reward}\n", description="how a prompt carries its score: {prompt} "
                          "(the rendered prompt) and {reward} (one decimal) replaced; OpenRLHF's default, after the prompt")
    normalize_reward: bool = Field(True, description="scores as z-scores over the training rows (OpenRLHF's "
                                                     "--normalize_reward); the eval split uses the same mean and std")
    target_reward: float = Field(1.0, allow_inf_nan=False, description="the score the policy is prompted with at "
                                 "generation (with normalize_reward: standard deviations above the training rows' mean)")

    @model_validator(mode="after")
    def _template(self) -> ConditionalSFTConfig:
        missing = [key for key in ("{prompt}", "{reward}") if key not in self.template]
        if missing:
            raise ValueError(f"template must contain {' and '.join(missing)}")
        return self


class RewardConfig(Section):
    """Where rewards come from for later stages (one scorer interface over all sources)."""

    source: Annotated[str, REWARD_SOURCES] = Field("func", description=REWARD_SOURCES.described())
    rm_paths: list[str] = Field(default_factory=list, description="RM checkpoints, combined by rm_combine; empty: the pipeline's own")
    rm_combine: Literal["sum", "mean"] = Field("sum", description="several RMs' rewards summed (OpenRLHF's, for several "
                                                                 "--reward.model_name_or_path) or averaged")
    normalize: bool | None = Field(None, description="each RM's rewards as (r - mean) / std with the statistics its "
                                                     "config.json stores (OpenRLHF's --reward.normalize_enable): ours as "
                                                     "reward_mean and reward_std, OpenRLHF's as mean and std; false: raw "
                                                     "rewards; empty: as the checkpoint's normalize_reward says (rm."
                                                     "normalize_reward when the pipeline trains it; false in OpenRLHF's)")
    prm_path: str | None = Field(None, description="PRM checkpoint; empty: the pipeline's own")
    prm_aggregate: Literal["min", "mean", "last"] = Field("min", description="how a PRM's step scores make a response's reward")
    func_path: str | None = Field(None, description="a file defining reward_func(queries, prompts, labels); relative paths are "
                                                    "tried from the working directory, then from configs/ (the tiny preset: "
                                                    "rewards/arithmetic.py); empty with source func: an error before any work")
    url: str | None = Field(None, description="remote reward server, e.g. http://127.0.0.1:5001/get_reward")
    timeout_s: float = Field(10.0, gt=0, description="func: longest an RL reward worker's reward_func call may take (one "
                                                     "batch); remote: longest each request may take")
    retries: int = Field(3, ge=0, description="remote: tries after the first, with backoff")
    batch_size: int = Field(32, gt=0, description="queries per forward pass (rm, prm) or per request (remote)")


class RLModelConfig(OptimConfig):
    """A trained RL model (policy or critic): its optimizer (constant lr by default) and its ranks."""

    lr: float = Field(5e-7, gt=0)
    min_lr_ratio: float = Field(1.0, ge=0.0, le=1.0)
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    num_workers: int = Field(1, gt=0, description="DeepSpeed ranks of this model's actor group")
    aux_loss_coef: float = Field(0.0, ge=0.0, description=AUX_LOSS + " (the policy's loss only)")
    lora: LoRAConfig = LoRAConfig()


class ActorConfig(RLModelConfig):
    """The policy: its optimizer (constant lr by default), its ranks, and the moving average of its weights."""

    ema_beta: float | None = Field(
        None, ge=0.0, le=1.0, description="keep a moving average of the policy's weights, from the SFT weights, moved "
                                          "after each optimizer step to beta x average + (1 - beta) x weights, and "
                                          "save it as the stage's output (OpenRLHF's --enable_ema, --ema_beta; its "
                                          "beta is 0.992); empty: off")


class CriticConfig(RLModelConfig):
    """The critic (advantage_estimator: gae): an RL model that may train alone first, start from a reward model
    and be kept."""

    freezing_steps: int = Field(0, ge=0, description="the first this many RL steps train the critic only, the policy "
                                                     "left as it is (OpenRLHF's --critic.freezing_steps)")
    init_from: Literal["sft", "reward_model", "path"] = Field(
        "sft", description="where the critic starts (OpenRLHF's --critic.model_name_or_path): sft, the SFT policy's "
                           "backbone with a fresh value head; reward_model, the pipeline's reward model (the rm stage's, or "
                           "inputs.reward_model), backbone and value head; path, the reward model at init_path. OpenRLHF "
                           "starts a PPO critic from its reward model when it scores with one; `rlhf from-openrlhf` writes that")
    init_path: str | None = Field(None, description="init_from: path: a reward-model checkpoint (an HF backbone with a "
                                                    "linear <value_head_prefix>.weight head, as the rm stage writes) with "
                                                    "the policy's tokenizer")
    save_value_network: bool = Field(False, description="keep the trained critic: the rl stage's critic_model output, an "
                                                        "HF checkpoint of its backbone and value head, registered as "
                                                        "rlhf-critic (OpenRLHF's --critic.save_value_network)")

    @model_validator(mode="after")
    def _start_and_save(self) -> CriticConfig:
        if (self.init_from == "path") != (self.init_path is not None):
            raise ValueError("rl.critic.init_path names the critic's starting checkpoint exactly when rl.critic.init_from: "
                             "path (set both, or neither)")
        if self.save_value_network and self.lora.load_in_4bit:
            raise ValueError("rl.critic.save_value_network saves the critic with its adapters merged, which a 4-bit base "
                             "(rl.critic.lora.load_in_4bit) cannot take: set one of them off")
        return self

    @property
    def keys_in_use(self) -> list[str]:
        """The keys set that act on a critic only (a config without one must leave them alone)."""
        keys = {"freezing_steps": self.freezing_steps, "init_from": self.init_from != "sft",
                "save_value_network": self.save_value_network}
        return [f"rl.critic.{key}" for key, on in keys.items() if on]


CPU_KV_CACHE_MIB = 512  # vLLM on CPU would otherwise reserve most of the RAM
# descriptions of the estimators' options, from their registry
UNGROUPED = ", ".join(e.name for e in ESTIMATORS.values() if not e.grouped)
WHITENED = ", ".join(e.name for e in ESTIMATORS.values() if e.whiten)
DEFAULT_AGGREGATIONS = ", ".join(
    [f"{e.aggregation} for {e.name}" for e in ESTIMATORS.values() if e.aggregation != "token_mean"] + ["token_mean otherwise"])


# async training's truncated importance-weight cap when rl.algorithm.rollout_is_cap is left empty (the stale samples'
# ratio of the trainer's to the engine's probabilities, capped as in truncated IS)
ASYNC_IS_CAP = 2.0


class RolloutConfig(Section):
    """How RL samples: the rollout engines and the sampling itself."""

    engine: Literal["auto", "hf", "vllm", "hybrid"] = Field(
        "auto", description="rollout engine: HF generate or vLLM, in Ray actors of their own; hybrid: each policy rank "
                            "samples with HF generate on its own training weights (no engine actors, no weight sync) "
                            "and holds the reference model (no reference actors); auto: hf where the cluster has "
                            "bundles for every actor group, else hybrid with colocate_all (hf with ZeRO-3)")
    weight_sync: Literal["broadcast", "object_store"] = Field(
        "broadcast", description="how the rollout engines get the policy's weights after each update: broadcast from the "
                                 "policy's rank 0 over a process group of their own (gloo on CPU, NCCL on GPU), "
                                 "parameter by parameter, into HF engines or vLLM's workers; object_store: a whole "
                                 "state dict through Ray's object store (also where the group cannot be formed)")
    num_engines: int = Field(1, gt=0, description="rollout engine actors (engine hf or vllm); each samples an equal share")
    vllm_python: str | None = Field(None, description="Python of the env holding vLLM (`rlhf vllm-env`); empty: the pipeline's own")
    vllm_gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of GPU memory a vLLM engine may take")
    vllm_kv_cache_mib: int | None = Field(None, gt=0, description="vLLM KV cache size; empty: set by vllm_gpu_memory_utilization on a GPU, "
                                                                  f"{CPU_KV_CACHE_MIB} MiB on CPU")
    enable_prefix_caching: bool = Field(False, description="vLLM reuses the KV cache of shared prompt prefixes")
    batch_size: int = Field(32, gt=0, description="prompts per rollout step (OpenRLHF's rollout_batch_size)")
    n_samples_per_prompt: int = Field(4, gt=0, description="responses sampled per prompt (a group)")
    micro_batch_size: int = Field(32, gt=0, description="sequences per forward pass while making experience "
                                                        "(OpenRLHF's micro_rollout_batch_size)")
    generate_batch_size: int | None = Field(None, gt=0, description="HF engine: prompts per generate call; empty: an engine's whole "
                                                                    "share in one call")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (the log-probs trained on are at it too)")
    top_p: float = Field(1.0, gt=0, le=1.0, description="nucleus sampling: the smallest set of tokens holding this much probability")
    prompt_max_len: int = Field(1024, gt=0, description="longest prompt in tokens; a longer one is an error")
    generate_max_len: int = Field(1024, gt=0, description="most tokens sampled per response")
    async_train: bool = Field(
        False, description="the rollout engines generate the next step's samples while the policy trains on this "
                           "step's (OpenRLHF's --async_train): those samples are one update stale, weighed by "
                           "rl.algorithm.rollout_is_cap; the weights still sync at each step's end. Needs engine actors on "
                           "bundles the policy does not share (engine hf or vllm, rl.placement.colocate_all false; "
                           "rl.placement.colocate_models keeps the rest on two bundles)")
    async_queue_size: int = Field(
        1, ge=1, description="with rl.rollout.async_train, how many steps ahead the engines draw (OpenRLHF's "
                             "--train.async_queue_size): step t's samples come from the weights up to this many updates "
                             "back (the log's rollout/staleness). The weights reach an engine between two draws, never "
                             "during one, so a longer queue adds staleness, not overlap: 1 already draws a whole step "
                             "while the policy trains on another")

    @property
    def size(self) -> int:
        """Sequences per rollout step: prompts x samples per prompt."""
        return self.batch_size * self.n_samples_per_prompt


class AlgorithmConfig(Section):
    """What RL optimises: the advantage estimator, the KL, the clipping and the loss's terms."""

    advantage_estimator: Annotated[str, ESTIMATORS] = Field("group_norm", description=ESTIMATORS.described())
    gamma: float = Field(1.0, ge=0.0, le=1.0, description=f"discount ({UNGROUPED}); the group estimators take 1 only")
    lambd: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda")
    advantage_std_norm: bool = Field(True, description=f"divide whitened advantages by their std ({WHITENED})")
    init_kl_coef: float = Field(0.01, ge=0.0, description="0 with use_kl_loss off: no reference model")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k1", description="the KL approximation (Schulman's k1, k2, k3)")
    use_kl_loss: bool = Field(False, description="KL as a loss term (GRPO) instead of a per-token reward penalty")
    kl_target: float | None = Field(None, gt=0, description="adaptive KL coefficient toward this KL; empty: fixed")
    kl_horizon: int = Field(10000, gt=0, description="adaptive KL: samples over which the coefficient adapts")
    eps_clip_low: float = Field(0.2, gt=0, lt=1, description="PPO clip: the ratio's floor is 1 - eps_clip_low")
    eps_clip_high: float = Field(0.2, gt=0, description="PPO clip: the ratio's ceiling is 1 + eps_clip_high")
    dual_clip: float | None = Field(None, gt=1.0, description="dual-clip PPO: a negative advantage's loss is bounded by this times it")
    value_clip: float | None = Field(0.5, gt=0, description="critic: new values stay within this of the old ones; empty: no clip")
    entropy_coef: float = Field(0.0, ge=0.0, description="weight of the entropy bonus in the policy loss")
    reward_clip: float = Field(10.0, gt=0, description="scores, after a group estimator's baseline, are clipped to "
                                                       "[-reward_clip, reward_clip]")
    loss_aggregation: LossAggregation | None = Field(
        None, description="the policy loss's mean over each optimizer step's tokens or sequences (the entropy and "
                          f"KL terms: always tokens); empty: {DEFAULT_AGGREGATIONS}")
    dynamic_filtering: bool = Field(False, description="drop groups whose scores are all equal (DAPO)")
    overlong_buffer_len: int = Field(0, ge=0, description="DAPO overlong penalty over the last this many tokens; 0: off")
    overlong_penalty_factor: float = Field(1.0, ge=0.0, description="DAPO overlong penalty at the last token")
    stop_properly_penalty_coef: float | None = Field(
        None, le=1.0, description="ProRL (OpenRLHF's --reward.stop_properly_penalty_coef): a response cut at "
                                  "rl.rollout.generate_max_len without its end token gets its reward times this (0 to 1), "
                                  "or this itself (below 0); applied after the overlong penalty; empty: off")
    dynamic_filtering_range: tuple[float, float] | None = Field(
        None, description="with dynamic_filtering, keep the groups whose mean score lies strictly inside this range "
                          "(OpenRLHF's --algo.dynamic_filtering_range); empty: drop the groups whose scores are all equal")
    policy_loss_type: Literal["ppo", "gspo"] = Field(
        "ppo", description="OpenRLHF's --actor.policy_loss_type: ppo clips each token's ratio; gspo the sequence's (the "
                           "geometric mean of its tokens' ratios), its loss averaged per sequence (seq_mean_token_mean)")
    rollout_is_cap: float | None = Field(None, gt=0, description="importance weights against the engine's log-probs, their "
                                                                "upper threshold (OpenRLHF's --algo.advantage."
                                                                "is_correction_threshold's second value); empty: none, or "
                                                                f"{ASYNC_IS_CAP:g} with rl.rollout.async_train")
    rollout_is_floor: float = Field(0.0, ge=0.0, description="their lower threshold (is_correction_threshold's first value; "
                                                            "OpenRLHF's default is 0.5)")
    rollout_is_type: Literal["tis", "icepop", "seq-mask-tis"] = Field(
        "tis", description="OpenRLHF's --algo.advantage.is_correction_type: tis clamps each token's weight to [floor, cap]; "
                           "icepop zeroes a token's outside it; seq-mask-tis zeroes a sequence whose geometric-mean weight "
                           "lies outside it. With gspo the sequence ratio itself is taken against the engine's log-probs")
    recompute_old_log_probs: bool = Field(
        True, description="the policy recomputes the old log-probs; false: the engine's sampled log-probs stand in "
                          "(one policy forward pass less per rollout; exact only where the engine computes as the trainer: "
                          "the HF engine at the trainer's precision)")

    @model_validator(mode="after")
    def _consistent(self) -> AlgorithmConfig:
        if self.estimator.grouped and self.gamma != 1.0:
            raise ValueError(f"rl.algorithm.gamma={self.gamma} with advantage_estimator={self.advantage_estimator}: a group "
                             "estimator scores whole responses, undiscounted (gamma 1, as OpenRLHF); leave gamma at 1 or use "
                             f"{' or '.join(e.name for e in ESTIMATORS.values() if not e.grouped)}")
        if self.rollout_is_cap is not None and not self.recompute_old_log_probs:
            raise ValueError("rl.algorithm.rollout_is_cap weighs the recomputed old log-probs against the engine's: it needs "
                             "rl.algorithm.recompute_old_log_probs: true")
        if self.dynamic_filtering_range is not None:
            low, high = self.dynamic_filtering_range
            if not self.dynamic_filtering or low >= high:
                raise ValueError(f"rl.algorithm.dynamic_filtering_range={[low, high]} needs dynamic_filtering: true and "
                                 "a lower bound below the upper one")
        if self.rollout_is_cap is not None and self.rollout_is_floor >= self.rollout_is_cap:
            raise ValueError(f"rl.algorithm.rollout_is_floor={self.rollout_is_floor:g} must be below rl.algorithm."
                             f"rollout_is_cap={self.rollout_is_cap:g}")
        if self.policy_loss_type == "gspo" and self.loss_aggregation not in (None, "seq_mean_token_mean"):
            raise ValueError(f"rl.algorithm.policy_loss_type=gspo averages its loss per sequence (seq_mean_token_mean, as "
                             f"OpenRLHF's); leave rl.algorithm.loss_aggregation empty, not {self.loss_aggregation}")
        return self

    @property
    def estimator(self) -> Estimator:
        return ESTIMATORS[self.advantage_estimator]

    @property
    def needs_critic(self) -> bool:
        return self.estimator.needs_critic

    @property
    def needs_reference(self) -> bool:
        return self.init_kl_coef > 0

    @property
    def aggregation(self) -> str:
        if self.policy_loss_type == "gspo":
            return "seq_mean_token_mean"
        return self.loss_aggregation or self.estimator.aggregation


class PlacementConfig(Section):
    """Where RL's actor groups sit: how many reference and reward actors, and which share bundles."""

    ref_num_workers: int = Field(1, gt=0, description="reference model actors (engine hf or vllm); each scores an equal share of a rollout")
    reward_num_workers: int = Field(1, gt=0, description="reward scorer copies; each scores an equal share of a rollout")
    colocate_actor_ref: bool = Field(False, description="the reference actors share the policy's bundles")
    colocate_critic_reward: bool = Field(False, description="the reward scorers share the critic's bundles")
    colocate_all: bool = Field(False, description="every actor group and engine shares the policy's bundles")
    colocate_models: bool = Field(False, description="every model group (policy, critic, reference, reward) shares the "
                                                     "policy's bundles, the rollout engines keep their own (the layout "
                                                     "rl.rollout.async_train overlaps on a small cluster)")
    ref_offload: bool = Field(False, description="the reference model's weights stay in host memory (pinned on a CUDA "
                                                 "machine) and go to the device only for its log-prob passes (OpenRLHF's "
                                                 "--ref.offload); the same log-probs, the device's memory free between them")
    reward_offload: bool = Field(False, description="the same for the reward model(s) of reward.source rm or prm, "
                                                    "on the device only while they score (OpenRLHF's --reward.offload)")


class AgentConfig(Section):
    """Multi-turn RL against an environment (OpenRLHF's agent API; docs/algorithms.md)."""

    path: str | None = Field(
        None, description="a Python file defining class Environment with reset(prompt, label) -> first "
                          "observation and step(observation, action) -> (reward, next observation, done), either may "
                          "be async; or OpenRLHF's AgentExecutor (a MultiTurnAgentExecutor over an AgentInstanceBase "
                          "class, or an AgentExecutorBase with its own execute(), e.g. an OpenAIServerExecutor); the "
                          "episodes' rewards replace the reward section's, the observations' tokens are masked out of "
                          "the loss; empty: one turn")
    max_turns: int = Field(4, gt=0, description="turns after which an episode ends though its environment is not done")
    timeout_s: float = Field(60.0, gt=0, description="seconds a reward worker's share of one turn's environment "
                                                    "steps may take; then the stage ends and its workers are killed")


# the RL keys of the flat layout before the sections, and where each went: an old key is refused by name
RL_SECTIONS: dict[str, type[Section]] = {"rollout": RolloutConfig, "algorithm": AlgorithmConfig, "placement": PlacementConfig,
                                          "agent": AgentConfig}
RL_RENAMED = {"rollout_batch_size": "rollout.batch_size", "micro_rollout_batch_size": "rollout.micro_batch_size",
              "agent_path": "agent.path", "agent_max_turns": "agent.max_turns", "agent_timeout_s": "agent.timeout_s"}
RL_MOVED = {name: f"{section}.{name}" for section, model in RL_SECTIONS.items() for name in model.model_fields
            if section != "agent" and name not in ("batch_size", "micro_batch_size")} | RL_RENAMED


def moved_key(dotted: str) -> str | None:
    """The key that replaced `dotted` (`rl.temperature` -> `rl.rollout.temperature`), or None."""
    section, _, name = dotted.partition(".")
    return f"rl.{RL_MOVED[name]}" if section == "rl" and name in RL_MOVED else None


EvalMetric = Literal["reward", "sampled_reward", "pass_at_k", "accuracy", "sampled_accuracy"]
UNRANKED_METRICS = {"perplexity": "lower is better", "response_length": "longer is not better"}


def ranked(metric):
    """`metric` as a ranking metric's value, refused with the reason when the evals report it but it ranks no model."""
    if metric in UNRANKED_METRICS:
        raise ValueError(f"{metric} is reported but ranks no model ({UNRANKED_METRICS[metric]}): pick one of "
                         f"{', '.join(get_args(EvalMetric))}")
    return metric


# a held-out metric that ranks models (checked before its Literal: a reported but unranked one gets the reason)
RankingMetric = Annotated[EvalMetric, BeforeValidator(ranked)]


class RLConfig(Section):
    """Online RL from the SFT policy (OpenRLHF's PPO family). Batch sizes count sequences
    (prompts x samples) except `rollout.batch_size`, which counts prompts, as in OpenRLHF."""

    actor: ActorConfig = ActorConfig(lr=5e-7)
    critic: CriticConfig = CriticConfig(lr=9e-6)
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    placement: PlacementConfig = PlacementConfig()
    agent: AgentConfig = AgentConfig()
    train_batch_size: int = Field(128, gt=0, description="sequences per optimizer step")
    micro_train_batch_size: int = Field(32, gt=0, description="sequences per rank per training forward pass")
    packing: bool = Field(False, description=PACKING + "; the policy's, reference's and critic's passes, training and "
                                                      "experience making alike")
    shared_prompt: bool = Field(True, description="the samples of a prompt as one row, the prompt computed once (a 4D "
                                                  "attention mask; the same log-probs and gradients), and training "
                                                  "micro-batches of whole groups; with SDPA or eager attention and no "
                                                  "sliding window, else padded rows. A row is prompt + n responses "
                                                  "long: with long responses its attention can cost more than the "
                                                  "prompt saves, and in bf16 on a GPU SDPA's masked kernel made it "
                                                  "slower than padded rows (docs/gpu.md)")
    max_epochs: int = Field(1, gt=0, description="passes over each rollout batch")
    num_episodes: int = Field(1, gt=0, description="passes over the prompt set")
    max_steps: int | None = Field(None, gt=0, description="rollout steps; overrides num_episodes")
    eval_every: int = Field(10, gt=0, description="rollout steps between held-out evals")
    save_every: int = Field(10, gt=0, description="rollout steps between resumable checkpoints")
    max_checkpoints: int = Field(1, gt=0, description=MAX_CHECKPOINTS + "; the policy's and the critic's each")
    best_metric: RankingMetric | None = Field(
        None, description="the held-out metric (higher is better) whose best eval step, of those every rl.eval_every steps "
                          "and the last, gives the stage's output policy instead of the last step (OpenRLHF's "
                          "--ckpt.best_metric_key, where the best is kept beside the last); empty: the last step's")

    @model_validator(mode="before")
    @classmethod
    def _no_flat_keys(cls, data):
        if isinstance(data, dict):
            for name in data:
                if name in RL_MOVED:
                    raise ValueError(f"rl.{name} is now rl.{RL_MOVED[name]} (the rl section has sections: rollout, "
                                     "algorithm, placement, agent; docs/config-reference.md)")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        rollout, algorithm, placement = self.rollout, self.algorithm, self.placement
        if algorithm.estimator.grouped and rollout.n_samples_per_prompt < 2:
            raise ValueError(f"rl.algorithm.advantage_estimator={algorithm.advantage_estimator} compares samples of a "
                             "prompt: rl.rollout.n_samples_per_prompt must be > 1")
        if algorithm.dynamic_filtering and rollout.n_samples_per_prompt < 2:
            raise ValueError("rl.algorithm.dynamic_filtering needs rl.rollout.n_samples_per_prompt > 1")
        if rollout.size % self.train_batch_size:
            raise ValueError(f"rl.rollout.batch_size x n_samples_per_prompt ({rollout.size}) must be a multiple of "
                             f"rl.train_batch_size ({self.train_batch_size})")
        for group in ("actor", "critic"):
            per_step = self.micro_train_batch_size * getattr(self, group).num_workers
            if self.train_batch_size % per_step:
                raise ValueError(f"rl.train_batch_size ({self.train_batch_size}) must be a multiple of "
                                 f"rl.micro_train_batch_size x rl.{group}.num_workers ({per_step})")
        if rollout.engine == "hybrid" and placement.ref_num_workers != 1:
            raise ValueError("rl.rollout.engine=hybrid keeps the reference in each policy rank: "
                             "rl.placement.ref_num_workers does not apply (leave it at 1)")
        if rollout.size % placement.ref_num_workers:
            raise ValueError(f"rl.rollout.batch_size x n_samples_per_prompt ({rollout.size}) must be a multiple of "
                             f"rl.placement.ref_num_workers ({placement.ref_num_workers})")
        if rollout.async_queue_size > 1 and not rollout.async_train:
            raise ValueError(f"rl.rollout.async_queue_size={rollout.async_queue_size} sets how far ahead async training draws; "
                             "set rl.rollout.async_train: true, or leave the queue size at 1")
        if self.critic.aux_loss_coef:
            raise ValueError("rl.critic.aux_loss_coef: the value loss takes no router loss; set rl.actor.aux_loss_coef")
        if self.critic.keys_in_use and not algorithm.needs_critic:
            key = self.critic.keys_in_use[0]
            raise ValueError(f"{key} acts on the critic, and advantage_estimator={algorithm.advantage_estimator} has none; "
                             f"use gae or leave {key} at its default")
        if algorithm.overlong_buffer_len >= rollout.generate_max_len:
            raise ValueError("rl.algorithm.overlong_buffer_len must be smaller than rl.rollout.generate_max_len")
        return self

    @property
    def importance_cap(self) -> float | None:
        """The truncated-IS cap in force: rollout_is_cap, else async training's default where old log-probs are recomputed."""
        algorithm = self.algorithm
        if algorithm.rollout_is_cap is not None or not self.rollout.async_train or not algorithm.recompute_old_log_probs:
            return algorithm.rollout_is_cap
        return ASYNC_IS_CAP


class EvalConfig(Section):
    """Every model scored on the held-out prompts by the `reward` section's source (the eval stage and
    the RL stage's periodic evals)."""

    max_samples: int = Field(200, gt=0, description="held-out prompts scored per model")
    batch_size: int = Field(64, gt=0, description="prompts per generate call, rows per perplexity pass")
    max_new_tokens: int = Field(48, gt=0, description="most tokens generated per response")
    sample_temperature: float = Field(1.0, gt=0, description="sampled metrics: responses drawn at this temperature")
    samples_per_prompt: int = Field(4, ge=0, description="responses drawn per prompt for sampled_reward, pass_at_k "
                                                         "and sampled_accuracy; 0: greedy only")
    answer_pattern: str | None = Field(None, description="regex whose first group is the final answer, checked against "
                                                         "the label (accuracy, sampled_accuracy); empty: free-form task")
    metric: RankingMetric = Field(
        "reward", description="what results.md, the plots and the registry's champion go by; higher is better for "
                              "each: reward (mean greedy reward), sampled_reward, pass_at_k (0/1 rewards only), "
                              "accuracy, sampled_accuracy (with answer_pattern)")

    @model_validator(mode="after")
    def _metric_is_reported(self) -> EvalConfig:
        if (why := unreported("metric", self.metric, self)) is not None:
            raise ValueError(why)
        return self


def unreported(key: str, metric: str, ev: EvalConfig, prefix: str = "") -> str | None:
    """Why the held-out evals `ev` configures would not report `metric`, which `key` names (the eval keys named under
    `prefix`), and what to do; None: they report it."""
    if metric in ("accuracy", "sampled_accuracy") and ev.answer_pattern is None:
        return (f"{key}={metric} checks answers with {prefix}answer_pattern, which is empty: set {prefix}answer_pattern "
                f"or use {key}=reward")
    if metric in ("sampled_reward", "pass_at_k", "sampled_accuracy") and not ev.samples_per_prompt:
        return f"{key}={metric} needs sampled responses: {prefix}samples_per_prompt must be > 0"
    return None


# an MLflow run's artifact, a registered model version, or (no scheme) a checkpoint folder or hub id
PIN = r"^(runs:/[0-9a-f]+/[\w.-]+|models:/[\w.-]+(@[\w-]+|/\d+|/latest)|[^\s:]+)$"


class PipelineConfig(Section):
    seed: int = Field(42, description="drives data generation, model init, sampling and the shuffling order")
    inputs: dict[str, Annotated[str, Field(pattern=PIN)]] = Field(
        default_factory=dict, description="pinned inputs: an artifact name (e.g. sft_model) to an existing artifact that "
                                          "stands in for the producing stage's output: runs:/<run_id>/<name>, "
                                          "models:/<name>/<version>, models:/<name>@<alias>, or a checkpoint folder or "
                                          "hub id (recorded once by content: read in place on a local store, copied once "
                                          "to a remote one; as OpenRLHF's --pretrain names a model)")
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    infra: InfraConfig = InfraConfig()
    tracking: TrackingConfig = TrackingConfig()
    sft: SFTConfig = SFTConfig()
    rm: RewardModelConfig = RewardModelConfig()
    prm: PRMConfig = PRMConfig()
    reward: RewardConfig = RewardConfig()
    rl: RLConfig = RLConfig()
    dpo: DPOConfig = DPOConfig()
    rs: RejectionSamplingConfig = RejectionSamplingConfig()
    kd: KDConfig = KDConfig()
    csft: ConditionalSFTConfig = ConditionalSFTConfig()
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="after")
    def _csft_single_turn(self) -> PipelineConfig:
        if self.csft.enabled and self.data.sft is not None and self.data.sft.multiturn:
            raise ValueError("csft.enabled with data.sft.multiturn: conditional SFT puts one score in each prompt, "
                             "so it takes single-turn SFT rows; set data.sft.multiturn=false or csft.enabled=false")
        return self

    @model_validator(mode="after")
    def _best_metric_is_reported(self) -> PipelineConfig:
        if self.rl.best_metric is not None and (why := unreported("rl.best_metric", self.rl.best_metric, self.eval, "eval.")):
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _hybrid_engine_needs_whole_weights(self) -> PipelineConfig:
        if self.rl.rollout.engine == "hybrid" and self.infra.zero_stage == 3:
            raise ValueError("rl.rollout.engine=hybrid samples with each policy rank's own weights, which ZeRO-3 partitions: "
                             "use infra.zero_stage 0, 1 or 2, or rl.rollout.engine=hf")
        return self

    @model_validator(mode="after")
    def _unpaired_rows_train_kto_only(self) -> PipelineConfig:
        if self.data.preference is None or not self.data.preference.unpaired:
            return self
        if DPO_OBJECTIVES[self.dpo.loss].pairing != "examples":
            raise ValueError(f"dpo.loss={self.dpo.loss} trains on (chosen, rejected) pairs, and data.preference.unpaired "
                             "gives single responses: set dpo.loss=kto, or give pairs (data.preference.unpaired=false)")
        pinned = "reward_model" in self.inputs
        if consumed_model(self.reward) == "reward_model" and not pinned:
            raise ValueError("reward.source=rm scores with the RM the rm stage trains on preference pairs, and "
                             "data.preference.unpaired gives none: set reward.rm_paths or inputs.reward_model, or "
                             "another reward.source")
        if self.csft.enabled and not self.reward.rm_paths and not pinned:
            raise ValueError("csft.enabled scores the SFT data with the RM the rm stage trains on preference pairs, and "
                             "data.preference.unpaired gives none: set reward.rm_paths or inputs.reward_model")
        if self.rl.critic.init_from == "reward_model" and not pinned:
            raise ValueError("rl.critic.init_from=reward_model starts the critic from the RM the rm stage trains on "
                             "preference pairs, and data.preference.unpaired gives none: set inputs.reward_model, or "
                             "rl.critic.init_from: path with rl.critic.init_path, or rl.critic.init_from: sft")
        return self

    @model_validator(mode="after")
    def _pretrain_mode_reads_text_files(self) -> PipelineConfig:
        if not self.sft.pretrain_mode:
            return self
        if self.data.source != "files":
            raise ValueError("sft.pretrain_mode trains on plain-text rows read from files: set data.source=files and "
                             "data.sft.input_key")
        if self.data.sft is not None and self.data.sft.multiturn:
            raise ValueError("sft.pretrain_mode reads data.sft.input_key as plain text: set data.sft.multiturn=false")
        if self.csft.enabled:
            raise ValueError("csft.enabled with sft.pretrain_mode: conditional SFT puts a score in each prompt, and "
                             "plain-text rows have none; set csft.enabled=false")
        return self


def sections_with(key: str, model: type[BaseModel] = PipelineConfig, prefix: str = "") -> tuple[str, ...]:
    """The dotted sections of the schema that have `key` (e.g. every section with an `aux_loss_coef`), read from
    the schema itself so that a list of them cannot drift from it."""
    found: list[str] = []
    for name, field in model.model_fields.items():
        if (section := section_type(field.annotation)) is not None:
            if key in section.model_fields:
                found.append(prefix + name)
            found += sections_with(key, section, f"{prefix}{name}.")
    return tuple(found)
