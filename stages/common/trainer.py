"""The optimizer-step loop every DeepSpeed training stage shares: micro-batches with gradient
accumulation, periodic metrics and progress, eval passes, resumable checkpoints, resume.

A stage supplies what differs: how micro-batch `g` is built, the loss of a batch, and its eval.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from configs.schema import InfraConfig, TrainingConfig
from stages.common import checkpoint, deepspeed_engine, determinism, moe, packing
from stages.common.progress import Progress
from stages.dag.contract import StageContext

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from stages.common.deepspeed_engine import Engine

LOG_EVERY = 10


def begin_training(ctx: StageContext, starting_model: Path) -> PreTrainedTokenizerBase:
    """What every training stage does first: seed Python's, numpy's and torch's generators from `seed`, join
    the DeepSpeed ranks, and load the tokenizer of the model it starts from."""
    determinism.seed_all(ctx.config.seed, ctx.config.infra.deterministic)
    deepspeed_engine.init_distributed()
    return checkpoint.load_tokenizer(starting_model)


def check_trainable(model, section: TrainingConfig, name: str, packed: bool = False) -> None:
    """The loaded model trains as section `name` asks, or a one-line error naming the key: a router for its
    `aux_loss_coef`, position ids for `packing` (`packed`)."""
    moe.check(model.config, section.aux_loss_coef, f"{name}.aux_loss_coef")
    if packed:
        packing.check_loaded(model, f"{name}.packing")


# loss_fn(engine, batch) -> (loss to backpropagate, metrics to average over the log window, tokens seen)
LossFn = Callable[[object, dict], tuple[torch.Tensor, dict[str, float], int]]


@dataclass
class TrainOutcome:
    start_step: int
    last_train: dict[str, float] = field(default_factory=dict)
    last_eval: dict[str, float] = field(default_factory=dict)


def total_steps(n_rows: int, micro_batch_size: int, grad_accum: int, world_size: int, epochs: int, max_steps: int | None) -> int:
    if max_steps is not None:
        return max_steps
    return max(1, math.ceil(n_rows * epochs / (micro_batch_size * grad_accum * world_size)))


class SampleStream:
    """An endless, seeded, per-epoch shuffled order of row indices, sharded by rank.

    Micro-batch `g` of rank `r` is a pure function of (seed, g, r), so resuming at a step needs
    only the step number.
    """

    def __init__(self, n_rows: int, micro_batch_size: int, rank: int, world_size: int, seed: int):
        self.n, self.mbs, self.rank, self.world, self.seed = n_rows, micro_batch_size, rank, world_size, seed
        self._perms: dict[int, torch.Tensor] = {}  # a tensor, not a list: 8 bytes a row, not ~36

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            self._perms = {epoch: torch.randperm(self.n, generator=gen)}
        return self._perms[epoch]

    def micro_batch(self, g: int) -> list[int]:
        start = (g * self.world + self.rank) * self.mbs
        return [int(self._perm(p // self.n)[p % self.n]) for p in range(start, start + self.mbs)]


def eval_batches(rows: Sequence, rank: int, world: int, batch_size: int):
    """This rank's share of `rows` as (batch, weight) pairs, padded so every rank runs the same number
    of forward passes (under ZeRO-3 each one gathers weights from all ranks): a rank that runs out of
    rows gets filler batches of one row with weight 0."""
    mine = rows[rank::world]
    n_batches = math.ceil(math.ceil(len(rows) / world) / batch_size)
    for i in range(n_batches):
        chunk = mine[i * batch_size : (i + 1) * batch_size]
        yield (chunk, 1.0) if chunk else (rows[:1], 0.0)


def build_engine(model: torch.nn.Module, infra: InfraConfig, train: TrainingConfig, steps: int):
    if train.gradient_checkpointing:
        hf = cast("PreTrainedModel", model)  # an HF model, or a wrapper that forwards these (peft's, LastTokenReward)
        hf.gradient_checkpointing_enable()
        hf.config.use_cache = False
    return deepspeed_engine.initialize(model, deepspeed_engine.engine_config(infra, train, steps))


def fit(
    ctx: StageContext,
    model: torch.nn.Module,
    train: TrainingConfig,
    rows: Sequence,
    collate: Callable[[list], dict],
    loss_fn: LossFn,
    evaluate: Callable[[object], dict[str, float]],
):
    """Wrap `model` in a DeepSpeed engine and train it on `rows` (seeded, sharded, resumable).

    `collate` turns a micro-batch of rows into tensors; `evaluate(engine)` returns eval metrics.
    Returns the engine (for saving) and the outcome.
    """
    steps = total_steps(len(rows), train.micro_batch_size, train.grad_accum_steps, ctx.world_size, train.epochs, train.max_steps)
    engine = build_engine(model, ctx.config.infra, train, steps)
    stream = SampleStream(len(rows), train.micro_batch_size, ctx.rank, ctx.world_size, ctx.config.seed)
    outcome = train_loop(
        ctx, engine, train, steps,
        micro_batch=lambda g: collate([rows[i] for i in stream.micro_batch(g)]),
        loss_fn=loss_fn,
        evaluate=lambda: evaluate(engine),
    )
    return engine, outcome


def train_loop(
    ctx: StageContext,
    engine: Engine,
    train: TrainingConfig,
    steps: int,
    micro_batch: Callable[[int], dict],
    loss_fn: LossFn,
    evaluate: Callable[[], dict[str, float]],
) -> TrainOutcome:
    """Run optimizer steps from the last checkpoint (if any) to `steps`; log `train/*` and `eval/*`."""
    ckpt_dir: Path = ctx.work_dir / "checkpoints"
    resumed = deepspeed_engine.load_resumable(engine, ckpt_dir)
    start = resumed["step"] if resumed else 0
    if resumed and ctx.is_main:
        print(f"[{ctx.stage}] resumed from step {start}/{steps} ({ckpt_dir})", flush=True)
    outcome = TrainOutcome(start_step=start)
    progress = Progress(ctx.stage, steps, start=start, enabled=ctx.is_main)
    # the values since the last train log, which that log averages: a checkpoint between two logs keeps them, so
    # a resumed run logs the uninterrupted run's averages
    window: dict[str, list[float]] = resumed.get("window", {}) if resumed else {}
    n_tokens, t0 = 0, time.monotonic()
    engine.train()
    for step in range(start, steps):
        for micro in range(train.grad_accum_steps):
            batch = micro_batch(step * train.grad_accum_steps + micro)
            batch = {k: v.to(engine.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            loss, logs, tokens = loss_fn(engine, batch)
            engine.backward(loss)
            norm = deepspeed_engine.step(engine)
            for key, value in {"loss": loss.item(), **logs, **({"grad_norm": norm} if norm is not None else {})}.items():
                window.setdefault(key, []).append(value)
            n_tokens += tokens
        done = step + 1
        if step == start and ctx.is_main and ctx.started is not None:  # what reading the data and the model cost
            ctx.log_metrics({"time/first_step_s": time.time() - ctx.started}, done)
        if done % LOG_EVERY == 0 or done == steps:
            outcome.last_train = {k: sum(v) / len(v) for k, v in window.items()}
            window = {}
            if ctx.is_main:
                lr = engine.get_lr()[0]
                rate = n_tokens * ctx.world_size / (time.monotonic() - t0)
                ctx.log_metrics({**{f"train/{k}": v for k, v in outcome.last_train.items()},
                                 "train/lr": lr, "train/tokens_per_s": rate}, done)
                progress.show(done, {**outcome.last_train, "lr": lr})
        if done % train.eval_every == 0 or done == steps:
            engine.eval()
            with torch.no_grad():
                outcome.last_eval = evaluate()
            engine.train()
            if ctx.is_main:
                ctx.log_metrics({f"eval/{k}": v for k, v in outcome.last_eval.items()}, done)
                progress.show(done, {f"eval_{k}": v for k, v in outcome.last_eval.items()}, force=True)
        if done % train.save_every == 0 and done < steps:
            deepspeed_engine.save_resumable(engine, ckpt_dir, done, {"window": window}, keep=train.max_checkpoints)
            ctx.on_checkpoint(ckpt_dir, f"step{done}")
    if start >= steps:  # resumed at the end: nothing left to train, still report the eval
        engine.eval()
        with torch.no_grad():
            outcome.last_eval = evaluate()
    return outcome
