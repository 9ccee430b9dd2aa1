"""Process reward: a causal LM that scores every step of a response (a dense reward for RL).

A PRM checkpoint is a causal-LM HF directory whose config.json adds `prm_placeholder_token` (ends
each step), `prm_reward_tokens` ([good, bad]) and `prm_step_separator`. A step's score is
P(good) under a softmax over the two reward-token logits at that step's placeholder; the steps'
scores are aggregated into the response's reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from configs.errors import RewardError
from configs.schema import ModelConfig
from stages.common.checkpoint import default_device, load_causal_lm, load_tokenizer
from stages.common.checkpoint_paths import resolve, validate
from stages.common.offload import FrozenModel
from stages.data.tokenization import pad_batch
from stages.rewards.base import RewardBatch, check_batch

Aggregate = Literal["min", "mean", "last"]


def split_steps(response: str, placeholder: str, separator: str) -> list[str]:
    """The steps of a response, stripped: between placeholders when it has any (plus non-blank text
    after the last one), else the non-blank pieces between separators. The placeholder-inserted
    text (`with_placeholders`) has exactly one placeholder per step returned here."""
    if placeholder in response:
        *steps, tail = response.split(placeholder)
        return [s.strip() for s in steps] + ([tail.strip()] if tail.strip() else [])
    return [s.strip() for s in response.split(separator) if s.strip()]


def with_placeholders(response: str, placeholder: str, separator: str) -> str:
    """The response as the PRM was trained on it: a placeholder ends every step.

    With placeholders already in it, only an unterminated last step gets one; without, each
    non-blank piece gets one before its separator (`a\\nb` -> `a<ph>\\nb<ph>`, the training layout).
    """
    if placeholder in response:
        tail = response.split(placeholder)[-1]
        return response + placeholder if tail.strip() else response
    return separator.join(p + placeholder if p.strip() else p for p in response.split(separator))


def aggregate(step_scores: list[float], how: Aggregate) -> float:
    """One reward from the step scores; a response with no steps gets 0.0 (the worst P(good))."""
    if not step_scores:
        return 0.0
    if how == "min":
        return min(step_scores)
    if how == "mean":
        return sum(step_scores) / len(step_scores)
    if how == "last":
        return step_scores[-1]
    raise ValueError(f"unknown aggregate {how!r} (expected min, mean or last)")


def step_probabilities(logits: torch.Tensor, good_id: int, bad_id: int) -> torch.Tensor:
    """P(good) at each row of `logits` [..., vocab], the softmax taken over the two reward tokens only."""
    pair = logits[..., [good_id, bad_id]].float()
    return pair.softmax(-1)[..., 0]


class ProcessRewardScorer:
    """`offload`: the PRM's weights stay in host memory between scoring calls (stages/common/offload.py)."""

    def __init__(self, path: str | Path, aggregate: Aggregate = "min", batch_size: int = 32,
                 device: str | None = None, offload: bool = False) -> None:
        source = resolve(path)
        validate(source, field="PRM path")
        self.how, self.batch_size = aggregate, batch_size
        self.held = FrozenModel(load_causal_lm(source, ModelConfig()).eval(), device or default_device(), offload)
        self.tokenizer = load_tokenizer(source)
        cfg = self.held.module.config
        missing = [k for k in ("prm_placeholder_token", "prm_reward_tokens", "prm_step_separator") if not hasattr(cfg, k)]
        if missing:
            raise RewardError(f"{source}: not a process reward model (config.json lacks {', '.join(missing)}; "
                              "expected a checkpoint written by the prm stage)")
        self.placeholder, self.separator = cfg.prm_placeholder_token, cfg.prm_step_separator
        if len(cfg.prm_reward_tokens) != 2:
            raise RewardError(f"{source}: prm_reward_tokens must be [good, bad], got {cfg.prm_reward_tokens!r}")
        self.placeholder_id = self._single_id(source, self.placeholder)
        self.good_id, self.bad_id = (self._single_id(source, t) for t in cfg.prm_reward_tokens)

    def _single_id(self, source: str, text: str) -> int:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise RewardError(f"{source}: PRM token {text!r} is {len(ids)} tokens in its tokenizer, expected 1")
        return ids[0]

    def step_scores(self, prompts: list[str], responses: list[str]) -> list[list[float]]:
        """P(good) at every step of every response."""
        rows = []
        for prompt, response in zip(prompts, responses, strict=True):
            # Prompt and response tokenized apart, as in training, and placeholders counted in the
            # response only (a prompt may quote one).
            p_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            text = with_placeholders(response, self.placeholder, self.separator)
            r_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            rows.append((p_ids + r_ids, [len(p_ids) + i for i, t in enumerate(r_ids) if t == self.placeholder_id]))
        with self.held.use() as model:
            return self._step_probabilities(model, rows)

    @torch.inference_mode()
    def _step_probabilities(self, model, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        pad = self.tokenizer.pad_token_id
        device = model.device
        out: list[list[float]] = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            batch = pad_batch([(ids, ids) for ids, _ in chunk], pad)  # right padding keeps each row's positions
            input_ids, mask = batch["input_ids"], batch["attention_mask"]
            # Logits only at the batch's placeholder positions: [B, T, vocab] would not fit for real vocabularies.
            keep = sorted({p for _, positions in chunk for p in positions}) or [0]
            column = {p: j for j, p in enumerate(keep)}
            logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                           logits_to_keep=torch.tensor(keep, device=device), use_cache=False).logits
            probs = step_probabilities(logits, self.good_id, self.bad_id).cpu()
            out += [[probs[i, column[p]].item() for p in positions] for i, (_, positions) in enumerate(chunk)]
        return out

    def score(self, prompts: list[str], responses: list[str], labels: list[str | None]) -> RewardBatch:
        check_batch(prompts, responses, labels)
        steps = self.step_scores(prompts, responses)
        rewards = torch.tensor([aggregate(s, self.how) for s in steps], dtype=torch.float32)
        counts = [len(s) for s in steps]
        logs = {"prm/steps": sum(counts) / len(counts)} if counts else {}
        return RewardBatch(rewards=rewards, step_rewards=steps, extra_logs=logs)
