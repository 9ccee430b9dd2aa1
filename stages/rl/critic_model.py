"""The critic's checkpoints: where it starts (`rl.critic.init_from`) and the value network it leaves
(`rl.critic.save_value_network`).

The critic is a token classifier with one output (LlamaForTokenClassification et al.): the value of the state
before each next token is its head on that position's final hidden state. From the SFT policy its head is
fresh. From a reward model (OpenRLHF's `--critic.model_name_or_path` naming one) backbone and head are the
RM's, the head with the RM's normalization folded in where RL's rewards are normalized (reward.normalize, or the
checkpoint's own normalize_reward), so that its value at a response's last token is the reward RL reads for that
response.

The saved value network is the critic as an HF checkpoint (LoRA adapters merged in): AutoModelForTokenClassification
loads it whole, a value per token; its config also carries the reward-model fields (`value_head_prefix`,
`normalize_reward: false`), so the pipeline's RM loader reads it as a scorer of the value at the last token.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from configs.errors import CheckpointError
from configs.schema import CriticConfig, PipelineConfig
from stages.common import checkpoint, lora, vocabulary
from stages.common.checkpoint_paths import resolve
from stages.dag.contract import NodeInputs

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

HEAD_NAMES = ("score", "classifier")  # the token classifiers' heads: score in the families trained here


def start(critic: CriticConfig, given: NodeInputs) -> tuple[str, str | None]:
    """The checkpoint the critic loads, and where it is a reward model the setting that named it (for errors)."""
    if critic.init_from == "reward_model":
        return given.path("reward_model"), "rl.critic.init_from=reward_model"
    if critic.init_from == "path":
        return str(critic.init_path), f"rl.critic.init_path={critic.init_path}"
    return given.path("sft_model"), None


def head_name(model: torch.nn.Module) -> str:
    """The attribute of the token classifier's one-output head (under LoRA, peft's wrapper of it)."""
    for name in HEAD_NAMES:
        if isinstance(getattr(model, name, None), torch.nn.Module):
            return name
    raise CheckpointError(f"{type(model).__name__}: no value head ({' or '.join(HEAD_NAMES)}) to hold the critic's values")


def value_head(model: torch.nn.Module) -> torch.nn.Linear:
    """The token classifier's one-output head, before any LoRA wrapping."""
    head = getattr(model, head_name(model))
    if not isinstance(head, torch.nn.Linear):
        raise CheckpointError(f"{type(model).__name__}.{head_name(model)} is a {type(head).__name__}, not the linear value "
                              "head a reward model's can start")
    return head


def load(cfg: PipelineConfig, given: NodeInputs) -> torch.nn.Module:
    """The critic as it starts, LoRA-wrapped when `rl.critic.lora.rank` > 0 (adapters plus the value head)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    critic = cfg.rl.critic
    path, field = start(critic, given)
    source = resolve(path)
    if field is not None:  # before the weights load: a reward model of another tokenizer fails in a line
        check_tokenizer(source, given.path("sft_model"), field)
    config = AutoConfig.from_pretrained(source, num_labels=1)
    config.classifier_dropout = 0.0  # values must not change between experience making and training
    with checkpoint.new_head():
        model = AutoModelForTokenClassification.from_pretrained(
            source, config=config, dtype=checkpoint.torch_dtype(cfg.infra.precision),
            attn_implementation=checkpoint.attn_implementation(cfg.model), **lora.load_kwargs(critic.lora, "rl.critic.lora"),
        )
    if field is not None:
        start_from_reward_head(model, source, field, cfg.reward.normalize)
    return lora.prepare(model, critic.lora, "TOKEN_CLS")[0]


def check_tokenizer(source: str, policy: str, field: str) -> None:
    """The reward model reads the policy's token ids: it must share the policy's tokenizer."""
    problem = vocabulary.mismatch(checkpoint.load_tokenizer(source).get_vocab(), checkpoint.load_tokenizer(policy).get_vocab(),
                                  None, None, theirs="the policy's")
    if problem:
        raise CheckpointError(f"{field}: the reward model's tokenizer differs from the policy's ({problem}); the critic "
                              "reads the policy's tokens: start it from a reward model trained from this SFT model, or "
                              "rl.critic.init_from: sft")


def start_from_reward_head(model: torch.nn.Module, source: str, field: str, normalize: bool | None = None) -> None:
    """The critic's head set to the RM's, normalization folded in (`RewardHead.scoring`) where the rewards RL reads
    are normalized: `normalize` is reward.normalize (as OpenRLHF's critic follows --reward.normalize_enable), None
    as the checkpoint's own normalize_reward says."""
    from configs.errors import RewardError
    from stages.rewards.rm_scorer import read_reward_head

    try:
        scoring = read_reward_head(source, normalize).scoring()
    except (RewardError, CheckpointError) as exc:
        raise CheckpointError(f"{field}: {exc}") from None
    head = value_head(model)
    if head.bias is None and bool(scoring.bias.any()):
        raise CheckpointError(f"{field}: {type(model).__name__}'s value head has no bias to take the reward model's "
                              "(or its normalization's) offset; use rl.critic.init_from: sft")
    with torch.no_grad():
        head.weight.copy_(scoring.weight.to(head.weight.dtype))
        if head.bias is not None:
            head.bias.copy_(scoring.bias.to(head.bias.dtype))


def save(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: Path, state: dict[str, torch.Tensor], lora_scaling: float | None) -> Path:
    """The critic as an HF checkpoint from its full state dict (`lora_scaling`: alpha / rank of the adapters
    merged in, None without LoRA), with the RM fields that let the pipeline's RM loader score with it."""
    unwrap = getattr(model, "get_base_model", None)  # peft's wrapper, under LoRA
    base = cast("PreTrainedModel", unwrap() if lora_scaling is not None and unwrap is not None else model)
    if lora_scaling is not None:
        state = lora.merged_weights(state, lora_scaling)
    base.config.value_head_prefix = head_name(base)  # the merged state's head is under this name
    base.config.normalize_reward = False  # the values are on the reward's scale already
    base.config.reward_mean, base.config.reward_std = 0.0, 1.0
    return checkpoint.save(base, tokenizer, out, state_dict=state)
