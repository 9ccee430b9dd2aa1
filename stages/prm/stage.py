"""Process reward model stage: a causal LM, initialised from the SFT checkpoint, that labels steps.

Reads `sft_model` and `prm_data` (each step ends with the placeholder token, one label per step);
writes `prm`. The loss is cross-entropy over the two reward tokens (good, bad) of the logits at the
placeholder positions only, as OpenRLHF's `--placeholder_token` / `--reward_tokens`. The checkpoint's
config records the placeholder, the reward tokens and the step separator for the scorers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from configs.errors import CheckpointError, DataError
from stages.common import deepspeed_engine, lora, moe, packing
from stages.common.trainer import begin_training, check_trainable, eval_batches, fit
from stages.dag.contract import StageContext, StageResult
from stages.data.prepared import MappedRows, field_ids, ids_column, load
from stages.data.tokenization import IGNORE_INDEX, pad_batch
from stages.prm.losses import prm_loss

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from stages.common.deepspeed_engine import Engine



def single_token_id(tokenizer: PreTrainedTokenizerBase, token: str, field: str) -> int:
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise CheckpointError(f"{field}={token!r}: the tokenizer splits it into {len(ids)} tokens; it must be one token")
    return ids[0]


PRM_COLUMNS = (ids_column("prompt"), ids_column("response"), "labels")


def encode_prm_row(tokenizer: PreTrainedTokenizerBase, row: dict, placeholder_id: int, reward_ids: tuple[int, int],
                   reward_tokens: tuple[str, str], where: str) -> tuple[list[int], list[int]]:
    """Ids of prompt + response (data prep's where the row has them) and labels that hold a reward-token id at
    each placeholder, -100 elsewhere."""
    ids = field_ids(tokenizer, row, "prompt") + field_ids(tokenizer, row, "response")
    positions = [i for i, t in enumerate(ids) if t == placeholder_id]
    if len(positions) != len(row["labels"]):
        raise DataError(f"{where}: {len(positions)} step placeholders but {len(row['labels'])} labels")
    labels = [IGNORE_INDEX] * len(ids)
    for pos, label in zip(positions, row["labels"]):
        if label not in reward_tokens:
            raise DataError(f"{where}: label {label!r} is not one of prm.reward_tokens {list(reward_tokens)}")
        labels[pos] = reward_ids[reward_tokens.index(label)]
    return ids, labels


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg, p = ctx.config, ctx.config.prm
    tokenizer = begin_training(ctx, inputs["sft_model"])
    model, signature = lora.load_for_training(inputs["sft_model"], cfg.model, p.lora, "prm.lora")
    check_trainable(model, p, "prm", packed=p.packing)
    placeholder_id = single_token_id(tokenizer, p.placeholder_token, "prm.placeholder_token")
    good, bad = p.reward_tokens
    reward_ids = (single_token_id(tokenizer, good, "prm.reward_tokens"), single_token_id(tokenizer, bad, "prm.reward_tokens"))

    def encode(split: str) -> MappedRows[tuple[list[int], list[int]]]:
        """The split's rows as (ids, labels), made from data prep's ids as a batch reads them (data prep checked
        each row's placeholders against its labels)."""
        def make(row: dict) -> tuple[list[int], list[int]]:
            return encode_prm_row(tokenizer, row, placeholder_id, reward_ids, p.reward_tokens, f"prm_data/{split}")
        return MappedRows(load(inputs["prm_data"], split), PRM_COLUMNS, make, "a PRM split")

    train_rows, eval_rows = encode("train"), encode("eval")
    pad_id = tokenizer.pad_token_id

    def loss_fn(engine: Engine, batch):
        aux: list | None = [] if p.aux_loss_coef else None
        loss, correct = prm_loss(packing.logits(engine, batch, p.packing, aux), batch["labels"], reward_ids)
        logs = {"step_accuracy": float(correct.mean())}
        return moe.add_aux_loss(loss, aux, p.aux_loss_coef, logs), logs, int(batch["attention_mask"].sum())

    def evaluate(engine: Engine) -> dict[str, float]:
        sums = torch.zeros(3, dtype=torch.float64)  # loss*n, correct, n
        for chunk, weight in eval_batches(eval_rows, ctx.rank, ctx.world_size, p.micro_batch_size):
            batch = {k: v.to(engine.device) for k, v in pad_batch(chunk, pad_id).items()}
            loss, correct = prm_loss(packing.logits(engine, batch, p.packing), batch["labels"], reward_ids)
            n = len(correct) * weight
            sums += torch.tensor([float(loss) * n, float(correct.sum()) * weight, n], dtype=torch.float64)
        if ctx.world_size > 1:
            dist.all_reduce(sums)
        n = max(float(sums[2]), 1.0)
        return {"loss": float(sums[0]) / n, "step_accuracy": float(sums[1]) / n}

    engine, outcome = fit(
        ctx, model, p, train_rows, collate=lambda rows: pad_batch(rows, pad_id), loss_fn=loss_fn, evaluate=evaluate
    )
    state = deepspeed_engine.full_state_dict(engine)
    out = ctx.output_dir / "prm"
    if ctx.is_main:
        fields = {"prm_placeholder_token": p.placeholder_token, "prm_reward_tokens": list(p.reward_tokens),
                  "prm_step_separator": p.step_separator}
        lora.save_trained(engine.module, tokenizer, out, state, signature, fields)
    metrics = {f"eval/{k}": v for k, v in outcome.last_eval.items()}
    if outcome.start_step:
        metrics["resumed_from_step"] = float(outcome.start_step)
    return StageResult(outputs={"prm": out}, metrics=metrics)
