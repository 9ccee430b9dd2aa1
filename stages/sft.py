"""SFT stage: causal-LM loss on response tokens only, trained with a DeepSpeed engine.

Reads `base_model` and `sft_data`; writes `sft_model` (an HF checkpoint with tokenizer). Every
`sft.save_every` optimizer steps it saves a resumable DeepSpeed checkpoint under the stage's work
dir; a re-run with the same fingerprint continues from there (model, optimizer, scheduler, RNG,
data position), so a killed run loses at most `save_every` steps.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import set_seed

from stages.common import checkpoint, deepspeed_engine
from stages.common.progress import Progress
from stages.common.tokenization import encode_segments, pad_batch
from stages.contract import StageContext, StageResult
from stages.data_prep import read_split

LOG_EVERY = 10


class SampleStream:
    """An endless, seeded, per-epoch shuffled order of row indices, sharded by rank.

    Micro-batch `g` of rank `r` is a pure function of (seed, g, r), so resuming at a step needs
    only the step number.
    """

    def __init__(self, n_rows: int, micro_batch_size: int, rank: int, world_size: int, seed: int):
        self.n, self.mbs, self.rank, self.world, self.seed = n_rows, micro_batch_size, rank, world_size, seed
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            self._perms = {epoch: torch.randperm(self.n, generator=gen).tolist()}
        return self._perms[epoch]

    def micro_batch(self, g: int) -> list[int]:
        start = (g * self.world + self.rank) * self.mbs
        return [self._perm(p // self.n)[p % self.n] for p in range(start, start + self.mbs)]


def total_steps(n_rows: int, micro_batch_size: int, grad_accum: int, world_size: int, epochs: int, max_steps: int | None) -> int:
    if max_steps is not None:
        return max_steps
    return max(1, math.ceil(n_rows * epochs / (micro_batch_size * grad_accum * world_size)))


@torch.no_grad()
def eval_loss(engine, rows: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int, rank: int, world: int) -> float:
    """Token-weighted mean loss over the eval rows, sharded across ranks."""
    engine.eval()
    total = torch.zeros(2, dtype=torch.float64)
    mine = rows[rank::world]
    for i in range(0, len(mine), batch_size):
        batch = pad_batch(mine[i : i + batch_size], pad_id)
        n_tokens = int((batch["labels"][:, 1:] != -100).sum())
        loss = engine(**{k: v.to(engine.device) for k, v in batch.items()}).loss
        total += torch.tensor([float(loss) * n_tokens, n_tokens], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(total)
    engine.train()
    return float(total[0] / max(total[1], 1))


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg, s = ctx.config, ctx.config.sft
    set_seed(cfg.seed)
    deepspeed_engine.init_distributed()

    tokenizer = checkpoint.load_tokenizer(inputs["base_model"])
    model = checkpoint.load_causal_lm(inputs["base_model"], cfg.model)
    if s.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False

    def encode(split: str) -> list[tuple[list[int], list[int]]]:
        return [encode_segments(tokenizer, r["texts"], r["train"]) for r in read_split(inputs["sft_data"], split)]

    train_rows, eval_rows = encode("train"), encode("eval")
    steps = total_steps(len(train_rows), s.micro_batch_size, s.grad_accum_steps, ctx.world_size, s.epochs, s.max_steps)
    engine = deepspeed_engine.initialize(
        model,
        deepspeed_engine.engine_config(
            cfg.infra,
            micro_batch_size=s.micro_batch_size,
            grad_accum_steps=s.grad_accum_steps,
            grad_clip=s.grad_clip,
            lr=s.lr,
            weight_decay=s.weight_decay,
            total_steps=steps,
            warmup_steps=int(s.warmup_ratio * steps),
            min_lr_ratio=s.min_lr_ratio,
        ),
    )
    ckpt_dir = ctx.work_dir / "checkpoints"
    resumed = deepspeed_engine.load_resumable(engine, ckpt_dir)
    start = resumed["step"] if resumed else 0
    if resumed and ctx.is_main:
        print(f"[sft] resumed from step {start}/{steps} ({ckpt_dir})", flush=True)

    stream = SampleStream(len(train_rows), s.micro_batch_size, ctx.rank, ctx.world_size, cfg.seed)
    progress = Progress("sft", steps, start=start, enabled=ctx.is_main)
    pad_id = tokenizer.pad_token_id
    losses: list[float] = []
    n_tokens, t0 = 0, time.monotonic()
    engine.train()
    for step in range(start, steps):
        for micro in range(s.grad_accum_steps):
            idx = stream.micro_batch(step * s.grad_accum_steps + micro)
            batch = pad_batch([train_rows[i] for i in idx], pad_id)
            loss = engine(**{k: v.to(engine.device) for k, v in batch.items()}).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
            n_tokens += int(batch["attention_mask"].sum())
        done = step + 1
        if ctx.is_main and (done % LOG_EVERY == 0 or done == steps):
            recent = sum(losses[-LOG_EVERY * s.grad_accum_steps :]) / len(losses[-LOG_EVERY * s.grad_accum_steps :])
            lr = engine.get_lr()[0]
            tokens_per_s = n_tokens * ctx.world_size / (time.monotonic() - t0)
            ctx.log_metrics({"train/loss": recent, "train/lr": lr, "train/tokens_per_s": tokens_per_s}, done)
            progress.update(done, loss=recent, lr=lr)
        if done % s.eval_every == 0 or done == steps:
            ev = eval_loss(engine, eval_rows, s.micro_batch_size, pad_id, ctx.rank, ctx.world_size)
            if ctx.is_main:
                ctx.log_metrics({"eval/loss": ev}, done)
                progress.update(done, force=True, eval_loss=ev)
        if done % s.save_every == 0 and done < steps:
            deepspeed_engine.save_resumable(engine, ckpt_dir, done)

    state = deepspeed_engine.full_state_dict(engine)
    out = ctx.output_dir / "sft_model"
    final_eval = eval_loss(engine, eval_rows, s.micro_batch_size, pad_id, ctx.rank, ctx.world_size)
    if ctx.is_main:
        checkpoint.save(engine.module, tokenizer, out, state_dict=state)
    metrics = {"eval_loss": final_eval, "train_loss": sum(losses[-LOG_EVERY:]) / max(len(losses[-LOG_EVERY:]), 1)}
    if resumed:
        metrics["resumed_from_step"] = float(start)
    return StageResult(outputs={"sft_model": out}, metrics=metrics)
