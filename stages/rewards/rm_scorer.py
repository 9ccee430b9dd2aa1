"""Scalar reward models: an HF backbone plus a linear value head read at the last real token.

A reward-model checkpoint is an HF directory whose config.json adds `value_head_prefix` (the
head's weight is `<prefix>.weight`, shape [1, hidden]), `normalize_reward`, `reward_mean` and
`reward_std` (OpenRLHF's RM checkpoints store the statistics as `mean` and `std`, which are read where
ours are absent). With the default prefix `score` it is also what
`AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)` loads. The backbone is
loaded with `AutoModel` and the head read from the weights, so any prefix works.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import cached_file
from transformers.utils import logging as hf_logging

from configs.errors import CheckpointError, RewardError, first_line
from stages.common.checkpoint import default_device, load_tokenizer
from stages.common.checkpoint_paths import resolve, validate
from stages.common.offload import FrozenModel
from stages.common.precision import torch_dtype
from stages.data.tokenization import last_token_index, pad_batch
from stages.rewards.base import RewardBatch, check_batch

SAFE_WEIGHTS, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"


def rm_query(text: str, eos: str | None, pad: str | None) -> str:
    """`text` with pad/EOS stripped from both ends and exactly one EOS appended.

    Preference data ends every response with EOS, so the RM learned to score at EOS; queries
    decoded with or without special tokens (or with padding) all get read at that same token.
    Stripped by position, in one pass over each end (a pattern anchored at the end would try every
    start inside a long run of marks: quadratic in a hostile query).
    """
    marks = [t for t in (eos, pad) if t]
    start, end = 0, len(text)
    while mark := next((m for m in marks if text.startswith(m, start, end)), None):
        start += len(mark)
    while mark := next((m for m in marks if text.endswith(m, start, end)), None):
        end -= len(mark)
    return text[start:end] + (eos or "")


class RewardModel(torch.nn.Module):
    """One loaded RM: `score_pairs` gives one (optionally normalized) float per prompt + response."""

    def __init__(self, backbone: PreTrainedModel, head: torch.nn.Linear, tokenizer: PreTrainedTokenizerBase,
                 normalize: bool = False, mean: float = 0.0, std: float = 1.0) -> None:
        super().__init__()
        self.backbone, self.head, self.tokenizer = backbone, head, tokenizer
        self.normalize, self.mean, self.std = normalize, mean, std

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Raw rewards [B]: the head on the final (normed) hidden state of each row's last real token."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        pooled = hidden[rows, last_token_index(attention_mask)]
        return self.head(pooled).squeeze(-1).float()

    @torch.inference_mode()
    def score_pairs(self, prompts: list[str], responses: list[str], batch_size: int) -> torch.Tensor:
        """Rewards of prompt + response, each response read at one EOS (see `rm_query`).

        Prompt and response are tokenized apart, as the RM stage trains on them; an empty prompt
        makes the response the whole query. A query over the model's positions loses its first tokens.
        """
        tok = self.tokenizer

        def ids(text: str) -> list[int]:
            return tok(text, add_special_tokens=False)["input_ids"] if text else []

        # a query longer than the model reads keeps its end, the EOS the reward is read at (the prompt's start is cut)
        longest = getattr(self.backbone.config, "max_position_embeddings", None)
        rows = [(ids(p) + ids(rm_query(r, tok.eos_token, tok.pad_token)))[-longest if longest else 0 :]
                for p, r in zip(prompts, responses, strict=True)]
        device = self.head.weight.device
        out = []
        for start in range(0, len(rows), batch_size):
            batch = pad_batch([(r, r) for r in rows[start : start + batch_size]], tok.pad_token_id)
            out.append(self(batch["input_ids"].to(device), batch["attention_mask"].to(device)).cpu())
        rewards = torch.cat(out) if out else torch.zeros(0)
        return (rewards - self.mean) / self.std if self.normalize else rewards


@dataclass(frozen=True)
class RewardHead:
    """An RM checkpoint's value head and the normalization its config asks the scorers for."""

    head: torch.nn.Linear
    normalize: bool
    mean: float
    std: float

    def scoring(self) -> torch.nn.Linear:
        """The head with the normalization folded in, w / std and (b - mean) / std: on a final hidden state it
        gives the reward `score_pairs` does (the start of a critic, `stages/rl/critic_model.py`)."""
        weight, bias = self.head.weight.detach().float(), self.head.bias
        offset = bias.detach().float() if bias is not None else torch.zeros(weight.shape[0])
        folded = torch.nn.Linear(weight.shape[1], weight.shape[0])
        scale, shift = (1.0 / self.std, self.mean) if self.normalize else (1.0, 0.0)
        with torch.no_grad():
            folded.weight.copy_(weight * scale)
            folded.bias.copy_((offset - shift) * scale)
        return folded


def stored_statistics(config) -> tuple[float, float] | None:
    """The (mean, std) of rewards a checkpoint's config stores: ours as `reward_mean`/`reward_std`, else
    OpenRLHF's as `mean`/`std` (its RM trainer's eval statistics); None when it stores neither pair."""
    for mean_key, std_key in (("reward_mean", "reward_std"), ("mean", "std")):
        mean, std = getattr(config, mean_key, None), getattr(config, std_key, None)
        if mean is not None and std is not None:
            return float(mean), float(std)
    return None


