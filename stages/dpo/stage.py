"""DPO stage: direct preference optimisation of the SFT policy (DPO, IPO, cDPO or KTO).

Reads `sft_model` and `pref_data` (iterative DPO also `prompts` and the reward's checkpoints);
writes `dpo_model`, an HF causal-LM checkpoint (or a LoRA adapter). The reference model is the SFT
checkpoint the policy starts from: its log-probs of the training sequences the run will draw and of
every eval sequence are computed once, before the policy's engine is built (TRL's
`precompute_ref_log_probs`), and kept in the work dir, so no second model sits in memory while
training and a resumed run reuses them. With `dpo.iterative.rounds` the training pairs come from the
policy's own samples, round by round (stages/dpo/iterative.py); eval keeps the SFT reference.

`dpo.loss` picks the objective (declared in configs/dpo_objectives.py): `sigmoid` (DPO; with
`label_smoothing` > 0, cDPO), `ipo` (on length-averaged log-probs) or `kto` (on unpaired examples: the
rows of `data.preference.unpaired`, OpenRLHF's KTO data, or each pair split into a desirable and an
undesirable example; the KL reference point comes from mismatched prompt/completion pairs). Eval reports
the implicit reward accuracy, margin and rewards on the held-out pairs for every objective; on held-out
unpaired examples, KTO's loss, the rewards of each kind and how often a desirable example outscores an
undesirable one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoConfig, PreTrainedTokenizerBase

from configs.dpo_objectives import DPO_OBJECTIVES
from configs.errors import DataError
from configs.schema import DPOConfig
from stages.common import checkpoint, checkpoint_paths, deepspeed_engine, lora, moe, packing, shared_prompt
from stages.common.shared_prompt import MASKED_ATTENTION, attention_window
from stages.common.trainer import SampleStream, begin_training, build_engine, eval_batches, fit, total_steps, train_loop
from stages.dag.contract import StageContext, StageResult
from stages.data import prepared as prepared_data
from stages.data.prepared import field_ids
from stages.dpo.iterative import Rounds
from stages.dpo.losses import (
    chosen_nll,
    dpo_loss,
    kto_loss,
    kto_reference_point,
    sequence_logps,
    token_logps,
)
from stages.dpo.pairs import (
    DESIRABLE,
    Pair,
    PairShape,
    PairSides,
    Seq,
    SplitPairs,
    WithKLSequences,
    is_unpaired,
    stored_examples,
    stored_pairs,
)
from stages.rewards.factory import build_scorer

if TYPE_CHECKING:
    from stages.common.deepspeed_engine import Engine


REFERENCE_FILE = "reference_logps.pt"


def encode_examples(tokenizer: PreTrainedTokenizerBase, rows: list[dict]) -> tuple[list[Seq], list[bool]]:
    """Unpaired rows as (prompt, response) sequences, tokenized apart (data prep's ids where the rows have
    them), and whether each is desirable."""
    return ([(field_ids(tokenizer, r, "prompt"), field_ids(tokenizer, r, "response")) for r in rows],
            [bool(r[DESIRABLE]) for r in rows])


def encode_pairs(tokenizer: PreTrainedTokenizerBase, rows: list[dict]) -> list[tuple[Seq, Seq]]:
    """(chosen, rejected) sequences, prompt and responses tokenized apart as the policy produces them (data
    prep's ids where the rows have them)."""
    def ids(row: dict, field: str) -> list[int]:
        return field_ids(tokenizer, row, field)

    return [((ids(r, "prompt"), ids(r, "chosen")), (ids(r, "prompt"), ids(r, "rejected"))) for r in rows]


def sequence_batch(seqs: list[Seq], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response rows with a mask of the response tokens."""
    width = max(len(p) + len(r) for p, r in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    response_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (prompt, response) in enumerate(seqs):
        n = len(prompt) + len(response)
        input_ids[i, :n] = torch.tensor(prompt + response)
        attention_mask[i, :n] = 1
        response_mask[i, len(prompt) : n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask}


def response_logps(model, batch: dict[str, torch.Tensor], aux: list | None = None, packed: bool = False,
                   shared: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed log-prob of the response tokens, and how many there are; with `packed`
    (`dpo.packing`) from one padding-free row; with `shared` (`dpo.shared_prompt`) the rows that share
    a prompt (a pair's two, and any other pair of the same prompt) as one row, the prompt once
    (stages/common/shared_prompt.py). `aux`: where an MoE model's router load-balancing loss is
    appended (stages.common.moe)."""
    logits = shared_prompt.logits(model, batch, prefix=batch["response_mask"].argmax(-1)) if shared else packing.logits(model, batch, packed, aux)
    mask = batch["response_mask"][:, 1:]
    logps = token_logps(logits[:, :-1], batch["input_ids"][:, 1:])
    return sequence_logps(logps, mask), mask.sum(-1)


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def reference_logps(engine: Engine, seqs: list[Seq], batch_size: int, pad_id: int, rank: int, world: int,
                    packed: bool = False) -> torch.Tensor:
    """Summed response log-probs of every sequence under the engine's current weights, on every rank
    (each rank scores `seqs[rank::world]`, then the shares are gathered)."""
    mine: list[float] = []
    for chunk, weight in eval_batches(seqs, rank, world, batch_size):
        sums, _ = response_logps(engine, to_device(sequence_batch(chunk, pad_id), engine.device), packed=packed)
        if weight:
            mine.extend(sums.tolist())
    shares = [mine]
    if world > 1:
        shares = [mine] * world  # placeholders, each replaced by its rank's share
        dist.all_gather_object(shares, mine)
    out = [0.0] * len(seqs)
    for r, values in enumerate(shares):
        out[r::world] = values
    return torch.tensor(out, dtype=torch.float32)


class PairObjective:
    """DPO / cDPO / IPO on (chosen, rejected) pairs; row i is pair i. With `shared_prompt` (and pairs
    whose non-empty responses share the prompt, as every pair built here does) the rows of one prompt
    run as one row (`response_logps`), else as two padded rows per pair. A model with a sliding `window` shares
    only when no sequence is longer than it (the shared row's mask has no window), and a router loss
    (`aux_loss_coef`) is computed from padded rows (HF's MoE forward reads the mask as [B, T]).
    `packing` passes the two-row layout as one padding-free row instead (its restarting position ids
    cannot let a rejected response see a prompt laid out before the chosen one)."""

    def __init__(self, cfg: DPOConfig, pairs: Sequence[Pair], pad_id: int, shared_prompt: bool = False,
                 window: int | None = None, shape: PairShape | None = None):
        """`shape`: the pairs' (stored_pairs gives it from the stored lengths), else read from the pairs."""
        self.cfg, self.pad_id, self.n_rows, self.pairs = cfg, pad_id, len(pairs), pairs
        # the sequences whose reference log-probs the rows need: chosen ones, then rejected ones
        self.sequences = PairSides(pairs)
        if shared_prompt:
            shape = shape or PairShape.of(pairs)
            shared_prompt = shape.shares_prompts and (window is None or shape.longest <= window)
        self.shared_prompt = shared_prompt and not (cfg.aux_loss_coef or cfg.packing)

    def sequence_ids(self, rows: list[int]) -> list[int]:
        return rows + [self.n_rows + i for i in rows]

    def collate(self, ref: torch.Tensor, idx: list[int]) -> dict:
        rejected = [self.n_rows + i for i in idx]
        seqs = [self.sequences[i] for i in idx + rejected]
        batch = sequence_batch(seqs, self.pad_id)
        batch["ref"] = ref[idx + rejected]
        batch["tokens"] = torch.tensor(sum(len(p) + len(r) for p, r in seqs))  # both sequences' tokens, either layout
        return batch

    def pair_terms(self, model, batch: dict, aux: list | None = None):
        """Per pair: losses, chosen / rejected implicit rewards; also the chosen responses' NLL."""
        sums, counts = response_logps(model, batch, aux, self.cfg.packing, self.shared_prompt)
        policy, ref = sums, batch["ref"]
        objective = DPO_OBJECTIVES[self.cfg.loss]
        if objective.length_average:
            policy, ref = sums / counts.clamp(min=1), ref / counts.clamp(min=1)
        (pc, pr), (rc, rr) = policy.chunk(2), ref.chunk(2)
        losses, chosen, rejected = dpo_loss(pc, pr, rc, rr, self.cfg.beta, objective.pair_loss, self.cfg.label_smoothing)
        chosen_sums, chosen_counts = sums.chunk(2)[0], counts.chunk(2)[0]
        return losses, chosen, rejected, chosen_nll(chosen_sums, chosen_counts)

    def loss(self, engine: Engine, batch: dict) -> tuple[torch.Tensor, dict[str, float], int]:
        aux: list[torch.Tensor] | None = [] if self.cfg.aux_loss_coef else None
        losses, chosen, rejected, nll = self.pair_terms(engine, batch, aux)
        loss = losses.mean()
        if self.cfg.nll_loss_coef:
            loss = loss + self.cfg.nll_loss_coef * nll
        logs = {**pair_logs(chosen, rejected), "nll": nll.item()}
        return moe.add_aux_loss(loss, aux, self.cfg.aux_loss_coef, logs), logs, int(batch["tokens"])


class KTOObjective:
    """KTO on unpaired examples: `examples` (sequences and whether each is desirable), or `pairs` split,
    pair i giving example 2i (chosen, desirable) and 2i+1 (rejected, undesirable). Example j's KL sequence
    is its prompt with the completion of another prompt's example (`mismatched`: j+2 for split pairs, as
    j+1 shares the prompt); their log-ratios estimate the reference point z0."""

    def __init__(self, cfg: DPOConfig, pairs: Sequence[Pair], pad_id: int, world: int,
                 examples: tuple[Sequence[Seq], Sequence[bool] | np.ndarray] | None = None):
        self.cfg, self.pad_id, self.world, self.pairs = cfg, pad_id, world, pairs
        if examples is None:
            split = SplitPairs(pairs)
            examples, start = (split, np.arange(len(split)) % 2 == 0), 2
        else:
            start = 1
        seqs, self.desirable = examples
        self.n_rows = len(seqs)
        self.sequences = WithKLSequences(seqs, start)

    def sequence_ids(self, rows: list[int]) -> list[int]:
        return rows + [self.n_rows + j for j in rows]

    def collate(self, ref: torch.Tensor, idx: list[int]) -> dict:
        kl_idx = [self.n_rows + j for j in idx]
        batch = sequence_batch([self.sequences[j] for j in idx], self.pad_id)
        kl = sequence_batch([self.sequences[j] for j in kl_idx], self.pad_id)
        batch.update({f"kl_{k}": v for k, v in kl.items()})
        batch["ref"], batch["ref_kl"] = ref[idx], ref[kl_idx]
        batch["desirable"] = torch.tensor([bool(self.desirable[j]) for j in idx])
        return batch

    def terms(self, engine: Engine, batch: dict, aux: list | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per example: KTO's losses and implicit rewards; and the batch's reference point z0."""
        sums, _ = response_logps(engine, batch, aux, self.cfg.packing)
        with torch.no_grad():
            kl_batch = {k.removeprefix("kl_"): v for k, v in batch.items() if k.startswith("kl_")}
            kl_sums, _ = response_logps(engine, kl_batch, packed=self.cfg.packing)
        z0 = kto_reference_point(kl_sums, batch["ref_kl"], self._mean_over_ranks if self.world > 1 else None)
        losses, rewards = kto_loss(sums, batch["ref"], batch["desirable"], z0, self.cfg.beta,
                                   self.cfg.desirable_weight, self.cfg.undesirable_weight)
        return losses, rewards, z0

    def loss(self, engine: Engine, batch: dict) -> tuple[torch.Tensor, dict[str, float], int]:
        aux: list[torch.Tensor] | None = [] if self.cfg.aux_loss_coef else None
        losses, rewards, z0 = self.terms(engine, batch, aux)
        good = batch["desirable"]
        logs = {"kl": float(z0)}
        if good.any():
            logs["desirable_reward"] = float(rewards[good].mean())
        if (~good).any():
            logs["undesirable_reward"] = float(rewards[~good].mean())
        return moe.add_aux_loss(losses.mean(), aux, self.cfg.aux_loss_coef, logs), logs, int(batch["attention_mask"].sum())

    def _mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(value)
        return value / self.world


def pair_logs(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    return {
        "reward_accuracy": float((chosen > rejected).float().mean()),
        "chosen_reward": float(chosen.mean()),
        "rejected_reward": float(rejected.mean()),
        "margin": float((chosen - rejected).mean()),
    }


def eval_pairs(engine: Engine, objective: PairObjective, ref: torch.Tensor, batch_size: int, rank: int, world: int) -> dict[str, float]:
    """Held-out pairs: implicit reward accuracy, rewards and margin; the pair loss and chosen NLL."""
    keys = ("loss", "reward_accuracy", "chosen_reward", "rejected_reward", "margin", "nll")
    sums = torch.zeros(len(keys) + 1, dtype=torch.float64)
    for chunk, weight in eval_batches(list(range(objective.n_rows)), rank, world, batch_size):
        batch = to_device(objective.collate(ref, chunk), engine.device)
        losses, chosen, rejected, nll = objective.pair_terms(engine, batch)
        n = len(chunk) * weight
        logs = {"loss": float(losses.mean()), **pair_logs(chosen, rejected), "nll": float(nll)}
        sums += torch.tensor([logs[k] * n for k in keys] + [n], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(sums)
    n = max(float(sums[-1]), 1.0)
    return {k: float(v) / n for k, v in zip(keys, sums[:-1])}


def eval_examples(engine: Engine, objective: KTOObjective, ref: torch.Tensor, batch_size: int, rank: int, world: int) -> dict[str, float]:
    """Held-out unpaired examples: KTO's loss and reference point, the mean implicit reward of the desirable
    and of the undesirable ones and their margin, and reward_accuracy: the share of (desirable, undesirable)
    pairs of examples the implicit reward orders right (the pair metric's counterpart)."""
    sums = torch.zeros(3, dtype=torch.float64)  # loss*n, kl*n, n
    mine: list[tuple[float, bool]] = []
    for chunk, weight in eval_batches(list(range(objective.n_rows)), rank, world, batch_size):
        batch = to_device(objective.collate(ref, chunk), engine.device)
        losses, rewards, z0 = objective.terms(engine, batch)
        n = len(chunk) * weight
        sums += torch.tensor([float(losses.mean()) * n, float(z0) * n, n], dtype=torch.float64)
        if weight:
            mine += zip(rewards.tolist(), batch["desirable"].tolist())
    shares = [mine]
    if world > 1:
        dist.all_reduce(sums)
        shares = [mine] * world  # placeholders, each replaced by its rank's share
        dist.all_gather_object(shares, mine)
    scored = [item for share in shares for item in share]
    good = torch.tensor([r for r, d in scored if d], dtype=torch.float64)
    bad = torch.tensor([r for r, d in scored if not d], dtype=torch.float64)
    n = max(float(sums[2]), 1.0)
    out = {"loss": float(sums[0]) / n, "kl": float(sums[1]) / n}
    if len(good):
        out["desirable_reward"] = float(good.mean())
    if len(bad):
        out["undesirable_reward"] = float(bad.mean())
    if len(good) and len(bad):
        out["margin"] = out["desirable_reward"] - out["undesirable_reward"]
        out["reward_accuracy"] = float((good[:, None] > bad[None, :]).double().mean())
    return out


def rows_trained_on(n_rows: int, d: DPOConfig, world: int, seed: int) -> list[int]:
    """The rows the run's micro-batches will draw, over all ranks (SampleStream's order): only these
    need reference log-probs, which matters for short runs on large datasets."""
    steps = total_steps(n_rows, d.micro_batch_size, d.grad_accum_steps, world, d.epochs, d.max_steps)
    stream = SampleStream(n_rows, d.micro_batch_size, 0, 1, seed)  # one rank's view of every rank's rows
    micro_batches = steps * d.grad_accum_steps * world
    if micro_batches * d.micro_batch_size >= n_rows:  # an epoch or more: every row
        return list(range(n_rows))
    return sorted({i for g in range(micro_batches) for i in stream.micro_batch(g)})


def scored_reference(model, objective, rows: list[int], batch_size: int, pad_id: int, rank: int, world: int,
                     packed: bool = False) -> torch.Tensor:
    """Reference log-probs of the sequences `rows` need (NaN for the others, which are never read)."""
    ids = objective.sequence_ids(rows)
    ref = torch.full((len(objective.sequences),), float("nan"))
    ref[ids] = reference_logps(model, [objective.sequences[i] for i in ids], batch_size, pad_id, rank, world, packed)
    return ref


def cached_reference(ctx: StageContext, compute: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The reference log-probs saved in the work dir by an earlier (killed) run, else `compute()`d and
    saved: after a resume the policy's weights are no longer the reference's."""
    path = ctx.work_dir / REFERENCE_FILE
    if path.is_file():
        return torch.load(path, weights_only=True)
    ref = compute()
    checkpoint.save_work_file(ref, path, ctx.is_main, ctx.world_size)
    return ref


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg, d = ctx.config, ctx.config.dpo
    tokenizer = begin_training(ctx, inputs["sft_model"])
    pad_id = tokenizer.pad_token_id

    # flash_attention_2 takes no 4D mask: there, two padded rows per pair
    shared = d.shared_prompt and checkpoint.attn_implementation(cfg.model) in MASKED_ATTENTION
    config = AutoConfig.from_pretrained(checkpoint_paths.resolve(inputs["sft_model"]), trust_remote_code=cfg.model.trust_remote_code)
    moe.check(config, d.aux_loss_coef, "dpo.aux_loss_coef")
    if d.packing:
        packing.check(config, "dpo.packing")
    window = attention_window(config)

    def make_objective(pairs: Sequence[Pair], shape: PairShape | None = None) -> PairObjective | KTOObjective:
        if DPO_OBJECTIVES[d.loss].pairing == "examples":
            return KTOObjective(d, pairs, pad_id, ctx.world_size)
        return PairObjective(d, pairs, pad_id, shared, window, shape)

    def stored_objective(split: str) -> PairObjective | KTOObjective:
        """The split's pairs (or KTO's unpaired rows), read from the memory-mapped split as batches need them."""
        ds = prepared_data.load(inputs["pref_data"], split)
        if is_unpaired(ds.column_names):
            if DPO_OBJECTIVES[d.loss].pairing != "examples":
                raise DataError(f"dpo.loss={d.loss} trains on pairs, and pref_data holds unpaired rows (one response "
                                "each): set dpo.loss=kto")
            return KTOObjective(d, [], pad_id, ctx.world_size, stored_examples(ds, f"pref_data/{split}"))
        return make_objective(*stored_pairs(ds, f"pref_data/{split}"))

    evaluation = stored_objective("eval")
    # offline: the preference pairs (or KTO's unpaired rows); iterative: none until each round samples its own
    objective = None if d.iterative.rounds else stored_objective("train")

    def precompute() -> dict[str, torch.Tensor]:
        reference = checkpoint.load_frozen_lm(inputs["sft_model"], cfg.model, cfg.infra.precision)
        scored = {"eval": (evaluation, list(range(evaluation.n_rows)))}
        if objective is not None:
            scored["train"] = (objective, rows_trained_on(objective.n_rows, d, ctx.world_size, cfg.seed))
        with torch.no_grad():
            return {name: scored_reference(reference, o, rows, d.micro_batch_size, pad_id, ctx.rank, ctx.world_size, d.packing)
                    for name, (o, rows) in scored.items()}

    ref = cached_reference(ctx, precompute)  # before the policy's engine exists: one model in memory at a time
    model, signature = lora.load_for_training(inputs["sft_model"], cfg.model, d.lora, "dpo.lora")

    def evaluate(engine: Engine) -> dict[str, float]:
        if isinstance(evaluation, KTOObjective):
            return eval_examples(engine, evaluation, ref["eval"], d.micro_batch_size, ctx.rank, ctx.world_size)
        return eval_pairs(engine, evaluation, ref["eval"], d.micro_batch_size, ctx.rank, ctx.world_size)

    if objective is not None:
        engine, outcome = fit(ctx, model, d, range(objective.n_rows),
                              collate=lambda idx: objective.collate(ref["train"], idx),
                              loss_fn=objective.loss, evaluate=evaluate)
    else:
        engine, outcome = fit_iterative(ctx, model, tokenizer, inputs, make_objective, evaluate)

    state = deepspeed_engine.full_state_dict(engine)
    out = ctx.output_dir / "dpo_model"
    if ctx.is_main:
        lora.save_trained(engine.module, tokenizer, out, state, signature)
    metrics = {f"eval/{k}": v for k, v in outcome.last_eval.items()}
    metrics["train/loss"] = outcome.last_train.get("loss", float("nan"))
    if outcome.start_step:
        metrics["resumed_from_step"] = float(outcome.start_step)
    return StageResult(outputs={"dpo_model": out}, metrics=metrics)


def fit_iterative(ctx: StageContext, model, tokenizer: PreTrainedTokenizerBase, inputs: dict[str, Path], make_objective, evaluate):
    """Iterative DPO: `dpo.max_steps` optimizer steps split into rounds, each on pairs the policy sampled
    at the round's start and the reward scorer ranked (see stages/dpo/iterative.py)."""
    cfg, d = ctx.config, ctx.config.dpo

    def reference(engine: Engine, objective):
        with torch.no_grad():
            return scored_reference(engine, objective, list(range(objective.n_rows)), d.micro_batch_size,
                                    tokenizer.pad_token_id, ctx.rank, ctx.world_size, d.packing)

    scorer = build_scorer(cfg.reward, inputs)
    rounds = Rounds(ctx, tokenizer, prepared_data.row_view(inputs["prompts"], "train"), scorer, make_objective, reference)
    engine = build_engine(model, cfg.infra, d, rounds.max_steps)
    outcome = train_loop(ctx, engine, d, rounds.max_steps, micro_batch=lambda g: rounds.micro_batch(engine, g),
                         loss_fn=rounds.loss, evaluate=lambda: evaluate(engine))
    return engine, outcome
