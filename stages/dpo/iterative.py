"""Iterative (online) DPO: preference pairs made from the policy's own samples, one round at a time.

Round r starts at optimizer step r * (max_steps // rounds) (the last round takes the remainder). It
samples `samples_per_prompt` responses to each of `prompts_per_round` prompts with the current
policy, scores them with the reward scorer (the `reward` section: RM, PRM, rule function or remote)
and pairs each prompt's best response with its worst; a prompt whose samples all score the same
gives no pair. The round's reference is the policy it starts from (as in Self-Rewarding LMs): its
log-probs of the pairs are taken before the round trains. Each round's pairs and reference are saved
in the work dir before training on them, so a resumed run trains on exactly the pairs it would have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from configs.errors import ConfigError, DataError
from stages.common import checkpoint, generation
from stages.common.trainer import SampleStream
from stages.dag.contract import StageContext

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from stages.common.deepspeed_engine import Engine


Seq = tuple[list[int], list[int]]  # prompt ids, response ids


def best_worst_pairs(rewards: torch.Tensor) -> list[tuple[int, int] | None]:
    """Per prompt (a row of `rewards` [P, K]): the indices of its best and worst sample (the first of
    equals), or None when all K scored the same."""
    best, worst = rewards.argmax(dim=1), rewards.argmin(dim=1)
    return [None if bool(row.max() == row.min()) else (int(b), int(w)) for row, b, w in zip(rewards, best, worst)]


class Objective(Protocol):
    """The loss over a round's pairs: stages.dpo.stage's PairObjective or KTOObjective."""

    n_rows: int
    pairs: list[tuple[Seq, Seq]]

    def collate(self, ref: torch.Tensor, idx: list[int]) -> dict: ...

    def loss(self, engine: Engine, batch: dict) -> tuple[torch.Tensor, dict[str, float], int]: ...


@dataclass
class Round:
    objective: Objective  # over the round's pairs
    ref: torch.Tensor  # the round-start policy's log-probs of the objective's sequences
    stats: dict[str, float]


class Rounds:
    """Makes (or reloads) the round a micro-batch belongs to and hands out its micro-batches.

    `make_objective(pairs)` builds the loss over pairs; `reference(engine, objective)` scores its
    sequences with the engine's current weights (on every rank)."""

    def __init__(self, ctx: StageContext, tokenizer: PreTrainedTokenizerBase, prompt_rows: Sequence[dict], scorer,
                 make_objective: Callable[[list[tuple[Seq, Seq]]], Objective], reference: Callable[[Any, Objective], torch.Tensor]):
        d = ctx.config.dpo
        self.ctx, self.d, self.it = ctx, d, d.iterative
        self.tokenizer, self.scorer = tokenizer, scorer
        self.make_objective, self.reference = make_objective, reference
        self.rows = prompt_rows
        if self.it.prompts_per_round % ctx.world_size:
            raise DataError(f"dpo.iterative.prompts_per_round={self.it.prompts_per_round}: must be a multiple of the "
                            f"{ctx.world_size} ranks (each samples an equal share)")
        if d.max_steps is None:  # the config's validation requires it with iterative.rounds
            raise ConfigError(f"dpo.iterative.rounds={self.it.rounds} splits dpo.max_steps between the rounds: set dpo.max_steps")
        self.max_steps: int = d.max_steps
        self.steps_per_round = self.max_steps // self.it.rounds
        self.prompt_stream = SampleStream(len(prompt_rows), self.it.prompts_per_round, 0, 1, ctx.config.seed)
        self.dir = ctx.work_dir / "rounds"
        self.current: tuple[int, Round] | None = None

    def round_of(self, step: int) -> int:
        return min(step // self.steps_per_round, self.it.rounds - 1)

    def micro_batch(self, engine: Engine, g: int) -> dict:
        step = g // self.d.grad_accum_steps
        r = self.round_of(step)
        rnd = self.get(r, engine)
        local = g - r * self.steps_per_round * self.d.grad_accum_steps
        stream = SampleStream(rnd.objective.n_rows, self.d.micro_batch_size, self.ctx.rank, self.ctx.world_size,
                              self.ctx.config.seed + r)
        return rnd.objective.collate(rnd.ref, stream.micro_batch(local))

    def loss(self, engine: Engine, batch: dict) -> tuple[torch.Tensor, dict[str, float], int]:
        if self.current is None:
            raise RuntimeError("Rounds.loss before any micro_batch: the training loop collates a batch first")
        return self.current[1].objective.loss(engine, batch)

    def get(self, r: int, engine: Engine) -> Round:
        if self.current is None or self.current[0] != r:
            path = self.dir / f"round{r}.pt"
            if path.is_file():
                saved = torch.load(path, weights_only=True)
                objective = self.make_objective(saved["pairs"])
                rnd = Round(objective, saved["ref"], saved["stats"])
            else:
                engine.eval()
                rnd = self.make(r, engine)
                engine.train()
                checkpoint.save_work_file({"pairs": rnd.objective.pairs, "ref": rnd.ref, "stats": rnd.stats}, path,
                                          self.ctx.is_main, self.ctx.world_size)
                if self.ctx.is_main:  # the newest round's file, for a rerun on a node without this work dir
                    (self.dir / "latest").write_text(path.name)
                self.ctx.on_checkpoint(self.dir, path.name)
            self.current = (r, rnd)
        return self.current[1]

    def make(self, r: int, engine: Engine) -> Round:
        ctx, it = self.ctx, self.it
        rows = [self.rows[i] for i in self.prompt_stream.micro_batch(r)][ctx.rank :: ctx.world_size]
        k = it.samples_per_prompt
        prompts = [row["prompt"] for row in rows for _ in range(k)]
        with torch.random.fork_rng():
            torch.manual_seed(ctx.config.seed * 1009 + r * ctx.world_size + ctx.rank)
            sampled = generation.generate(
                engine.module, self.tokenizer, prompts, batch_size=it.generate_batch_size, max_new_tokens=it.max_new_tokens,
                do_sample=True, temperature=it.temperature, top_p=it.top_p,
                synced_gpus=ctx.world_size > 1 and ctx.config.infra.zero_stage == 3,  # ZeRO-3: ranks forward in lockstep
            )
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in sampled]
        rewards = self.scorer.score(prompts, texts, [row.get("label") for row in rows for _ in range(k)]).rewards
        rewards = rewards.float().view(len(rows), k)
        pairs: list[tuple[Seq, Seq]] = []
        for i, (row, picked) in enumerate(zip(rows, best_worst_pairs(rewards))):
            if picked is not None:
                prompt_ids = self.tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
                best, worst = picked
                pairs.append(((prompt_ids, sampled[i * k + best]), (prompt_ids, sampled[i * k + worst])))
        # pairs, reward sum, best-of-k sum, prompts
        local: tuple[list[tuple[Seq, Seq]], float, float, int] = (
            pairs, float(rewards.sum()), float(rewards.max(dim=1).values.sum()), len(rows))
        shares = [local]
        if ctx.world_size > 1:
            shares = [local] * ctx.world_size  # placeholders, each replaced by its rank's share
            dist.all_gather_object(shares, local)
        pairs = [p for share in shares for p in share[0]]
        n_prompts = sum(share[3] for share in shares)
        stats = {"reward_mean": sum(s[1] for s in shares) / (n_prompts * k), "best_reward_mean": sum(s[2] for s in shares) / n_prompts,
                 "pairs": float(len(pairs)), "prompts": float(n_prompts)}
        if not pairs:
            raise DataError(f"dpo iterative round {r}: all {k} samples of every prompt scored the same, so there is no "
                            "pair to learn from; raise dpo.iterative.temperature or samples_per_prompt")
        objective = self.make_objective(pairs)
        ref = self.reference(engine, objective)
        if ctx.is_main:
            ctx.log_metrics({f"round/{key}": value for key, value in stats.items()}, r * self.steps_per_round)
            print(f"[{ctx.stage}] round {r + 1}/{it.rounds}: {n_prompts} prompts x {k} samples, reward mean "
                  f"{stats['reward_mean']:.3f} (best of {k}: {stats['best_reward_mean']:.3f}), {len(pairs)} pairs", flush=True)
        return Round(objective, ref, stats)
