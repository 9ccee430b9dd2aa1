"""Rejection sampling (best-of-n) stage: OpenRLHF's `train_rejection_sampling` loop of generate ->
reward -> filter -> SFT, round after round.

Round r samples `rs.samples_per_prompt` responses to `rs.prompts_per_round` fresh prompts (from
`prompts`) with the policy the last round made (the SFT policy first), scores them with the `reward`
section's source, keeps each prompt's best response whose reward reaches `rs.threshold`, and trains
that policy on the kept (prompt, response) rows with the SFT loss: a fresh DeepSpeed engine, optimizer
and schedule per round, `rs.epochs` passes or `rs.max_steps` steps, as OpenRLHF starts a new SFT run.

Resumable: a round's kept rows are saved in the work dir before it trains, its training keeps the
trainer's checkpoints under `round<r>/`, and a finished round's policy is saved there, so a re-run
skips finished rounds and resumes the one that was running. Reads `sft_model`, `sft_data` (its eval
split: `eval/loss`), `prompts` and the pipeline's RM / PRM when the reward scores with them; writes
`rs_model`.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from transformers import set_seed

from configs.errors import DataError
from stages.common import checkpoint, deepspeed_engine, generation, moe
from stages.common.trainer import SampleStream, begin_training, total_steps
from stages.dag.contract import StageContext, StageResult
from stages.data.prepared import row_view, token_rows
from stages.data.tokenization import IGNORE_INDEX
from stages.rewards.factory import build_scorer
from stages.sft.stage import eval_loss, fit_lm

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


Row = tuple[list[int], list[int]]  # token ids, labels (the prompt's masked)


def best_of_n(rewards: torch.Tensor, threshold: float | None) -> list[int | None]:
    """Per prompt (a row of `rewards` [P, n]): the index of its best sample (the first of equals), or
    None when that best scores below `threshold` (None: every best is kept)."""
    best = rewards.argmax(dim=1)
    return [int(b) if threshold is None or float(row[b]) >= threshold else None for row, b in zip(rewards, best)]


def training_row(prompt_ids: list[int], response_ids: list[int]) -> Row:
    """A kept sample as an SFT row: loss on the response's tokens only."""
    return prompt_ids + response_ids, [IGNORE_INDEX] * len(prompt_ids) + response_ids


