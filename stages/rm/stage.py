"""Reward model stage: a Bradley-Terry reward model initialised from the SFT checkpoint.

Reads `sft_model` and `pref_data`; writes `reward_model`, an HF sequence-classification checkpoint
(`AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)` loads it when the head
prefix is `score`). The reward of a text is the scalar head at its last non-pad token. After
training, the mean and std of rewards on the eval split are stored in the checkpoint's config
(`reward_mean`, `reward_std`) and applied by scorers when `normalize_reward` is on.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
from transformers import AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase

from configs.errors import CheckpointError
from stages.common import checkpoint, checkpoint_paths, deepspeed_engine, lora, moe, packing
from stages.common.trainer import begin_training, check_trainable, eval_batches, fit
from stages.dag.contract import StageContext, StageResult
from stages.data.prepared import MappedRows, field_ids, ids_column, load
from stages.rm.losses import pairwise_loss

if TYPE_CHECKING:
    from stages.common.deepspeed_engine import Engine


PairRow = tuple[list[int], list[int], float]  # chosen ids, rejected ids, margin


def encode_pair(tokenizer: PreTrainedTokenizerBase, row: dict) -> PairRow:
    """Prompt and response tokenized separately, as the policy produces them (data prep's ids where the row has them)."""
    prompt, chosen, rejected = (field_ids(tokenizer, row, f) for f in ("prompt", "chosen", "rejected"))
    return prompt + chosen, prompt + rejected, float(row.get("margin") or 0.0)


PAIR_COLUMNS = (*tuple(ids_column(f) for f in ("prompt", "chosen", "rejected")), "margin")


def pair_batch(rows: list[PairRow], pad_id: int) -> dict[str, torch.Tensor]:
    """Chosen sequences then rejected ones, right-padded into one batch of 2B."""
    seqs = [r[0] for r in rows] + [r[1] for r in rows]
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        input_ids[i, : len(s)] = torch.tensor(s)
        attention_mask[i, : len(s)] = 1
    margin = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "margin": margin}


class LastTokenReward(torch.nn.Module):
    """The reward model as the DeepSpeed engine sees it: `forward` returns one reward per row, the head
    at the row's last attended token (right padding).

    Pooled by the attention mask rather than HF's pad-id search, so a tokenizer whose pad token is its
    EOS still reads the reward at the EOS; the scorers in `stages.rewards` pool the same way. Going
    through the engine's forward keeps its gradient-accumulation and ZeRO-3 bookkeeping intact.
    """

    def __init__(self, model: torch.nn.Module, packed: bool = False):
        super().__init__()
        self.model = model  # the HF sequence classifier, or peft's wrapper of it under LoRA
        self.packed = packed  # `rm.packing`: the rows as one padding-free row, each reward at its sample's last token

    @property
    def config(self):
        return self.model.config

    def gradient_checkpointing_enable(self) -> None:
        cast(PreTrainedModel, self.model).gradient_checkpointing_enable()  # peft's wrapper forwards it

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, aux: list | None = None) -> torch.Tensor:
        """`aux`: where an MoE backbone's router load-balancing loss is appended (stages.common.moe)."""
        unwrap = getattr(self.model, "get_base_model", None)  # peft's wrapper, under LoRA
        module = cast(PreTrainedModel, unwrap() if unwrap is not None else self.model)
        backbone = getattr(module, module.base_model_prefix)
        head = module.get_submodule("score")
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        out = backbone(**packing.inputs(batch, self.packed), use_cache=False, **moe.router_kwargs(aux))
        moe.record(aux, module, out, packing.router_mask(batch, self.packed))
        hidden = out.last_hidden_state
        if self.packed:
            return head(packing.last_tokens(hidden, attention_mask)).squeeze(-1).float()
        last = attention_mask.sum(-1) - 1
        return head(hidden[torch.arange(len(last), device=hidden.device), last]).squeeze(-1).float()


def rewards_of(engine: Engine, batch: dict, aux: list | None = None) -> torch.Tensor:
    return engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], aux=aux)


def bt_loss(engine: Engine, batch: dict, aux_loss_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float], int]:
    aux: list[torch.Tensor] | None = [] if aux_loss_coef else None
    rewards = rewards_of(engine, batch, aux)
    chosen, rejected = rewards.chunk(2)
    margin = batch["margin"] if bool(batch["margin"].any()) else None
    loss = pairwise_loss(chosen, rejected, margin)
    diff = (chosen - rejected).detach()
    logs = {"accuracy": float((diff > 0).float().mean()), "margin": float(diff.mean())}
    return moe.add_aux_loss(loss, aux, aux_loss_coef, logs), logs, int(batch["attention_mask"].sum())


