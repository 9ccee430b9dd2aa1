"""SFT stage: causal-LM loss on response tokens only, trained with a DeepSpeed engine.

With `sft.packing` each micro-batch is one padding-free row (the same samples end to end, position
ids restarting per sample), which trains exactly as the padded batch does without computing on pads.

Reads `base_model` and `sft_data`; writes `sft_model` (an HF checkpoint with tokenizer). Every
`sft.save_every` optimizer steps it saves a resumable DeepSpeed checkpoint under the stage's work
dir; a re-run with the same fingerprint continues from there (model, optimizer, scheduler, RNG,
data position), so a killed run loses at most `save_every` steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from stages.common import deepspeed_engine, lora, moe
from stages.common.trainer import begin_training, check_trainable, eval_batches, fit
from stages.dag.contract import StageContext, StageResult
from stages.data.prepared import token_rows
from stages.data.tokenization import IGNORE_INDEX, pack_batch, pad_batch

if TYPE_CHECKING:
    from stages.common.deepspeed_engine import Engine



def lm_loss(engine: Engine, batch: dict, aux_loss_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float], int]:
    """Mean token cross-entropy over the response tokens (HF shifts the labels). No KV cache: with one,
    transformers would not derive the per-sample mask of a packed row from its position ids.
    With `aux_loss_coef` (an MoE model) the router's load-balancing loss is added, times the
    coefficient; the cross-entropy is then taken from the logits with the model's own loss function
    (given labels, HF would add its `router_aux_loss_coef` times the same loss)."""
    tokens = int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
    if not aux_loss_coef:
        return engine(**batch, use_cache=False).loss, {}, tokens
    model = getattr(engine, "module", engine)
    aux: list[torch.Tensor] = []
    logs: dict[str, float] = {}
    out = engine(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False, **moe.router_kwargs(aux))
    moe.record(aux, model, out, batch.get("attention_mask"))
    loss = model.loss_function(logits=out.logits, labels=batch["labels"], vocab_size=model.config.vocab_size)
    return moe.add_aux_loss(loss, aux, aux_loss_coef, logs), logs, tokens


def eval_loss(engine: Engine, rows: Sequence[tuple[list[int], list[int]]], batch_size: int, pad_id: int, rank: int, world: int) -> float:
    """Token-weighted mean loss over the eval rows, sharded across ranks."""
    total = torch.zeros(2, dtype=torch.float64)
    for chunk, weight in eval_batches(rows, rank, world, batch_size):
        batch = pad_batch(chunk, pad_id)
        n_tokens = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum()) * weight
        loss = engine(**{k: v.to(engine.device) for k, v in batch.items()}, use_cache=False).loss
        total += torch.tensor([float(loss) * n_tokens, n_tokens], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(total)
    return float(total[0] / total[1].clamp(min=1))


def fit_lm(ctx: StageContext, model, train, train_rows: Sequence, eval_rows: Sequence, pad_id: int, packing: bool = False):
    """`fit` with the SFT objective (response-token NLL, plus the MoE router loss) and held-out loss: the
    SFT stage's training, and that of the stages that fine-tune on responses of their own (rs, csft)."""
    return fit(
        ctx, model, train, train_rows,
        collate=pack_batch if packing else lambda rows: pad_batch(rows, pad_id),
        loss_fn=lambda engine, batch: lm_loss(engine, batch, train.aux_loss_coef),
        evaluate=lambda engine: {"loss": eval_loss(engine, eval_rows, train.micro_batch_size, pad_id, ctx.rank, ctx.world_size)},
    )


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg, s = ctx.config, ctx.config.sft
    tokenizer = begin_training(ctx, inputs["base_model"])
    model, signature = lora.load_for_training(inputs["base_model"], cfg.model, s.lora, "sft.lora")
    check_trainable(model, s, "sft", packed=s.packing)

    train_rows, eval_rows = (token_rows(inputs["sft_data"], split) for split in ("train", "eval"))
    pad_id = tokenizer.pad_token_id
    engine, outcome = fit_lm(ctx, model, s, train_rows, eval_rows, pad_id, packing=s.packing)

    state = deepspeed_engine.full_state_dict(engine)
    out = ctx.output_dir / "sft_model"
    if ctx.is_main:
        lora.save_trained(engine.module, tokenizer, out, state, signature)
    metrics = {"eval/loss": outcome.last_eval["loss"], "train/loss": outcome.last_train.get("loss", float("nan"))}
    if outcome.start_step:
        metrics["resumed_from_step"] = float(outcome.start_step)
    return StageResult(outputs={"sft_model": out}, metrics=metrics)