def sample_round(ctx: StageContext, r: int, policy: Path, tokenizer: PreTrainedTokenizerBase, prompt_rows: Sequence[dict],
                 scorer) -> tuple[list[Row], dict]:
    """Round r's kept rows (every rank gets all of them) and its stats; each rank samples an equal share."""
    s = ctx.config.rs
    stream = SampleStream(len(prompt_rows), s.prompts_per_round, 0, 1, ctx.config.seed)
    rows = [prompt_rows[i] for i in stream.micro_batch(r)][ctx.rank :: ctx.world_size]
    k = s.samples_per_prompt
    prompts = [row["prompt"] for row in rows for _ in range(k)]
    model = checkpoint.load_frozen_lm(policy, ctx.config.model, ctx.config.infra.precision)
    with torch.random.fork_rng():
        torch.manual_seed(ctx.config.seed * 1009 + r * ctx.world_size + ctx.rank)
        sampled = generation.generate(model, tokenizer, prompts, batch_size=s.generate_batch_size,
                                      max_new_tokens=s.max_new_tokens, do_sample=True, temperature=s.temperature, top_p=s.top_p)
    del model
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in sampled]
    rewards = scorer.score(prompts, texts, [row.get("label") for row in rows for _ in range(k)]).rewards.float().view(len(rows), k)
    kept: list[Row] = []
    for i, (row, best) in enumerate(zip(rows, best_of_n(rewards, s.threshold))):
        if best is not None:
            kept.append(training_row(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"], sampled[i * k + best]))
    # kept rows, reward sum, best-of-n sum, top reward, prompts
    local: tuple[list[Row], float, float, float, int] = (
        kept, float(rewards.sum()), float(rewards.max(dim=1).values.sum()), float(rewards.max()), len(rows))
    shares = [local]
    if ctx.world_size > 1:
        shares = [local] * ctx.world_size  # placeholders, each replaced by its rank's share
        dist.all_gather_object(shares, local)
    kept = [row for share in shares for row in share[0]]
    n_prompts = sum(share[4] for share in shares)
    if not kept:
        raise DataError(f"rs.threshold={s.threshold}: round {r + 1} kept no sample (the best of {n_prompts} prompts x {k} "
                        f"samples scored {max(share[3] for share in shares):.3f}); lower rs.threshold or raise "
                        "rs.samples_per_prompt")
    stats = {"reward_mean": sum(share[1] for share in shares) / (n_prompts * k),
             "best_reward_mean": sum(share[2] for share in shares) / n_prompts,
             "kept": float(len(kept)), "kept_share": len(kept) / n_prompts}
    return kept, stats


def round_steps(ctx: StageContext, n_rows: int) -> int:
    s = ctx.config.rs
    return total_steps(n_rows, s.micro_batch_size, s.grad_accum_steps, ctx.world_size, s.epochs, s.max_steps)


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg, s = ctx.config, ctx.config.rs
    tokenizer = begin_training(ctx, inputs["sft_model"])
    pad_id = tokenizer.pad_token_id
    prompt_rows = row_view(inputs["prompts"], "train")
    eval_rows = token_rows(inputs["sft_data"], "eval")
    scorer = build_scorer(cfg.reward, inputs)
    policy, offset, outcome = inputs["sft_model"], 0, None
    for r in range(s.rounds):
        round_dir = ctx.work_dir / f"round{r}"
        saved = round_dir / "kept.pt"
        if saved.is_file():
            kept, stats = (loaded := torch.load(saved, weights_only=True))["rows"], loaded["stats"]
        else:
            kept, stats = sample_round(ctx, r, policy, tokenizer, prompt_rows, scorer)
            if ctx.is_main:
                ctx.log_metrics({f"round/{key}": value for key, value in stats.items()}, offset)
                print(f"[{ctx.stage}] round {r + 1}/{s.rounds}: reward mean {stats['reward_mean']:.3f} (best of "
                      f"{s.samples_per_prompt}: {stats['best_reward_mean']:.3f}), kept {int(stats['kept'])} "
                      f"({stats['kept_share']:.0%})", flush=True)
            checkpoint.save_work_file({"rows": kept, "stats": stats}, saved, ctx.is_main, ctx.world_size)
        finished = round_dir / "policy"
        if (finished / "config.json").is_file():
            policy, offset = finished, offset + round_steps(ctx, len(kept))
            continue
        model = checkpoint.load_causal_lm(policy, cfg.model)
        moe.check(model.config, s.aux_loss_coef, "rs.aux_loss_coef")
        start = offset  # each round's optimizer steps follow the last round's in the stage's metric series

        def log_round(metrics: dict[str, float], step: int, start: int = start) -> None:
            ctx.log_metrics(metrics, start + step)

        round_ctx = dataclasses.replace(ctx, work_dir=round_dir, log_metrics=log_round)
        # the round's generators start from its own seed, not from where the rounds before left them: a run that
        # resumes here, its earlier rounds finished, trains as the uninterrupted run (dropout draws from them)
        set_seed(cfg.seed + r)
        engine, outcome = fit_lm(round_ctx, model, s, kept, eval_rows, pad_id)
        state = deepspeed_engine.full_state_dict(engine)
        if ctx.is_main:
            tmp = round_dir / "policy.tmp"
            checkpoint.save(engine.module, tokenizer, tmp, state)
            tmp.replace(finished)  # a killed save leaves no policy a resume would trust
        if ctx.world_size > 1:
            dist.barrier()
        del engine, model, state
        deepspeed_engine.release_engines()  # the next round's engine starts with the memory free
        policy, offset = finished, offset + round_steps(ctx, len(kept))
    out = ctx.output_dir / "rs_model"
    if ctx.is_main:
        shutil.copytree(policy, out)
    metrics = {"round/kept_share": stats["kept_share"], "round/best_reward_mean": stats["best_reward_mean"]}
    if outcome is not None:
        metrics |= {"eval/loss": outcome.last_eval["loss"], "train/loss": outcome.last_train.get("loss", float("nan"))}
    else:  # every round was finished before: evaluate the saved policy as the last round did
        model = checkpoint.load_frozen_lm(policy, cfg.model)
        with torch.no_grad():
            metrics["eval/loss"] = eval_loss(model, eval_rows, s.micro_batch_size, pad_id, 0, 1)
    return StageResult(outputs={"rs_model": out}, metrics=metrics)
