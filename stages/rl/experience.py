"""Turning sampled token ids into training tensors, and splitting batches across ranks.

Token-in-token-out: a sequence is exactly `prompt_ids + response_ids` as the engine produced
them, right-padded. Per-token tensors are `[B, T-1]`, aligned with `logits[:, :-1]`: position
`t` is the prediction of token `t+1`, and `action_mask[b, t]` is 1 when token `t+1` is a
response token the policy sampled (up to and including EOS; an environment's tokens in a multi-turn
episode are not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from stages.data.tokenization import decoded

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase



@dataclass
class Sample:
    """One engine output: the prompt it was given, the ids it sampled and their log-probs. A multi-turn
    episode (stages/rl/agent.py) is one sample whose response holds every turn's answer and the
    environment's observations between them: `trained` marks the policy's own tokens (the observations'
    log-probs are 0 placeholders) and `turn_ends` the last token of each answer, where its turn's reward goes."""

    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: list[float]
    trained: list[int] | None = None
    turn_ends: list[int] | None = None


def sequence_batch(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """`input_ids`/`attention_mask` [B, T], `action_mask` and `rollout_log_probs` [B, T-1]."""
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    b = len(samples)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, width), dtype=torch.long)
    action_mask = torch.zeros((b, width - 1), dtype=torch.float32)
    rollout_log_probs = torch.zeros((b, width - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        ids = s.prompt_ids + s.response_ids
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        action_mask[i, p - 1 : p - 1 + r] = 1 if s.trained is None else torch.tensor(s.trained, dtype=torch.float32)
        rollout_log_probs[i, p - 1 : p - 1 + r] = torch.tensor(s.log_probs, dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "action_mask": action_mask,
            "rollout_log_probs": rollout_log_probs}


def place_on_actions(values: list[list[float]], positions: list[list[int]], samples: list[Sample], width: int) -> torch.Tensor:
    """[B, width] zeros with `values[b][k]` at the action column of response token `positions[b][k]`."""
    out = torch.zeros((len(samples), width), dtype=torch.float32)
    for i, (vals, pos, s) in enumerate(zip(values, positions, samples, strict=True)):
        for v, p in zip(vals, pos):
            out[i, len(s.prompt_ids) - 1 + p] = v
    return out


def step_end_tokens(tokenizer: PreTrainedTokenizerBase, response_ids: list[int], separator: str) -> list[int]:
    """Index (in the response) of the last token of each non-blank, `separator`-delimited step:
    where a process reward for that step is placed."""
    ids = [t for t in response_ids if t not in tokenizer.all_special_ids]
    ends_at = [len(decoded(tokenizer, ids[: i + 1])) for i in range(len(ids))]  # text length after token i
    text = decoded(tokenizer, ids)
    step_ends, start = [], 0
    for piece in text.split(separator):
        if piece.strip():
            char_end = start + len(piece.rstrip())
            step_ends.append(next(i for i, n in enumerate(ends_at) if n >= char_end))
        start += len(piece) + len(separator)
    return step_ends


def shard(batch: dict[str, torch.Tensor], n: int) -> list[dict[str, torch.Tensor]]:
    """`n` equal contiguous slices of every tensor (the batch size is a multiple of `n`)."""
    size = next(iter(batch.values())).shape[0]
    if size % n:
        raise ValueError(f"batch of {size} does not split over {n} ranks")
    k = size // n
    return [{key: v[i * k : (i + 1) * k] for key, v in batch.items()} for i in range(n)]


def prompt_lengths(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B]: where each row's sampled tokens begin (its first action's next token; the whole row when it
    has none)."""
    acting = batch["action_mask"] > 0
    return torch.where(acting.any(-1), acting.long().argmax(-1) + 1, batch["attention_mask"].sum(-1))


def micro_batches(batch: dict[str, torch.Tensor], size: int, generator: torch.Generator | None = None, group: int = 1):
    """Slices of `size` rows, in a seeded random order when `generator` is given; with `group` > 1,
    the order moves whole runs of `group` adjacent rows (a prompt's samples stay together)."""
    n = next(iter(batch.values())).shape[0]
    if generator is not None and group > 1 and n % group == 0 and size % group == 0:
        order = (torch.randperm(n // group, generator=generator)[:, None] * group + torch.arange(group)).flatten()
    else:
        order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    for start in range(0, n, size):
        idx = order[start : start + size]
        yield {key: v[idx] for key, v in batch.items()}


def trim(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the right-padding columns no row of this micro-batch uses."""
    width = int(batch["attention_mask"].sum(-1).max())
    full = batch["attention_mask"].shape[1]

    def cut(v: torch.Tensor) -> torch.Tensor:
        if v.dim() < 2:
            return v
        return v[:, :width] if v.shape[1] == full else v[:, : width - 1]

    return {k: cut(v) for k, v in batch.items()}
