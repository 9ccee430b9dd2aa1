"""The typed schema of a pipeline config: one section per stage plus model, data, infra, tracking, seed.

Every section forbids unknown keys, so a typo fails at load time instead of being ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyModelConfig(Section):
    """A small Llama-style model built from scratch (used when `model.name_or_path` is empty)."""

    hidden_size: int = Field(128, gt=0)
    intermediate_size: int = Field(384, gt=0)
    num_hidden_layers: int = Field(4, gt=0)
    num_attention_heads: int = Field(4, gt=0)
    num_key_value_heads: int = Field(4, gt=0)
    max_position_embeddings: int = Field(128, gt=0)
    vocab_size: int = Field(96, gt=0, description="target size of the BPE tokenizer trained on the task")


class ModelConfig(Section):
    name_or_path: str | None = Field(None, description="hub id or local HF checkpoint; empty builds the tiny model")
    tiny: TinyModelConfig = TinyModelConfig()
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    trust_remote_code: bool = False


class SyntheticTaskConfig(Section):
    """Multi-step arithmetic ("Compute 17+5-8") with worked, checkable answers."""

    num_train: int = Field(4000, gt=0)
    num_eval: int = Field(200, gt=0)
    num_prompts: int = Field(1000, gt=0, description="RL prompts (with answers as labels)")
    min_terms: int = Field(2, ge=2)
    max_terms: int = Field(3, ge=2)
    max_operand: int = Field(20, gt=1)
    flawed_share: float = Field(0.25, ge=0.0, lt=1.0, description="share of SFT solutions with an arithmetic slip")
    min_slip: int = Field(1, gt=0, description="smallest error a flawed step makes")
    max_slip: int = Field(2, gt=0, description="largest error a flawed step makes")

    @model_validator(mode="after")
    def _ranges_ordered(self) -> SyntheticTaskConfig:
        if self.min_terms > self.max_terms:
            raise ValueError(f"min_terms ({self.min_terms}) must not exceed max_terms ({self.max_terms})")
        if self.min_slip > self.max_slip:
            raise ValueError(f"min_slip ({self.min_slip}) must not exceed max_slip ({self.max_slip})")
        return self


class DatasetConfig(Section):
    """A dataset read from files or the hub, mapped onto the pipeline's columns (OpenRLHF key names)."""

    paths: list[str] = Field(min_length=1, description="hub names, .json/.jsonl/.parquet files, or json@DIR folders")
    probs: list[float] | None = Field(None, description="mixing probabilities, one per path")
    split: str = "train"
    eval_split: str | None = Field(None, description="a split of the same source used for eval")
    eval_ratio: float = Field(0.05, ge=0.0, lt=1.0, description="held-out share when eval_split is unset")
    max_samples: int | None = Field(None, gt=0)
    input_key: str = "input"
    output_key: str = "output"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    margin_key: str | None = None
    label_key: str = "label"
    apply_chat_template: bool = True
    input_template: str | None = Field(None, description='e.g. "User: {}\\nAssistant: " when not using the chat template')
    multiturn: bool = Field(False, description="input_key holds a whole conversation; every assistant turn is trained")

    @model_validator(mode="after")
    def _probs_match(self) -> DatasetConfig:
        if self.probs is not None:
            if len(self.probs) != len(self.paths):
                raise ValueError(f"probs has {len(self.probs)} entries for {len(self.paths)} paths")
            if any(p <= 0 for p in self.probs):
                raise ValueError("probs must all be positive")
        if self.input_template is not None and "{}" not in self.input_template:
            raise ValueError("input_template must contain {} where the prompt goes")
        return self


class DataConfig(Section):
    source: Literal["synthetic", "files"] = "synthetic"
    synthetic: SyntheticTaskConfig = SyntheticTaskConfig()
    sft: DatasetConfig | None = None
    preference: DatasetConfig | None = None
    prompts: DatasetConfig | None = None
    max_len: int = Field(128, gt=0, description="rows longer than this many tokens are an error")

    @model_validator(mode="after")
    def _files_need_sft(self) -> DataConfig:
        if self.source == "files" and (self.sft is None or self.prompts is None):
            raise ValueError("source: files needs at least data.sft and data.prompts")
        return self