def eval_pairs(engine: Engine, rows: Sequence[PairRow], batch_size: int, pad_id: int, rank: int, world: int) -> tuple[dict[str, float], torch.Tensor]:
    """Pairwise accuracy, mean reward margin and loss over the eval pairs; also every reward seen (for the stats)."""
    sums = torch.zeros(4, dtype=torch.float64)  # correct, margin, loss*n, n
    seen: list[torch.Tensor] = []
    for chunk, weight in eval_batches(rows, rank, world, batch_size):
        batch = {k: v.to(engine.device) for k, v in pair_batch(chunk, pad_id).items()}
        rewards = rewards_of(engine, batch)
        if not weight:  # a filler batch: it only keeps this rank in step with the others
            continue
        chosen, rejected = rewards.chunk(2)
        n = len(chosen)
        sums += torch.tensor([float((chosen > rejected).sum()), float((chosen - rejected).sum()),
                              float(pairwise_loss(chosen, rejected)) * n, n], dtype=torch.float64)
        seen.append(rewards.detach().cpu())
    if world > 1:
        dist.all_reduce(sums)
    total = max(float(sums[3]), 1.0)
    metrics = {"accuracy": float(sums[0]) / total, "margin": float(sums[1]) / total, "loss": float(sums[2]) / total}
    return metrics, torch.cat(seen) if seen else torch.zeros(0)


def reward_stats(rewards: torch.Tensor, world: int) -> tuple[float, float]:
    """Mean and std over every rank's eval rewards."""
    sums = torch.tensor([float(rewards.sum()), float((rewards.double() ** 2).sum()), float(len(rewards))], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(sums)
    n = max(float(sums[2]), 1.0)
    mean = float(sums[0]) / n
    var = max(float(sums[1]) / n - mean**2, 0.0)
    return mean, max(var**0.5, 1e-6)


def load_reward_backbone(path: Path, model_cfg, **kwargs):
    """The SFT checkpoint with a fresh scalar head (its LM head is dropped); `kwargs` go to `from_pretrained`."""
    source = checkpoint_paths.resolve(path)
    try:
        with checkpoint.new_head():
            return AutoModelForSequenceClassification.from_pretrained(
                source, num_labels=1, attn_implementation=checkpoint.attn_implementation(model_cfg),
                trust_remote_code=model_cfg.trust_remote_code, **kwargs,
            )
    except Exception as exc:
        raise CheckpointError(f"{source}: cannot load as a reward model ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc


def save_reward_model(model, tokenizer: PreTrainedTokenizerBase, out: Path, state: dict | None, prefix: str, normalize: bool,
                      mean: float, std: float) -> None:
    """HF checkpoint whose head weights live under `<prefix>.*` and whose config carries the reward stats."""
    if state is not None and prefix != "score":
        state = {(prefix + k.removeprefix("score") if k.startswith("score.") else k): v for k, v in state.items()}
    model.config.value_head_prefix = prefix
    model.config.normalize_reward = normalize
    model.config.reward_mean = mean
    model.config.reward_std = std
    checkpoint.save(model, tokenizer, out, state_dict=state)


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg, r = ctx.config, ctx.config.rm
    tokenizer = begin_training(ctx, inputs["sft_model"])
    model = load_reward_backbone(inputs["sft_model"], cfg.model, **lora.load_kwargs(r.lora, "rm.lora"))
    model.config.pad_token_id = tokenizer.pad_token_id  # where the HF head finds the last token
    check_trainable(model, r, "rm", packed=r.packing)
    model, signature = lora.prepare(model, r.lora, "SEQ_CLS")  # with LoRA: adapters plus a trainable score head

    train_rows, eval_rows = (MappedRows(load(inputs["pref_data"], split), PAIR_COLUMNS, functools.partial(encode_pair, tokenizer),
                                        "a preference split") for split in ("train", "eval"))
    pad_id = tokenizer.pad_token_id
    engine, outcome = fit(
        ctx, LastTokenReward(model, r.packing), r, train_rows,
        collate=lambda rows: pair_batch(rows, pad_id),
        loss_fn=lambda engine, batch: bt_loss(engine, batch, r.aux_loss_coef),
        evaluate=lambda engine: eval_pairs(engine, eval_rows, r.micro_batch_size, pad_id, ctx.rank, ctx.world_size)[0],
    )

    engine.eval()
    with torch.no_grad():
        final, rewards = eval_pairs(engine, eval_rows, r.micro_batch_size, pad_id, ctx.rank, ctx.world_size)
    mean, std = reward_stats(rewards, ctx.world_size)
    state = deepspeed_engine.full_state_dict(engine)
    if state is not None:  # the wrapper's keys, without its `model.` prefix
        state = {k.removeprefix("model."): v for k, v in state.items()}
    out = ctx.output_dir / "reward_model"
    hf_model = engine.module.model
    if ctx.is_main and signature:  # the adapter only; merging it is the lora_merge stage's job
        stats = {"value_head_prefix": r.value_head_prefix, "normalize_reward": r.normalize_reward,
                 "reward_mean": mean, "reward_std": std}
        lora.save_adapter(hf_model, tokenizer, out, state, signature, stats)
    elif ctx.is_main:
        save_reward_model(hf_model, tokenizer, out, state, r.value_head_prefix, r.normalize_reward, mean, std)
    metrics = {f"eval/{k}": v for k, v in final.items()} | {"eval/reward_mean": mean, "eval/reward_std": std}
    if outcome.start_step:
        metrics["resumed_from_step"] = float(outcome.start_step)
    return StageResult(outputs={"reward_model": out}, metrics=metrics)
