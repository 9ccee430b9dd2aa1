"""Conditional SFT stage (arXiv:2308.12050 as OpenRLHF implements it): the SFT data scored by a reward
model, each prompt given its response's score (`csft.template`, normalized with `csft.normalize_reward`),
and the SFT policy fine-tuned on the conditioned rows with the SFT loss. The saved policy records its
template and `csft.target_reward` (`stages/common/conditioning.py`), which the eval stage prompts it with.

Reads `sft_model`, `sft_data` and the RM (`reward.rm_paths`, else the pipeline's `reward_model`);
writes `csft_model`. The scores are saved in the work dir before training, and training is resumable
as every training stage's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from configs.errors import DataError
from stages.common import checkpoint, conditioning, deepspeed_engine
from stages.common.trainer import begin_training, check_trainable
from stages.dag.contract import StageContext, StageResult
from stages.data.prepared import Indexed, row_view
from stages.data.tokenization import decoded, encode_segments
from stages.rewards.factory import reward_models
from stages.sft.stage import fit_lm

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


SCORED_AT_ONCE = 32  # reward batches per read of the SFT rows: a rank holds these rows' texts, not the split's


def normalized(train: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both score vectors as z-scores with the training scores' mean and std (std 1 where they are all equal)."""
    mean, std = train.mean(), train.std() if train.numel() > 1 else torch.tensor(0.0)
    std = std if float(std) > 0 else torch.tensor(1.0)
    return (train - mean) / std, (other - mean) / std


def response_text(tokenizer: PreTrainedTokenizerBase, segment: str) -> str:
    """A trained segment as the policy's sampled response reads: up to its first EOS, special tokens dropped."""
    ids = tokenizer(segment, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return decoded(tokenizer, ids[: ids.index(eos)] if eos in ids else ids, skip_special_tokens=True)


def scores(ctx: StageContext, rows: Mapping[str, Sequence[dict]], tokenizer: PreTrainedTokenizerBase, own_rm: Path | None) -> dict[str, torch.Tensor]:
    """Each split's RM scores, saved in the work dir (a resumed run reuses them); every rank scores all
    rows (the same deterministic forward passes) rather than waiting on rank 0. The rows are read a few
    reward batches at a time (the scorer's batches are the same as for the whole split at once)."""
    path = ctx.work_dir / "scores.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    rm, out = reward_models(ctx.config.reward, own_rm, offload=False), {}
    chunk = ctx.config.reward.batch_size * SCORED_AT_ONCE
    for split, split_rows in rows.items():
        parts = [torch.zeros(0)]
        for start in range(0, len(split_rows), chunk):
            read = split_rows[start : start + chunk]
            for i, row in enumerate(read, start):
                if len(row["texts"]) != 2 or row["train"] != [False, True]:
                    raise DataError(f"sft_data/{split} row {i}: {len(row['texts'])} segments; conditional SFT takes "
                                    "single-turn rows (prompt, response)")
            prompts = [row["texts"][0] for row in read]
            responses = [response_text(tokenizer, row["texts"][1]) for row in read]
            parts.append(rm.score(prompts, responses, [None] * len(read)).rewards.float())
        out[split] = torch.cat(parts)
    checkpoint.save_work_file(out, path, ctx.is_main, ctx.world_size)
    return out


class ConditionedRows(Indexed[tuple[list[int], list[int]]]):
    """Row i of an SFT split with its prompt conditioned on `scores[i]`, tokenized as it is indexed: the
    conditioned prompt is new text, and a rank holds the rows of its micro-batch, not the split."""

    def __init__(self, rows: Sequence[dict], scores: torch.Tensor, tokenizer: PreTrainedTokenizerBase, template: str):
        self.rows, self.scores, self.tokenizer, self.template = rows, scores.tolist(), tokenizer, template

    def __len__(self) -> int:
        return len(self.rows)

    def item(self, i: int) -> tuple[list[int], list[int]]:
        row = self.rows[i]
        texts, trained = row["texts"], row["train"]
        prompt = conditioning.condition(texts[0], self.template, self.scores[i])
        return encode_segments(self.tokenizer, [prompt, texts[1]], trained)


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg, c = ctx.config, ctx.config.csft
    tokenizer = begin_training(ctx, inputs["sft_model"])
    rows = {split: row_view(inputs["sft_data"], split) for split in ("train", "eval")}
    scored = scores(ctx, rows, tokenizer, inputs.get("reward_model"))
    if ctx.is_main:
        print(f"[{ctx.stage}] scored {len(scored['train'])} SFT rows: reward mean {float(scored['train'].mean()):.3f}, "
              f"std {float(scored['train'].std()):.3f}", flush=True)
    for split, split_rows in rows.items():
        if len(scored[split]) != len(split_rows):  # scores.pt of a resumed run, written for other data
            raise DataError(f"{ctx.work_dir / 'scores.pt'}: {len(scored[split])} {split} scores for {len(split_rows)} "
                            "rows; delete it and rerun")
    train_scores, eval_scores = scored["train"], scored["eval"]
    if c.normalize_reward:
        train_scores, eval_scores = normalized(train_scores, eval_scores)
    train_rows = ConditionedRows(rows["train"], train_scores, tokenizer, c.template)
    eval_rows = ConditionedRows(rows["eval"], eval_scores, tokenizer, c.template)[:]  # held out: tokenized once, not per pass
    model = checkpoint.load_causal_lm(inputs["sft_model"], cfg.model)
    check_trainable(model, c, "csft")
    pad_id = tokenizer.pad_token_id
    engine, outcome = fit_lm(ctx, model, c, train_rows, eval_rows, pad_id)
    state = deepspeed_engine.full_state_dict(engine)
    out = ctx.output_dir / "csft_model"
    if ctx.is_main:
        checkpoint.save(engine.module, tokenizer, out, state_dict=state)
        conditioning.write(out, c.template, c.target_reward)
    metrics = {"eval/loss": outcome.last_eval["loss"], "train/loss": outcome.last_train.get("loss", float("nan"))}
    if outcome.start_step:
        metrics["resumed_from_step"] = float(outcome.start_step)
    return StageResult(outputs={"csft_model": out}, metrics=metrics)