class InfraConfig(Section):
    ray_address: str | None = Field(None, description="a running Ray cluster; empty starts a local one (RAY_ADDRESS overrides)")
    num_cpus: int | None = Field(None, gt=0, description="CPUs of the local Ray cluster (default: all)")
    num_workers: int = Field(1, gt=0, description="data-parallel training workers per stage")
    cpus_per_worker: int = Field(2, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0.0)
    zero_stage: Literal[0, 1, 2, 3] = 2
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"


class TrackingConfig(Section):
    state_dir: str = Field(".rlhf", description="project-local folder for the MLflow store, downloads and stage work dirs")
    uri: str | None = Field(None, description="MLflow tracking URI; default: SQLite under state_dir (MLFLOW_TRACKING_URI overrides)")
    experiment: str = "rlhf-pipeline"


class LoRAConfig(Section):
    """Low-rank adapters (peft). `rank: 0` trains the whole model; above 0 the stage trains and saves
    only the adapter, which records the path of the checkpoint it was trained on."""

    rank: int = Field(0, ge=0)
    alpha: int = Field(16, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class TrainingConfig(Section):
    """What every DeepSpeed training stage shares: optimizer, schedule, batching, eval and checkpoints."""

    lr: float = Field(1e-3, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="cosine decay floor as a share of lr")
    warmup_ratio: float = Field(0.05, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    epochs: int = Field(1, gt=0)
    max_steps: int | None = Field(None, gt=0, description="optimizer steps; overrides epochs")
    micro_batch_size: int = Field(32, gt=0)
    grad_accum_steps: int = Field(1, gt=0)
    grad_clip: float = Field(1.0, gt=0)
    gradient_checkpointing: bool = False
    eval_every: int = Field(50, gt=0, description="optimizer steps between eval passes")
    save_every: int = Field(50, gt=0, description="optimizer steps between resumable checkpoints")


class SFTConfig(TrainingConfig):
    """Causal-LM loss on response tokens."""


class RewardModelConfig(TrainingConfig):
    """Bradley-Terry reward model trained from the SFT checkpoint on preference pairs."""

    lr: float = Field(5e-4, gt=0)
    micro_batch_size: int = Field(16, gt=0, description="preference pairs per micro-batch")
    value_head_prefix: str = Field("score", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    normalize_reward: bool = Field(False, description="scorers return (r - mean) / std with the eval-split statistics")
    lora: LoRAConfig = LoRAConfig()


class PRMConfig(TrainingConfig):
    """Process reward model: next-token CE over the reward tokens at each step placeholder."""

    placeholder_token: str = Field("<|step|>", description="ends every step; the reward is read there")
    reward_tokens: tuple[str, str] = Field(("+", "-"), description="the (good, bad) label tokens")
    step_separator: str = Field("\n", description="splits a response into steps when it has no placeholders")


class RewardConfig(Section):
    """Where rewards come from for later stages (one scorer interface over all sources)."""

    source: Literal["rm", "prm", "func", "remote"] = "func"
    rm_paths: list[str] = Field(default_factory=list, description="RM checkpoints, combined by mean; empty: the pipeline's own")
    prm_path: str | None = Field(None, description="PRM checkpoint; empty: the pipeline's own")
    prm_aggregate: Literal["min", "mean", "last"] = "min"
    func_path: str = Field("rewards/arithmetic.py", description="a file defining reward_func(queries, prompts, labels); relative paths are tried from the working directory, then from configs/")
    url: str | None = Field(None, description="remote reward server, e.g. http://127.0.0.1:5001/get_reward")
    timeout_s: float = Field(10.0, gt=0)
    retries: int = Field(3, ge=0)
    batch_size: int = Field(32, gt=0)


class EvalConfig(Section):
    max_samples: int = Field(200, gt=0)
    batch_size: int = Field(64, gt=0)
    max_new_tokens: int = Field(48, gt=0)
    answer_pattern: str = Field(r"Answer:\s*(-?\d+)", description="regex whose first group is the final answer")


class PipelineConfig(Section):
    seed: int = 42
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    infra: InfraConfig = InfraConfig()
    tracking: TrackingConfig = TrackingConfig()
    sft: SFTConfig = SFTConfig()
    rm: RewardModelConfig = RewardModelConfig()
    prm: PRMConfig = PRMConfig()
    reward: RewardConfig = RewardConfig()
    eval: EvalConfig = EvalConfig()
