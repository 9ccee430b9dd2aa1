"""Knowledge-distillation stage, OpenRLHF's `train_kd`: a student trained on the SFT data with
(1 - kd.kd_coef) x its NLL of the responses plus kd.kd_coef x the divergence (`kd.divergence`: forward
or reverse KL, `stages/kd/losses.py`) between a frozen teacher's next-token distributions and its own.

The teacher is the pipeline's RL or DPO policy (`kd.teacher`; pin `inputs.rl_model` / `inputs.dpo_model`
to take another run's) or `kd.teacher_path`; the student is the SFT policy or a fresh model of
`kd.student_tiny`'s shape with the SFT policy's tokenizer. Both must share the tokenizer and vocabulary:
the stage checks before it trains (the pre-run checks do too, where both are local checkpoints). Each
rank holds a copy of the teacher. Reads `sft_model`, `sft_data` and the teacher; writes `kd_model`;
resumable as every training stage (`stages/common/trainer.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from configs.errors import CheckpointError
from stages.common import checkpoint, deepspeed_engine, moe, vocabulary
from stages.common.trainer import begin_training, check_trainable, eval_batches, fit
from stages.dag.contract import StageContext, StageResult
from stages.data.prepared import token_rows
from stages.data.tokenization import IGNORE_INDEX, pad_batch
from stages.data_prep import tiny_model
from stages.kd.losses import DIVERGENCES, kd_loss, token_nll

if TYPE_CHECKING:
    from configs.schema import PipelineConfig
    from stages.common.deepspeed_engine import Engine



def teacher_of(cfg: PipelineConfig, inputs: dict[str, Path]) -> tuple[str | Path, str]:
    """The teacher checkpoint and the config key that names it (for errors)."""
    kd = cfg.kd
    if kd.teacher == "path":
        assert kd.teacher_path is not None  # the schema requires it with teacher: path
        return kd.teacher_path, f"kd.teacher_path={kd.teacher_path}"
    return inputs[f"{kd.teacher}_model"], f"kd.teacher={kd.teacher}"


def logit_width(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def check_vocabulary(teacher_tokenizer, student_tokenizer, teacher, student, field: str, student_name: str) -> None:
    problem = vocabulary.mismatch(teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab(), logit_width(teacher),
                                  logit_width(student))
    if problem:
        raise CheckpointError(vocabulary.message(field, student_name, problem))


def terms(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, divergence: str):
    """NLL and divergence of a batch, each a mean over its response tokens (logits at position t predict t+1)."""
    labels = labels[:, 1:]
    student_logits, teacher_logits = student_logits[:, :-1], teacher_logits[:, :-1]
    nll = token_nll(student_logits, labels)
    return nll, DIVERGENCES[divergence](student_logits, teacher_logits, labels != IGNORE_INDEX)


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg, kd = ctx.config, ctx.config.kd
    tokenizer = begin_training(ctx, inputs["sft_model"])
    student: PreTrainedModel
    if kd.student == "tiny":
        student, student_name = tiny_model.build_model(kd.student_tiny, tokenizer, cfg.seed), "a fresh kd.student_tiny model"
    else:
        student, student_name = checkpoint.load_causal_lm(inputs["sft_model"], cfg.model), "the SFT policy"
    check_trainable(student, kd, "kd")
    teacher_path, field = teacher_of(cfg, inputs)
    teacher_tokenizer = checkpoint.load_tokenizer(teacher_path)
    teacher = checkpoint.load_frozen_lm(teacher_path, cfg.model, cfg.infra.precision)
    check_vocabulary(teacher_tokenizer, tokenizer, teacher, student, field, student_name)
    for p in teacher.parameters():
        p.requires_grad_(False)

    train_rows, eval_rows = (token_rows(inputs["sft_data"], split) for split in ("train", "eval"))
    pad_id = tokenizer.pad_token_id

    def loss_fn(engine: Engine, batch: dict):
        tokens = int(batch["attention_mask"].sum())
        forward = {k: v for k, v in batch.items() if k != "labels"}
        with torch.no_grad():
            teacher_logits = teacher(**{k: v.to(teacher.device) for k, v in forward.items()}, use_cache=False).logits
        aux: list[torch.Tensor] | None = [] if kd.aux_loss_coef else None
        out = engine(**forward, use_cache=False, **moe.router_kwargs(aux))
        moe.record(aux, engine, out, batch.get("attention_mask"))
        nll, divergence = terms(out.logits, teacher_logits.to(out.logits.device), batch["labels"], kd.divergence)
        logs = {"nll": nll.item(), "kl": divergence.item()}
        return moe.add_aux_loss(kd_loss(nll, divergence, kd.kd_coef), aux, kd.aux_loss_coef, logs), logs, tokens

    def evaluate(engine: Engine) -> dict[str, float]:
        """Token-weighted NLL and divergence over the SFT eval split, sharded across ranks."""
        total = torch.zeros(3, dtype=torch.float64)
        for chunk, weight in eval_batches(eval_rows, ctx.rank, ctx.world_size, kd.micro_batch_size):
            batch = pad_batch(chunk, pad_id)
            n = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum()) * weight
            forward = {k: v for k, v in batch.items() if k != "labels"}
            teacher_logits = teacher(**{k: v.to(teacher.device) for k, v in forward.items()}, use_cache=False).logits
            logits = engine(**{k: v.to(engine.device) for k, v in forward.items()}, use_cache=False).logits
            nll, divergence = terms(logits, teacher_logits.to(logits.device), batch["labels"].to(logits.device), kd.divergence)
            total += torch.tensor([float(nll) * n, float(divergence) * n, n], dtype=torch.float64)
        if ctx.world_size > 1:
            dist.all_reduce(total)
        n_tokens = total[2].clamp(min=1)
        return {"loss": float(total[0] / n_tokens), "kl": float(total[1] / n_tokens)}

    engine, outcome = fit(ctx, student, kd, train_rows, collate=lambda rows: pad_batch(rows, pad_id), loss_fn=loss_fn,
                          evaluate=evaluate)
    state = deepspeed_engine.full_state_dict(engine)
    out = ctx.output_dir / "kd_model"
    if ctx.is_main:
        checkpoint.save(engine.module, tokenizer, out, state_dict=state)
    metrics = {"eval/kl": outcome.last_eval["kl"], "eval/loss": outcome.last_eval["loss"],
               "train/loss": outcome.last_train.get("loss", float("nan"))}
    if outcome.start_step:
        metrics["resumed_from_step"] = float(outcome.start_step)
    return StageResult(outputs={"kd_model": out}, metrics=metrics)