def normalization(source: str, config, normalize: bool | None) -> tuple[bool, float, float]:
    """(normalize?, mean, std) for an RM: `normalize` (reward.normalize) where given, else the checkpoint's own
    `normalize_reward`, and the statistics it stores (0 and 1 where it stores none and does not normalize);
    normalizing without stored statistics, or with a std that is not > 0, is a one-line error."""
    asked_by = "reward.normalize=true" if normalize else "its config.json's normalize_reward"
    if normalize is None:
        normalize = bool(getattr(config, "normalize_reward", False))
    stats = stored_statistics(config)
    if not normalize:  # the statistics are kept (a merged or exported RM carries them on), not applied
        return (False, *stats) if stats is not None else (False, 0.0, 1.0)
    if stats is None:
        raise RewardError(f"{source}: {asked_by} asks for normalized rewards, and its config.json stores no reward "
                          "statistics (reward_mean and reward_std, or OpenRLHF's mean and std); set reward.normalize=false "
                          "for its raw rewards")
    mean, std = stats
    if not std > 0:
        raise RewardError(f"{source}: {asked_by} asks for normalized rewards, and its stored reward std is {std} "
                          "(must be > 0); set reward.normalize=false for its raw rewards")
    return True, mean, std


def read_reward_head(source: str, normalize: bool | None = None) -> RewardHead:
    """The value head `<value_head_prefix>.weight` (and bias) of the RM checkpoint at `source` and its reward
    statistics, checked: one-line errors name what is wrong. `normalize`: reward.normalize (None: as the
    checkpoint says)."""
    try:
        config = AutoConfig.from_pretrained(source)
    except Exception as exc:  # IO and parsing errors vary; one line is what the user needs
        raise CheckpointError(f"{source}: cannot read config.json ({type(exc).__name__}: {first_line(exc)})") from exc
    prefix = getattr(config, "value_head_prefix", None) or "score"
    head = _load_head(source, prefix)
    hidden = config.get_text_config().hidden_size
    if tuple(head.weight.shape) != (1, hidden):
        raise RewardError(f"{source}: {prefix}.weight has shape {tuple(head.weight.shape)}, expected (1, {hidden}) "
                          "(not a scalar reward model)")
    return RewardHead(head, *normalization(source, config, normalize))


def load_reward_model(path: str | Path, device: str | None = None, precision: str = "fp32",
                      normalize: bool | None = None) -> RewardModel:
    """Load an RM checkpoint; a directory that is not one is a one-line error. `normalize`: reward.normalize
    (None: as the checkpoint says)."""
    source = resolve(path)
    validate(source, field="reward model path")
    read = read_reward_head(source, normalize)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the head's weights are "unused" by AutoModel on purpose
    try:
        backbone = AutoModel.from_pretrained(source, dtype=torch_dtype(precision))
    except Exception as exc:
        raise CheckpointError(f"{source}: cannot load the RM backbone ({type(exc).__name__}: {first_line(exc)})") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    tokenizer = load_tokenizer(source)
    model = RewardModel(backbone, read.head.to(torch_dtype(precision)), tokenizer, read.normalize, read.mean, read.std)
    return model.to(device or default_device()).eval()


def _load_head(source: str, prefix: str) -> torch.nn.Linear:
    """The value head `<prefix>.weight` (and bias, if saved) read straight from the safetensors."""
    keys = [f"{prefix}.weight", f"{prefix}.bias"]
    index = cached_file(source, SAFE_INDEX, _raise_exceptions_for_missing_entries=False)
    if index:
        weight_map = json.loads(Path(index).read_text())["weight_map"]
        files = sorted({weight_map[k] for k in keys if k in weight_map})
    else:
        files = [SAFE_WEIGHTS]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        file = cached_file(source, name, _raise_exceptions_for_missing_entries=False)
        if file is None:
            raise RewardError(f"{source}: no {name} (reward models are read from safetensors weights)")
        with safe_open(file, framework="pt") as f:
            tensors.update({k: f.get_tensor(k) for k in keys if k in f.keys()})  # noqa: SIM118 - no `in` on a safetensors handle
    if keys[0] not in tensors:
        raise RewardError(f"{source}: not a reward model (no {keys[0]} in its weights; "
                          "expected a checkpoint written by the rm stage)")
    weight = tensors[keys[0]]
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=keys[1] in tensors)
    with torch.no_grad():
        head.weight.copy_(weight)
        if head.bias is not None:
            head.bias.copy_(tensors[keys[1]])
    return head


class RewardModelScorer:
    """One or more RMs; their rewards (each normalized as `normalize` or, where it is None, its config says)
    summed, as OpenRLHF combines several, or averaged (`combine`). `offload`: each RM's weights stay in host
    memory between scoring calls (stages/common/offload.py)."""

    def __init__(self, paths: list[str | Path], batch_size: int = 32, device: str | None = None,
                 precision: str = "fp32", combine: str = "sum", normalize: bool | None = None,
                 offload: bool = False) -> None:
        if not paths:
            raise RewardError("no reward model to score with (empty list of RM paths)")
        self.paths = [str(p) for p in paths]
        self.batch_size, self.combine = batch_size, combine
        device = device or default_device()
        self.models = [FrozenModel(load_reward_model(p, "cpu" if offload else device, precision, normalize), device, offload)
                       for p in paths]

    def score_queries(self, queries: list[str]) -> torch.Tensor:
        """One reward per query text (prompt + response as one string), float32 on the CPU."""
        return self._combined(lambda m: m.score_pairs([""] * len(queries), queries, self.batch_size))

    def score(self, prompts: list[str], responses: list[str], labels: list[str | None]) -> RewardBatch:
        check_batch(prompts, responses, labels)
        return RewardBatch(rewards=self._combined(lambda m: m.score_pairs(prompts, responses, self.batch_size)))

    def _combined(self, rewards_of: Callable[[RewardModel], torch.Tensor]) -> torch.Tensor:
        each = []
        for held in self.models:  # offloaded: one RM on the device at a time
            with held.use() as model:
                each.append(rewards_of(model))
        stacked = torch.stack(each)
        return stacked.sum(0) if self.combine == "sum" else stacked.mean(0)
