"""The RL stage's workers: the policy and critic (DeepSpeed engines, one worker per rank), the frozen
reference model and HF rollout engines (the reward scorer's: stages/rl/reward_worker.py). The driver
(stages/rl/stage.py) moves tensors between them; each worker holds one model and does one job, except
with rl.rollout.engine=hybrid, where each policy rank also samples and holds the reference (verl's fused
worker). They are plain classes: the pipeline runs each as a Ray actor (runtime/rl_actors.py), a
one-process run as an object in the driver (stages/rl/in_process.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from configs.schema import PipelineConfig, RLConfig, RLModelConfig, TrainingConfig
from stages.common import checkpoint, deepspeed_engine, determinism, dist_env, lora, moe, packing, shared_prompt
from stages.common.generation import sampling_config
from stages.common.offload import FrozenModel
from stages.common.trainer import build_engine
from stages.dag.contract import NodeInputs
from stages.rl import critic_model, weight_sync
from stages.rl.ema import PolicyAverage
from stages.rl.experience import Sample, micro_batches, prompt_lengths, trim
from stages.rl.layout import Role, hosts
from stages.rl.losses import (
    aggregate,
    approx_kl,
    entropy_from_logits,
    log_probs_from_logits,
    masked_mean,
    policy_loss,
    rollout_is_weights,
    step_units,
    value_loss,
)
from stages.rl.stop_strings import stop_end

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from stages.common.deepspeed_engine import Engine


class Worker:
    """Common set-up: CPU accelerator for DeepSpeed, the thread count of the cores this actor may use."""

    def __init__(self, threads: int):
        dist_env.prepare_process(threads)

    def ready(self) -> bool:
        return True

    def torch_version(self) -> str:
        return torch.__version__

    def device_type(self) -> str:
        """Where this worker computes: what torch sees, not what Ray scheduled (a logical GPU is a CPU here)."""
        return checkpoint.default_device()


def row_layout(rl, model, aux: list | None = None) -> str:
    """How a batch's rows go through `model`: `packed` (`rl.packing`), `shared` (`rl.shared_prompt`, where
    the attention takes a 4D mask and no MoE router loss is taken: its token mean would count a shared
    prompt once) or `padded`."""
    if rl.packing:
        return "packed"
    return "shared" if rl.shared_prompt and aux is None and shared_prompt.supported(model) else "padded"


def model_logits(model, batch: dict[str, torch.Tensor], layout: str, aux: list | None = None) -> torch.Tensor:
    """`model`'s outputs [B, T, ...] for a right-padded batch, in the padded layout whatever `layout` ran."""
    if layout == "shared":
        return shared_prompt.logits(model, batch, prompt_lengths(batch))
    return packing.logits(model, batch, layout == "packed", aux)


def token_log_probs(model, batch: dict[str, torch.Tensor], temperature: float, with_entropy: bool = False,
                    entropy_grad: bool = False, aux: list | None = None, layout: str = "padded"):
    """Log-probs of each next token [B, T-1] (and the per-position entropy, in the autograd graph only
    when `entropy_grad`: a logged entropy needs none). No KV cache: nothing is generated from this pass,
    and building one costs time on every log-prob pass. `aux`: where an MoE model's router
    load-balancing loss is appended (stages.common.moe). `layout`: `row_layout`'s."""
    logits = model_logits(model, batch, layout, aux)[:, :-1]
    log_probs = log_probs_from_logits(logits, batch["input_ids"][:, 1:], temperature)
    if not with_entropy:
        return log_probs
    return log_probs, entropy_from_logits(logits if entropy_grad else logits.detach())


def sum_over_ranks(t: torch.Tensor) -> torch.Tensor:
    torch.distributed.all_reduce(t)
    return t


def train_steps(engine: Engine, micros: list[dict[str, torch.Tensor]], accum: int, world: int, loss_fn,
                on_step: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Optimizer steps of `accum` micro-batches each (DeepSpeed steps the optimizer on the last one);
    `loss_fn(micro, units)` gets the step's `step_units`, `on_step` is called after each optimizer step.
    Returns each metric's value per micro-batch."""
    logs: dict[str, list[float]] = {}
    for start in range(0, len(micros), accum):
        group = micros[start : start + accum]
        units = step_units([m["action_mask"] for m in group], world, sum_over_ranks if world > 1 else None)
        for micro in group:
            loss, metrics = loss_fn(micro, units)
            engine.backward(loss)
            norm = deepspeed_engine.step(engine)
            for k, v in metrics.items():
                logs.setdefault(k, []).append(v)
            if norm is not None:  # one per optimizer step (`actor/grad_norm`, `critic/grad_norm`)
                logs.setdefault("grad_norm", []).append(norm)
        if on_step is not None:
            on_step()
    return logs


def rank_mean(values: dict[str, float], world: int) -> dict[str, float]:
    """Average a dict of floats over the ranks of this process group."""
    if world == 1 or not values:
        return values
    t = torch.tensor(list(values.values()), dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return dict(zip(values, (t / world).tolist()))


def load_reference(path: str, cfg: PipelineConfig) -> FrozenModel[PreTrainedModel]:
    """The frozen SFT policy on this worker's device, or in host memory between its passes (rl.placement.ref_offload)."""
    model = checkpoint.load_causal_lm(path, cfg.model, cfg.infra.precision).eval()
    return FrozenModel(model, checkpoint.default_device(), cfg.rl.placement.ref_offload)


class HoldsReference:
    """The frozen SFT policy's log-probs, for the KL term (`self.reference`, `self.rl` set by the holder)."""

    rl: RLConfig
    reference: FrozenModel[PreTrainedModel]

    @torch.no_grad()
    def ref_log_probs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with self.reference.use() as model:
            layout = row_layout(self.rl, model)
            return per_micro_batch(lambda m: token_log_probs(model, m, self.rl.rollout.temperature, layout=layout),
                                   batch, self.rl, model.device)


class TrainerWorker(Worker):
    """One DeepSpeed rank of a trainable model (policy or critic)."""

    role = "model"

    def __init__(self, rank: int, world_size: int, threads: int):
        super().__init__(threads)
        self.rank, self.world = rank, world_size

    def master(self) -> tuple[str, int]:
        return dist_env.free_address()

    def setup(self, cfg: PipelineConfig, given: NodeInputs, optim: RLModelConfig, total_steps: int, master: tuple[str, int], cwd: str) -> None:
        os.chdir(cwd)
        dist_env.join_env(master, self.rank, self.world)
        torch.manual_seed(cfg.seed + self.rank)
        determinism.apply(cfg.infra.deterministic)
        deepspeed_engine.init_distributed()
        self.cfg, self.rl, self.optim = cfg, cfg.rl, optim
        model = self.load_model(given)
        rl = cfg.rl
        self.grad_accum = rl.train_batch_size // (rl.micro_train_batch_size * self.world)
        shared_fields = {k: v for k, v in optim.model_dump().items() if k in TrainingConfig.model_fields}  # not num_workers
        train = TrainingConfig(**shared_fields, micro_batch_size=rl.micro_train_batch_size, grad_accum_steps=self.grad_accum)
        optimizer_steps = total_steps * rl.max_epochs * (rl.rollout.batch_size * rl.rollout.n_samples_per_prompt // rl.train_batch_size)
        self.engine = build_engine(model, cfg.infra, train, optimizer_steps)
        # shared rows pay when a micro-batch holds whole groups: shuffle a prompt's samples together
        shared = row_layout(rl, self.engine) == "shared"
        self.shuffle_group = rl.rollout.n_samples_per_prompt if shared else 1

    def load_model(self, given: NodeInputs):
        raise NotImplementedError

    def train(self, batch: dict[str, torch.Tensor], step: int) -> dict[str, float]:
        """`max_epochs` passes over this rank's share of the rollout, in shuffled micro-batches, each
        loss a mean over its whole optimizer step (micro-batches on every rank), as OpenRLHF's."""
        self.engine.train()
        gen = torch.Generator().manual_seed(self.cfg.seed * 7919 + step)
        logs: dict[str, list[float]] = {}
        for _ in range(self.rl.max_epochs):
            micros = [to_device(trim(m), self.engine.device)
                      for m in micro_batches(batch, self.rl.micro_train_batch_size, gen, self.shuffle_group)]
            for k, v in train_steps(self.engine, micros, self.grad_accum, self.world, self.loss, self.stepped).items():
                logs.setdefault(k, []).extend(v)
        # a micro-batch's loss is its share of the step's: their mean over the micro-batches and ranks is
        # the mean over every step's tokens (or sequences)
        means = {k: sum(v) / len(v) for k, v in logs.items()}
        return rank_mean(means, self.world) | {"lr": self.engine.get_lr()[0]}

    def loss(self, batch: dict[str, torch.Tensor], units: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def stepped(self) -> None:
        """After each optimizer step of `train`."""

    def save(self, ckpt_dir: str, step: int, extra: dict | None = None, keep: int | None = None) -> None:
        """Checkpoint `step`, keeping the newest `keep` tags (None: every older one too)."""
        deepspeed_engine.save_resumable(self.engine, Path(ckpt_dir), step, extra, keep=keep)

    def load(self, ckpt_dir: str, tag: str | None = None) -> dict | None:
        return deepspeed_engine.load_resumable(self.engine, Path(ckpt_dir), tag=tag)

    def prune(self, ckpt_dir: str, step: int, keep: int) -> None:
        deepspeed_engine.prune_old_tags(Path(ckpt_dir), step, keep)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        return deepspeed_engine.full_state_dict(self.engine)

    def close(self) -> None:
        deepspeed_engine.release_engines()
        dist_env.leave_process_group()


class PolicyWorker(TrainerWorker, HoldsReference):
    ema: PolicyAverage | None = None  # rl.actor.ema_beta: the weights' moving average, the stage's output

    def setup(self, cfg: PipelineConfig, given: NodeInputs, optim: RLModelConfig, total_steps: int, master: tuple[str, int], cwd: str) -> None:
        super().setup(cfg, given, optim, total_steps, master, cwd)
        if cfg.rl.actor.ema_beta is not None:  # from the SFT weights, as OpenRLHF's
            self.ema = PolicyAverage(self.engine.module, cfg.rl.actor.ema_beta, self.zero3, self.rank == 0)

    @property
    def zero3(self) -> bool:
        return self.engine.zero_optimization_stage() == 3

    def stepped(self) -> None:
        if self.ema is not None:
            self.ema.update(self.engine.module)

    def save(self, ckpt_dir: str, step: int, extra: dict | None = None, keep: int | None = None) -> None:
        """With the moving average, written into the tag's folder first: DeepSpeed's `latest` then marks both."""
        if self.ema is not None:
            self.ema.save(Path(ckpt_dir) / f"step{step}", self.world)
        super().save(ckpt_dir, step, extra, keep)

    def load(self, ckpt_dir: str, tag: str | None = None) -> dict | None:
        resumed = super().load(ckpt_dir, tag)
        if resumed is not None and self.ema is not None:
            self.ema.load(Path(ckpt_dir) / (tag or f"step{resumed['step']}"))
        return resumed

    def load_model(self, given: NodeInputs):
        path = given.path("sft_model")
        self.tokenizer = checkpoint.load_tokenizer(path)
        model, self.signature = lora.load_for_training(path, self.cfg.model, self.optim.lora, "rl.actor.lora",
                                                       self.cfg.infra.precision)
        moe.check(model.config, self.optim.aux_loss_coef, "rl.actor.aux_loss_coef")
        if self.rl.packing:
            packing.check_loaded(model, "rl.packing")
        if hosts(self.cfg).get(Role.REF) == Role.ACTOR and self.rl.algorithm.needs_reference:
            # verl's fused actor/rollout/ref worker: the KL term's model scores in this hot process, with
            # no actor of its own (a reference actor takes longer for the same pass)
            self.reference = load_reference(path, self.cfg)
        return model

    def synced_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The policy's weights as the rollout engines load them (HF names; LoRA adapters merged in)."""
        state = self.full_state_dict()
        if state is not None and self.signature:
            state = lora.merged_weights(state, self.optim.lora.alpha / self.optim.lora.rank)
        return state

    def join_weight_group(self, master: tuple[str, int], world_size: int, backend: str) -> None:
        """Rank 0: the sender of a process group with the rollout engines (`send_weights`)."""
        self.weight_group = weight_sync.WeightGroup(master, 0, world_size, backend)

    def send_weights(self, wanted: list[weight_sync.Spec]) -> None:
        """Every rank takes part (ZeRO-3 gathers each parameter on all of them); rank 0 broadcasts. With LoRA
        the merged weights are made whole on rank 0 first, then sent one tensor at a time."""
        merged = self.synced_state_dict() if self.signature else None
        weight_sync.send(getattr(self, "weight_group", None), self.engine.module, wanted, self.zero3, merged)

    @torch.no_grad()
    def log_probs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.engine.eval()
        layout = row_layout(self.rl, self.engine)
        return per_micro_batch(lambda m: token_log_probs(self.engine, m, self.rl.rollout.temperature, layout=layout),
                               batch, self.rl, self.engine.device)

    def old_and_ref_log_probs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """rl.rollout.engine=hybrid recomputing the old log-probs: both passes in one call, so the batch crosses
        to this rank once."""
        return self.log_probs(batch), self.ref_log_probs(batch)

    def generate(self, prompt_ids: list[list[int]], seed: int, temperature: float | None, max_new_tokens: int,
                 top_p: float = 1.0, stop: tuple[str, ...] = ()) -> list[Sample]:
        """rl.rollout.engine=hybrid: this rank samples with the weights it trains (ZeRO 0-2 hold them whole), so
        there is no engine actor and nothing to sync."""
        self.engine.eval()
        return sample(self.engine.module, self.tokenizer, self.rl, prompt_ids, seed, temperature, max_new_tokens, top_p, stop)

    def loss(self, batch: dict[str, torch.Tensor], units: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        return actor_loss(self.engine, batch, self.rl, units, self.optim.aux_loss_coef)

    def export(self, out_dir: str) -> None:
        """The policy as an HF checkpoint, or its LoRA adapter (ZeRO-3 partitions gathered; every rank must call);
        with rl.actor.ema_beta, its moving average."""
        state = self.full_state_dict()
        if self.rank == 0:
            if self.ema is not None and state is not None:
                state = self.ema.applied(state, self.engine.module)
            lora.save_trained(self.engine.module, self.tokenizer, Path(out_dir), state, self.signature)


class CriticWorker(TrainerWorker):
    """Token-level values: a scalar head on each position (LlamaForTokenClassification et al.), started from the
    SFT backbone with a fresh head or from a reward model (stages/rl/critic_model.py)."""

    def load_model(self, given: NodeInputs):
        self.tokenizer = checkpoint.load_tokenizer(given.path("sft_model"))  # the policy's: the critic reads its tokens
        return critic_model.load(self.cfg, given)

    def export(self, out_dir: str) -> None:
        """The trained critic as an HF checkpoint, adapters merged in (ZeRO-3 partitions gathered; every rank must call)."""
        state = self.full_state_dict()
        if self.rank == 0 and state is not None:
            lora_cfg = self.optim.lora
            critic_model.save(self.engine.module, self.tokenizer, Path(out_dir), state,
                              lora_cfg.alpha / lora_cfg.rank if lora_cfg.rank else None)

    def _values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return critic_values(self.engine, batch, row_layout(self.rl, self.engine))

    @torch.no_grad()
    def values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.engine.eval()
        return per_micro_batch(self._values, batch, self.rl, self.engine.device)

    def loss(self, batch: dict[str, torch.Tensor], units: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        values = self._values(batch)
        loss = value_loss(values, batch["values"], batch["returns"], batch["action_mask"], self.rl.algorithm.value_clip, units)
        return loss, {"value_loss": loss.item()}


def actor_loss(model, batch: dict[str, torch.Tensor], rl, units: torch.Tensor | None,
               aux_loss_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy's loss on a micro-batch: the PPO surrogate aggregated as `rl.algorithm.aggregation` says, minus
    the entropy bonus, plus the KL term (GRPO); the latter two always token means, as OpenRLHF's. Each
    is divided by the step's `units`, not the micro-batch's own count. An MoE policy adds its router
    loss times `aux_loss_coef`."""
    mask = batch["action_mask"]
    aux: list[torch.Tensor] | None = [] if aux_loss_coef else None
    log_probs, entropy = token_log_probs(model, batch, rl.rollout.temperature, with_entropy=True,
                                         entropy_grad=bool(rl.algorithm.entropy_coef), aux=aux, layout=row_layout(rl, model, aux))
    algorithm, old, is_weights = rl.algorithm, batch["old_log_probs"], None
    if rl.importance_cap is not None and algorithm.policy_loss_type == "gspo":
        old = batch["rollout_log_probs"]  # OpenRLHF's GSPO takes its sequence ratio against the engine's log-probs
    elif rl.importance_cap is not None:
        is_weights = rollout_is_weights(old, batch["rollout_log_probs"], mask, algorithm.rollout_is_type,
                                        algorithm.rollout_is_floor, rl.importance_cap)
    loss, clip_frac = policy_loss(
        log_probs, old, batch["advantages"], mask, loss_type=algorithm.policy_loss_type,
        clip_eps_low=rl.algorithm.eps_clip_low, clip_eps_high=rl.algorithm.eps_clip_high, dual_clip=rl.algorithm.dual_clip,
        aggregation=rl.algorithm.aggregation, max_len=rl.rollout.generate_max_len, is_weights=is_weights, units=units,
    )
    metrics = {"policy_loss": loss.item(), "clip_frac": clip_frac.item()}
    if is_weights is not None:  # how much of the batch the correction keeps: 1 where engine and trainer agree
        metrics["is_weight_mean"] = masked_mean(is_weights, mask).item()
    ent = aggregate(entropy, mask, "token_mean", units=units)
    metrics["entropy"] = ent.item()
    if rl.algorithm.entropy_coef:
        loss = loss - rl.algorithm.entropy_coef * ent
    if rl.algorithm.use_kl_loss and "ref_log_probs" in batch:
        kl = aggregate(approx_kl(log_probs, batch["ref_log_probs"], rl.algorithm.kl_estimator), mask, "token_mean", units=units)
        loss = loss + batch["kl_coef"][0] * kl
        metrics["kl_loss"] = kl.item()
    return moe.add_aux_loss(loss, aux, aux_loss_coef, metrics), metrics


def critic_values(model, batch: dict[str, torch.Tensor], layout: str = "padded") -> torch.Tensor:
    """[B, T-1]: the value of the state before each next token (`layout`: `row_layout`'s)."""
    return model_logits(model, batch, layout)[:, :-1, 0].float()


def to_device(batch: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def per_micro_batch(fn, batch: dict[str, torch.Tensor], rl, device) -> torch.Tensor:
    """`fn` ([b, t] per token) over `rl.rollout.micro_batch_size` rows at a time on `device`, each trimmed of
    unused padding and widened back with zeros, concatenated to the batch's [B, T-1] on the CPU (where
    the driver makes experience)."""
    width, parts = batch["action_mask"].shape[1], []
    for micro in micro_batches(batch, rl.rollout.micro_batch_size):
        out = fn(to_device(trim(micro), device)).float().cpu()
        parts.append(torch.nn.functional.pad(out, (0, width - out.shape[1])))
    return torch.cat(parts)


class ReferenceWorker(Worker, HoldsReference):
    """The frozen SFT policy in an actor of its own (rl.rollout.engine=hybrid keeps it in the policy ranks)."""

    def __init__(self, cfg: PipelineConfig, given: NodeInputs, threads: int):
        super().__init__(threads)
        determinism.apply(cfg.infra.deterministic)
        self.rl = cfg.rl
        self.reference = load_reference(given.path("sft_model"), cfg)


class HFRolloutEngine(Worker):
    """Sampling with HF `generate`; returns the sampled ids and their log-probs (token in, token out)."""

    def __init__(self, cfg: PipelineConfig, given: NodeInputs, threads: int):
        super().__init__(threads)
        determinism.apply(cfg.infra.deterministic)
        self.rl = cfg.rl
        model_path = given.path("sft_model")
        self.tokenizer = checkpoint.load_tokenizer(model_path)
        self.model = checkpoint.load_frozen_lm(model_path, cfg.model, cfg.infra.precision)

    def join_weight_group(self, master: tuple[str, int], rank: int, world_size: int, backend: str) -> None:
        self.weight_group = weight_sync.WeightGroup(master, rank, world_size, backend)

    def weight_specs(self) -> list[weight_sync.Spec]:
        return weight_sync.specs(self.model)

    def receive_weights(self, wanted: list[weight_sync.Spec]) -> None:
        """The policy's new weights, broadcast by its rank 0 parameter by parameter into this model."""
        weight_sync.receive(self.weight_group, self.model, wanted)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The policy's new weights. A ZeRO-3 gather lists tied weights once (e.g. lm_head tied to the
        embeddings), so a key may be missing only when it shares storage with a key that is loaded."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        own = self.model.state_dict()
        loaded = {own[k].data_ptr() for k in state_dict if k in own}
        untied = [k for k in missing if own[k].data_ptr() not in loaded]
        if untied or unexpected:
            raise RuntimeError(f"rollout engine weight sync: missing {untied[:5]}, unexpected {unexpected[:5]}")

    def generate(self, prompt_ids: list[list[int]], seed: int, temperature: float | None, max_new_tokens: int,
                 top_p: float = 1.0, stop: tuple[str, ...] = ()) -> list[Sample]:
        return sample(self.model, self.tokenizer, self.rl, prompt_ids, seed, temperature, max_new_tokens, top_p, stop)


@torch.no_grad()
def sample(model, tok: PreTrainedTokenizerBase, rl, prompt_ids: list[list[int]], seed: int, temperature: float | None, max_new_tokens: int,
           top_p: float = 1.0, stop: tuple[str, ...] = ()) -> list[Sample]:
    """Samples at `temperature` (None: greedy) with HF `generate`, with each sampled token's log-prob; a
    response ends at EOS or after the first of the `stop` strings (included, as vLLM's token ids include it);
    `rl.rollout.generate_batch_size` prompts per `generate` call (all of them when it is empty: one large call
    beats several small ones on a CPU). A response ends at the model's context window (`max_position_embeddings`)
    if `max_new_tokens` would pass it, as vLLM's `max_model_len` ends it."""
    torch.manual_seed(seed)
    window = getattr(model.config, "max_position_embeddings", None)
    per_call = rl.rollout.generate_batch_size or len(prompt_ids)
    samples: list[Sample] = []
    for start in range(0, len(prompt_ids), per_call):
        chunk = prompt_ids[start : start + per_call]
        width = max(len(p) for p in chunk)
        new_tokens = max_new_tokens if window is None else max(1, min(max_new_tokens, window - width))
        # a stop string cuts the answer afterwards (HF's own stop strings need a tokenizer whose vocabulary
        # spells a test prefix, which small ones lack); the tokens before it are sampled as they would be
        config = sampling_config(tok, new_tokens, temperature, top_p, return_dict_in_generate=True, output_logits=True)
        input_ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in chunk])
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device),
                             generation_config=config)
        new = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1)  # raw logits: [b, new, vocab]
        log_probs = log_probs_from_logits(logits, new, temperature or 1.0)
        for i, p in enumerate(chunk):
            ids = new[i].tolist()
            n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
            n = stop_end(tok, ids[:n], stop) if stop else n
            samples.append(Sample(p, ids[:n], log_probs[i, :n].tolist()))
    return samples
