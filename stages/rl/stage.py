"""RL stage: the driver. Each rollout step it samples responses from the rollout engines (with
rl.rollout.engine=hybrid, from the policy ranks themselves), scores them, makes experience (old/reference
log-probs, values, KL, advantages), trains the policy (and critic) on the actor groups, and syncs
the new weights into the engines.

Reads `sft_model`, `prompts`, `eval_data` (and `reward_model` / `prm` when the reward comes from
the pipeline's own models, `reward_model` when the critic starts from it); writes `rl_model`, an HF
checkpoint of the trained policy (rl.actor.ema_beta: its weights' moving average; rl.best_metric: the policy
of the best held-out eval step), and with `rl.critic.save_value_network` `critic_model`, the critic's. Every
`rl.save_every` steps the policy, critic and the driver's counters are checkpointed under the work dir (the
newest `rl.max_checkpoints` kept); a re-run with the same fingerprint resumes there.

The driver reaches its workers through a `Backend` (stages/rl/backend.py): Ray actors in the pipeline
(`runtime.rl_driver.run`, the stage's entrypoint), or objects in this process (`run_in_process`: one rank per
model, no Ray).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from configs.errors import DataError, RewardError, first_line
from configs.reward_sources import REWARD_SOURCES, own_models
from configs.schema import PipelineConfig, RewardConfig
from stages.common import checkpoint, determinism
from stages.common.answers import is_correct
from stages.common.progress import Progress
from stages.common.trainer import SampleStream
from stages.dag.contract import StageContext, StageResult, node_inputs
from stages.data import prepared as prepared_data
from stages.data.prepared import field_ids
from stages.data.tokenization import decoded
from stages.eval.metrics import by_prompt, held_out_metrics
from stages.rewards.base import RewardBatch, concat
from stages.rl import reward_worker, weight_sync, workers
from stages.rl.advantages import compute_advantages, groups_in_range, overlong_penalty, stop_properly_penalty, varied_groups
from stages.rl.backend import Backend, Ref, RolloutEngine, Sampler, one
from stages.rl.best import BestFolder, BestStep, reported
from stages.rl.drawn_ahead import Collected, Drawn, DrawnAhead
from stages.rl.episodes import run_episodes, turns
from stages.rl.experience import (
    Sample,
    place_on_actions,
    sequence_batch,
    shard,
    step_end_tokens,
)
from stages.rl.generation import collect_generation, generate, launch_generation
from stages.rl.layout import Role, hosts, roles
from stages.rl.losses import (
    AdaptiveKLController,
    FixedKLController,
    approx_kl,
    masked_mean,
)
from stages.rl.step_metrics import step_metrics

P = ParamSpec("P")
R = TypeVar("R")

MAX_FILL_ROUNDS = 4  # dynamic filtering: extra rollouts tried before the batch is topped up with filtered groups


PROMPT_IDS = prepared_data.ids_column("prompt")


@dataclass
class Prompt:
    text: str
    ids: list[int]
    label: str | None


def check_prompt_lengths(lengths: np.ndarray, max_len: int, where: str) -> None:
    """A DataError naming the first prompt of `lengths` (token counts, in row order) that is empty or
    over `max_len`."""
    bad = np.flatnonzero((lengths == 0) | (lengths > max_len))
    if bad.size:
        i = int(bad[0])
        if not lengths[i]:
            raise DataError(f"{where} row {i}: empty prompt")
        raise DataError(f"{where} row {i}: prompt is {lengths[i]} tokens, over rl.rollout.prompt_max_len={max_len}")


def encode_prompts(tokenizer: PreTrainedTokenizerBase, rows: list[dict], max_len: int, where: str) -> list[Prompt]:
    """Prompts of rows held in memory (data prep's ids where the rows have them)."""
    out = [Prompt(row["prompt"], field_ids(tokenizer, row, "prompt"), row.get("label")) for row in rows]
    check_prompt_lengths(np.array([len(p.ids) for p in out], dtype=np.int64), max_len, where)
    return out


def prompt_of(row: dict) -> Prompt:
    return Prompt(row["prompt"], row[PROMPT_IDS], row.get("label"))


def stored_prompts(dataset_dir: Path, split: str, max_len: int, where: str, limit: int | None = None) -> Sequence[Prompt]:
    """A prepared split's prompts (its first `limit`), each read from the memory-mapped split when drawn;
    every prompt's length checked first, from the stored ids' lengths."""
    ds = prepared_data.load(dataset_dir, split)
    if limit is not None and limit < len(ds):
        ds = ds.select(range(limit))
    columns = ("prompt", PROMPT_IDS) + (("label",) if "label" in ds.column_names else ())
    prompts = prepared_data.MappedRows(ds, columns, prompt_of, where)
    check_prompt_lengths(prepared_data.list_lengths(ds, PROMPT_IDS), max_len, where)
    return prompts


class Timer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.monotonic()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - start


class Actors:
    """Every worker of the stage by role, started through `backend` (Ray actors, or objects in this
    process). A role the layout hosts in another's actors (`layout.hosts`; hybrid: engine and reference
    in the policy ranks) has its host's workers; a role the config has no work for has none."""

    def __init__(self, ctx: StageContext, inputs: dict[str, Path], backend: Backend, total_steps: int, needs_critic: bool):
        cfg, rl = ctx.config, ctx.config.rl
        self.backend = b = backend
        self.hosts = hosts(cfg)
        sizes, cwd, given = backend.sizes, os.getcwd(), node_inputs(ctx, inputs)  # each actor reads them on its node
        n = {role: sizes.get(role, 0) for role in Role}
        wanted = roles(cfg, needs_critic)
        self.policy = [b.start(workers.PolicyWorker, Role.ACTOR, i, i, n[Role.ACTOR]) for i in range(n[Role.ACTOR])]
        self.critic = [b.start(workers.CriticWorker, Role.CRITIC, i, i, n[Role.CRITIC]) for i in range(n[Role.CRITIC])]
        self.own_ref = [b.start(workers.ReferenceWorker, Role.REF, i, cfg, given) for i in range(n[Role.REF])]
        self.reward = [b.start(reward_worker.RewardWorker, Role.REWARD, i) for i in range(n[Role.REWARD])]
        self.engines: list[RolloutEngine] = b.start_engines(cfg, given) if n[Role.ENGINE] else []
        hosted_ref = self.hosts.get(Role.REF) == Role.ACTOR
        self.ref: Sequence[workers.HoldsReference] = (self.policy if Role.REF in wanted else []) if hosted_ref else self.own_ref
        # what samples a rollout: the engine actors, or the policy ranks themselves (hybrid)
        self.samplers: Sequence[Sampler] = self.policy if self.hosts.get(Role.ENGINE) == Role.ACTOR else self.engines
        # a bad reward config fails here, before any model loads
        models = [name for name in own_models() if inputs.get(name)]
        b.get([b.call(w.setup, cfg, given, models, cwd) for w in self.reward])
        pending: list[Ref[object]] = []
        for group, optim in ((self.policy, rl.actor), (self.critic, rl.critic)):
            if group:
                master = one(b, b.call(group[0].master))
                pending += [b.call(w.setup, cfg, given, optim, total_steps, master, cwd) for w in group]
        pending += [b.call(e.ready) for e in self.engines] + [b.call(r.ready) for r in self.own_ref]
        b.get(pending)
        self.weight_specs: list[weight_sync.Spec] = []
        self.sync = connect_engines(self, cfg)

    def all(self) -> list[object]:
        """Every worker once (a hosted role's are its host's)."""
        return [*self.policy, *self.critic, *self.engines, *self.reward, *self.own_ref]

    def close(self) -> None:
        self.backend.close([*self.policy, *self.critic], self.all())

    def on_all(self, methods: Sequence[Callable[P, R]], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Each of `methods` (one per worker, by reference) called with the same arguments; their results."""
        return self.backend.get([self.backend.call(m, *args, **kwargs) for m in methods])


def on_shards(actors: Actors, methods: Sequence[Callable[Concatenate[dict[str, torch.Tensor], P], R]],
              batch: dict[str, torch.Tensor], *args: P.args, **kwargs: P.kwargs) -> list[Ref[R]]:
    """Launch each of `methods` (one per worker of a group) with its equal slice of `batch` (pending results)."""
    return [actors.backend.call(m, s, *args, **kwargs) for m, s in zip(methods, shard(batch, len(methods)))]


def in_waves(actors: Actors, calls: dict[Role, Callable[[], list[Ref[Any]]]]) -> dict[Role, list[Any]]:
    """Run each group's calls (`role -> launch`, returning the pending results); groups that share
    cores go one after another, the others at once. Returns each group's results."""
    results: dict[Role, list[Any]] = {}
    for wave in actors.backend.waves(list(calls)):
        launched = {group: calls[group]() for group in wave}
        for group, refs in launched.items():
            results[group] = actors.backend.get(refs)
    return results


def eval_batches(asked: list[Prompt], batch_size: int, seed: int) -> list[tuple[list[Prompt], int]]:
    """The held-out requests in batches of `eval.batch_size`, as the eval stage generates (the held-out set
    x k can be far larger than a rollout), each with its sampling seed."""
    return [(asked[i : i + batch_size], seed + i) for i in range(0, len(asked), batch_size)]


def evaluate(actors: Actors, tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], cfg: PipelineConfig) -> dict[str, float]:
    """On the held-out prompts, the eval stage's metrics (stages.eval.metrics): greedy and sampled reward
    (`eval.samples_per_prompt` responses at `eval.sample_temperature`), pass@k, length, and the regex
    accuracies where `eval.answer_pattern` is set."""
    e, k = cfg.eval, cfg.eval.samples_per_prompt

    def answers(temperature: float | None, k: int) -> tuple[list[Sample], list[str], list[Prompt], list[float]]:
        asked = [p for p in prompts for _ in range(k)]
        samples = [s for batch, seed in eval_batches(asked, e.batch_size, cfg.seed)
                   for s in generate(actors, [p.ids for p in batch], seed, temperature, e.max_new_tokens)]
        responses = [decoded(tokenizer, s.response_ids, skip_special_tokens=True) for s in samples]
        rewards = score(actors.backend, actors.reward, [p.text for p in asked], responses, [p.label for p in asked], cfg.reward).rewards.tolist()
        return samples, responses, asked, rewards

    def correct(responses: list[str], asked: list[Prompt]) -> list[bool] | None:
        return [is_correct(r, p.label, e.answer_pattern) for r, p in zip(responses, asked)] if e.answer_pattern else None

    if cfg.rl.agent.path:
        return evaluate_episodes(actors, tokenizer, prompts, cfg)
    samples, responses, asked, rewards = answers(None, 1)
    _, drawn, drawn_for, drawn_rewards = answers(e.sample_temperature, k) if k else ([], [], [], [])
    drawn_correct = correct(drawn, drawn_for)
    n = len(prompts)
    return held_out_metrics(rewards, by_prompt(drawn_rewards, n), [len(s.response_ids) for s in samples],
                            correct(responses, asked), None if drawn_correct is None else by_prompt(drawn_correct, n))


def evaluate_episodes(actors: Actors, tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], cfg: PipelineConfig) -> dict[str, float]:
    """The held-out metrics of multi-turn episodes: an episode's reward is its return; greedy and
    `eval.samples_per_prompt` sampled episodes per prompt; `turns`: the greedy episodes' mean."""
    e, k, n = cfg.eval, cfg.eval.samples_per_prompt, len(prompts)

    def play(temperature: float | None, times: int):
        asked = [p for p in prompts for _ in range(times)]
        return run_episodes(actors, tokenizer, [p.text for p in asked], [p.label for p in asked], cfg, cfg.seed,
                            temperature, e.max_new_tokens)

    greedy, scored = play(None, 1)
    sampled = by_prompt(play(e.sample_temperature, k)[1].rewards.tolist(), n) if k else None
    metrics = held_out_metrics(scored.rewards.tolist(), sampled, [sum(s.trained) for s in greedy])
    return metrics | {"turns": turns(greedy)}


def connect_engines(actors: Actors, cfg: PipelineConfig) -> str:
    """How the engines get the policy's weights after each update, said once in the log: `broadcast` when
    the policy's rank 0 and every engine joined a process group of their own, else `state dict` (why:
    asked for, workers in one process, engines on another torch, or the group could not be formed). Hybrid: `none`."""
    if actors.hosts.get(Role.ENGINE) == Role.ACTOR:  # the policy ranks sample with their own weights
        return "none"
    rl, b = cfg.rl, actors.backend
    why = None
    if rl.rollout.weight_sync == "object_store":
        why = "rl.rollout.weight_sync=object_store"
    elif not b.concurrent:
        why = "workers in one process"
    elif (other := {v for v in b.get([b.call(e.torch_version) for e in actors.engines]) if v != torch.__version__}):
        why = f"the engines run torch {', '.join(sorted(other))}, the policy {torch.__version__}"
    if why is None:
        # NCCL only where the policy's rank 0 and every engine compute on CUDA: a GPU that Ray schedules
        # but torch does not see (a logical one) joins over gloo like a CPU
        devices = b.get([b.call(actors.policy[0].device_type), *[b.call(e.device_type) for e in actors.engines]])
        backend = "nccl" if set(devices) == {"cuda"} else "gloo"
        world = 1 + len(actors.engines)
        try:
            master = one(b, b.call(actors.policy[0].master))
            joins = [b.call(actors.policy[0].join_weight_group, master, world, backend)]
            joins += [b.call(e.join_weight_group, master, i + 1, world, backend) for i, e in enumerate(actors.engines)]
            b.get(joins, timeout=weight_sync.JOIN_TIMEOUT_S + 10)
            actors.weight_specs = one(b, b.call(actors.engines[0].weight_specs))
            print(f"[rl] weight sync: broadcast over a {backend} group (the policy's rank 0 and {len(actors.engines)} "
                  f"engine(s)), parameter by parameter", flush=True)
            return "broadcast"
        except Exception as exc:  # noqa: BLE001 - the state-dict path below still works
            why = f"the {backend} group could not be formed: {type(exc).__name__}: {first_line(exc)}"
    print(f"[rl] weight sync: whole state dicts ({why})", flush=True)
    return "state dict"


def sync_weights(actors: Actors) -> None:
    """Broadcast: every policy rank takes part (a ZeRO-3 parameter is gathered by all), rank 0 sends each
    parameter to every engine at once. State dict: rank 0's whole state goes to the engines straight from
    the object store (Ray), not through the driver. Hybrid: the policy ranks are the engines."""
    if actors.sync == "none":
        return
    b = actors.backend
    if actors.sync == "broadcast":
        b.get([b.call(w.send_weights, actors.weight_specs) for w in actors.policy]
              + [b.call(e.receive_weights, actors.weight_specs) for e in actors.engines])
        return
    states = [b.call(w.synced_state_dict) for w in actors.policy]
    # a launched call passed to another stands for its result: rank 0's state goes engine-ward without the driver
    whole = cast("dict[str, torch.Tensor]", states[0])
    b.get([b.call(e.load_weights, whole) for e in actors.engines] + states[1:])


def run_in_process(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    """The same stage with its workers as objects in this process, one rank each, no Ray."""
    from stages.rl.in_process import InProcess

    return run_with(InProcess(), ctx, inputs)


def run_with(backend: Backend, ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    ctx = replace(ctx, config=backend.layout(ctx.config))
    cfg, rl = ctx.config, ctx.config.rl
    determinism.seed_all(cfg.seed, cfg.infra.deterministic)
    n = rl.rollout.n_samples_per_prompt
    tokenizer = checkpoint.load_tokenizer(inputs["sft_model"])
    prompts = stored_prompts(inputs["prompts"], "train", rl.rollout.prompt_max_len, "prompts/train")
    eval_prompts = list(stored_prompts(inputs["eval_data"], "eval", rl.rollout.prompt_max_len, "eval_data/eval",
                                       cfg.eval.max_samples))
    total = rl.max_steps or math.ceil(rl.num_episodes * len(prompts) / rl.rollout.batch_size)
    stream = SampleStream(len(prompts), 1, 0, 1, cfg.seed)
    ckpt = {"policy": ctx.work_dir / "checkpoints" / "policy", "critic": ctx.work_dir / "checkpoints" / "critic"}
    best_folder = BestFolder(ctx.work_dir / "checkpoints" / "best", ctx.on_checkpoint)

    actors, ahead = None, DrawnAhead(rl.rollout.async_queue_size if rl.rollout.async_train else 0)
    try:
        backend.reserve(cfg, rl.algorithm.needs_critic, ctx.should_stop)
        actors = Actors(ctx, inputs, backend, total, rl.algorithm.needs_critic)
        resumed = actors.on_all([w.load for w in actors.policy], str(ckpt["policy"]))[0]
        start, cursor, kl_coef, before = 0, 0, rl.algorithm.init_kl_coef, None
        best = BestStep(rl.best_metric) if rl.best_metric else None
        if resumed:
            start, cursor, kl_coef, before = resumed["step"], resumed["cursor"], resumed["kl_coef"], resumed["before"]
            best = resume_best(best, resumed, best_folder)
            if actors.critic:
                actors.on_all([w.load for w in actors.critic], str(ckpt["critic"]), f"step{start}")
            sync_weights(actors)
            print(f"[rl] resumed from step {start}/{total} ({ckpt['policy']})", flush=True)
        for kept in resumed.get("drawn", []) if resumed else []:  # as the killed run drew them
            ahead.add(Drawn(kept["step"], kept["start"], kept["updates"], Collected(kept["result"])))
        if rl.rollout.async_train:
            print(f"[rl] async: the engines draw each step's samples while the policy trains on an earlier step's (up to "
                  f"{ahead.size} update(s) stale, importance weights capped at {rl.importance_cap})", flush=True)
        kl_ctl = (AdaptiveKLController(kl_coef, rl.algorithm.kl_target, rl.algorithm.kl_horizon) if rl.algorithm.kl_target
                  else FixedKLController(kl_coef))
        if before is None:
            before = evaluate(actors, tokenizer, eval_prompts, cfg)
            if best is not None:
                reported(best.metric, before)  # a metric the evals do not report fails before any training
        ctx.log_metrics({f"eval/{k}": v for k, v in before.items()}, 0)  # a resumed run's MLflow run gets it too
        progress = Progress("rl", total, start=start)
        last_eval, logs = before, {}
        for step in range(start, total):
            if ctx.should_stop():  # Ctrl-C: the checkpoints so far stay in the work dir for the rerun
                raise KeyboardInterrupt(f"stopped before step {step + 1}/{total}")
            timer = Timer()
            drawn = ahead.take(step)
            samples, scored, cursor, filtered = rollout(actors, tokenizer, prompts, stream, cursor, cfg, step, timer, drawn)
            # async: the engines draw the queued steps' first rounds now, with the weights before this step's
            # update, while the policy makes experience and trains; the sync below waits for them to finish
            for queued in ahead.to_draw(step, total):
                ahead.add(draw(actors, tokenizer, prompts, stream, cursor, cfg, queued, step, ahead))
                cursor += rl.rollout.batch_size
            with timer("experience"):
                batch, logs = make_experience(actors, tokenizer, samples, scored, cfg, kl_ctl.value)
            with timer("training"):
                # the critic's warm-up (critic.freezing_steps): the policy waits for it
                logs |= train(actors, batch, step, rl.algorithm.use_kl_loss, train_policy=step >= rl.critic.freezing_steps)
            with timer("generation"):  # a multi-turn draw still playing: the weights wait for its last turn
                ahead.settle()
            with timer("weight_sync"):
                sync_weights(actors)
            kl_ctl.update(logs["kl"], rl.rollout.batch_size * n)
            done = step + 1
            step_s = sum(timer.seconds.values())
            logs |= {f"time/{k}": v for k, v in timer.seconds.items()}
            logs |= {"kl_coef": kl_ctl.value, "filtered_groups": filtered, "samples_per_s": len(samples) / step_s,
                     "staleness": step - drawn.updates if drawn else 0}
            ctx.log_metrics(step_metrics(logs, rl), done)
            progress.update(done, reward=logs["reward"], kl=logs["kl"], len=logs["response_length"])
            if done % rl.eval_every == 0 or done == total:
                last_eval = evaluate(actors, tokenizer, eval_prompts, cfg)
                ctx.log_metrics({f"eval/{k}": v for k, v in last_eval.items()}, done)
                progress.update(done, force=True, **{f"eval_{k}": v for k, v in last_eval.items()})
                if best is not None and best.offer(done, last_eval):
                    actors.on_all([w.export for w in actors.policy], str(best_folder.tag(done)))
                    best_folder.exported(done)
            if done % rl.save_every == 0 and done < total:
                state = {"cursor": cursor, "drawn": kept_draws(actors, ahead), "kl_coef": kl_ctl.value, "before": before,
                         "best": None if best is None else best.state()}
                save(actors, ckpt, done, state, ctx.on_checkpoint, rl.max_checkpoints)
                best_folder.checkpointed(None if best is None else best.step)
        if start >= total:
            last_eval = evaluate(actors, tokenizer, eval_prompts, cfg)
        outputs = {"rl_model": ctx.output_dir / "rl_model"}
        if best is not None and best.step is not None:
            best_folder.copy_to(best.step, outputs["rl_model"])
            last_eval = best.evals
            print(f"[rl] best held-out {best.metric} {best.value:.4f} at step {best.step}/{total}: the output policy is "
                  "that step's", flush=True)
        else:
            actors.on_all([w.export for w in actors.policy], str(outputs["rl_model"]))
        if rl.critic.save_value_network:  # the schema allows it only where there is a critic; the last step's critic
            outputs["critic_model"] = ctx.output_dir / "critic_model"
            actors.on_all([w.export for w in actors.critic], str(outputs["critic_model"]))
    finally:
        ahead.close()
        # stopped (Ctrl-C): the flow is shutting Ray down, which ends the actors and their placement; no need to
        # wait for them to close (a stop that comes mid-close: the Ray calls are gated, runtime.ray_shutdown)
        if not ctx.should_stop():
            if actors is not None:
                actors.close()
            backend.release()

    print("[rl] held-out, before (SFT policy) -> after (RL policy)\n" + before_after(before, last_eval), flush=True)
    # the `eval/*` series' last points (rl.best_metric: the best step's); step 0 is the SFT policy's
    metrics = {f"eval/{k}": v for k, v in last_eval.items()}
    if start:
        metrics["resumed_from_step"] = float(start)
    if best is not None and best.step is not None:
        metrics["best_step"] = float(best.step)
    return StageResult(outputs=outputs, metrics=metrics)


def train(actors: Actors, batch: dict[str, torch.Tensor], step: int, use_kl_loss: bool,
          train_policy: bool = True) -> dict[str, float]:
    """One rollout batch through the policy ranks (unless `train_policy` is off) and, at the same time, the
    critic ranks."""
    keys = ("input_ids", "attention_mask", "action_mask")
    kl_keys = ("ref_log_probs", "kl_coef") if use_kl_loss and actors.ref else ()
    actor_batch = {k: batch[k] for k in (*keys, "old_log_probs", "advantages", "rollout_log_probs", *kl_keys)}
    calls: dict[Role, Callable[[], list[Ref[Any]]]] = {}
    if train_policy:
        calls[Role.ACTOR] = lambda: on_shards(actors, [w.train for w in actors.policy], actor_batch, step)
    if actors.critic:
        critic_batch = {k: batch[k] for k in (*keys, "values", "returns")}
        calls[Role.CRITIC] = lambda: on_shards(actors, [w.train for w in actors.critic], critic_batch, step)
    results = in_waves(actors, calls)
    logs = {f"actor/{k}": v for k, v in results[Role.ACTOR][0].items()} if train_policy else {}  # rank-averaged
    if actors.critic:
        logs |= {f"critic/{k}": v for k, v in results[Role.CRITIC][0].items()}
    return logs


def pick(prompts: Sequence[Prompt], stream: SampleStream, cursor: int, want: int) -> list[Prompt]:
    return [prompts[stream.micro_batch(p)[0]] for p in range(cursor, cursor + want)]


def round_seed(cfg: PipelineConfig, step: int, rounds: int) -> int:
    return cfg.seed * 100_003 + step * 101 + rounds


def launch_round(actors: Actors, picked: list[Prompt], cfg: PipelineConfig, step: int, rounds: int) -> list:
    """Generation of one rollout round (n samples per picked prompt), seeded by step and round."""
    rl = cfg.rl
    return launch_generation(actors, [p.ids for p in picked for _ in range(rl.rollout.n_samples_per_prompt)],
                             round_seed(cfg, step, rounds), rl.rollout.temperature, rl.rollout.generate_max_len, rl.rollout.top_p)


def play_round(actors: Actors, tokenizer: PreTrainedTokenizerBase, picked: list[Prompt], cfg: PipelineConfig, step: int,
               rounds: int) -> tuple[list[Sample], RewardBatch]:
    """A multi-turn agent's rollout round: an episode per sample (n per picked prompt), seeded by step and round."""
    rl = cfg.rl
    flat = [p for p in picked for _ in range(rl.rollout.n_samples_per_prompt)]
    return run_episodes(actors, tokenizer, [p.text for p in flat], [p.label for p in flat], cfg,
                        round_seed(cfg, step, rounds), rl.rollout.temperature, rl.rollout.generate_max_len, rl.rollout.top_p)


def draw(actors: Actors, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt], stream: SampleStream, start: int,
         cfg: PipelineConfig, step: int, updates: int, ahead: DrawnAhead) -> Drawn:
    """Step `step`'s first rollout round from stream position `start`, launched now (async training, after
    `updates` policy updates); `rollout` collects it. A multi-turn agent's episodes are played by `ahead`,
    overlapping the training where the engines are actors of their own."""
    picked = pick(prompts, stream, start, cfg.rl.rollout.batch_size)
    if cfg.rl.agent.path:
        overlap = actors.backend.concurrent and actors.sync != "none"
        return Drawn(step, start, updates, ahead.play(lambda: play_round(actors, tokenizer, picked, cfg, step, 0), overlap))
    return Drawn(step, start, updates, launch_round(actors, picked, cfg, step, 0))


def drawn_result(actors: Actors, drawn: Drawn):
    """What a step's first round drew ahead: its samples (a multi-turn draw: its samples and rewards), waited for."""
    if isinstance(drawn.pending, Collected):
        return drawn.pending.result
    if isinstance(drawn.pending, Future):
        return drawn.pending.result()
    return collect_generation(actors, drawn.pending)


def kept_draws(actors: Actors, ahead: DrawnAhead) -> list[dict]:
    """The queued steps' draws as a checkpoint keeps them (async training): their samples are done by now (the
    weight sync waits for the engines' earlier calls; `settle` for episodes played ahead), so keeping them costs
    no wait, and a resumed run trains on them rather than on draws from the checkpoint's weights."""
    return [{"step": d.step, "start": d.start, "updates": d.updates, "result": drawn_result(actors, d)} for d in ahead.queue]


def rollout(actors: Actors, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt], stream: SampleStream, cursor: int,
            cfg: PipelineConfig, step: int, timer: Timer, drawn: Drawn | None = None):
    """`rl.rollout.batch_size` prompts x n samples, scored; with dynamic filtering, groups whose scores are
    all equal are replaced by fresh prompts (up to MAX_FILL_ROUNDS extra rollouts, then topped up with
    filtered groups, whose group advantages are zero anyway), picked from `cursor` on. `drawn`: the first
    round, drawn ahead for this step (`time/generation` is then the wait for it)."""
    rl, n = cfg.rl, cfg.rl.rollout.n_samples_per_prompt
    kept: list[tuple[list[Sample], Prompt, RewardBatch]] = []
    spare: list[tuple[list[Sample], Prompt, RewardBatch]] = []
    want, filtered, rounds = rl.rollout.batch_size, 0, 0
    while want > 0 and rounds <= (MAX_FILL_ROUNDS if rl.algorithm.dynamic_filtering else 0):
        if rounds == 0 and drawn is not None:
            picked = pick(prompts, stream, drawn.start, want)
        else:
            picked = pick(prompts, stream, cursor, want)
            cursor += want
        flat = [p for p in picked for _ in range(n)]
        if rl.agent.path:  # multi-turn: the environment's turns give the rewards (timed as generation)
            with timer("generation"):
                if rounds == 0 and drawn is not None:
                    samples, scored = drawn_result(actors, drawn)
                else:
                    samples, scored = play_round(actors, tokenizer, picked, cfg, step, rounds)
        else:
            with timer("generation"):
                if rounds == 0 and drawn is not None:
                    samples = drawn_result(actors, drawn)
                else:
                    samples = collect_generation(actors, launch_round(actors, picked, cfg, step, rounds))
            with timer("reward"):
                responses = [decoded(tokenizer, s.response_ids, skip_special_tokens=True) for s in samples]
                scored = score(actors.backend, actors.reward, [p.text for p in flat], responses, [p.label for p in flat], cfg.reward)
        groups = [(samples[i * n : (i + 1) * n], picked[i], _slice(scored, i * n, (i + 1) * n)) for i in range(want)]
        if rl.algorithm.dynamic_filtering:
            values, bounds = scored.filter_values(), rl.algorithm.dynamic_filtering_range  # OpenRLHF's `scores` where given
            keep = (varied_groups(values, n) if bounds is None else groups_in_range(values, n, *bounds)).tolist()
            spare += [g for g, k in zip(groups, keep) if not k]
            groups = [g for g, k in zip(groups, keep) if k]
            filtered += keep.count(False)
        kept += groups
        want -= len(groups)
        rounds += 1
    kept += spare[:want]
    samples = [s for g in kept for s in g[0]]
    scored = concat([g[2] for g in kept])
    return samples, scored, cursor, filtered


def _slice(scored: RewardBatch, a: int, b: int) -> RewardBatch:
    steps = scored.step_rewards[a:b] if scored.step_rewards is not None else None
    scores = scored.scores[a:b] if scored.scores is not None else None
    return RewardBatch(rewards=scored.rewards[a:b], step_rewards=steps, extra_logs=scored.extra_logs, scores=scores)


def score(backend: Backend, scorers: Sequence[reward_worker.RewardWorker], prompts: list[str], responses: list[str], labels: list[str | None],
          reward: RewardConfig) -> RewardBatch:
    """Rewards from the reward workers, each scoring an equal contiguous share. A `reward_func` share not
    scored within `reward.timeout_s` ends the stage, and its workers are killed: nothing else stops a
    Python call (a remote source bounds its own requests; models take the time they take)."""
    b = backend
    k = math.ceil(len(prompts) / len(scorers))
    parts = [b.call(w.score, prompts[i * k : (i + 1) * k], responses[i * k : (i + 1) * k], labels[i * k : (i + 1) * k])
             for i, w in enumerate(scorers) if prompts[i * k : (i + 1) * k]]
    limit = reward.timeout_s if REWARD_SOURCES[reward.source].timed else None
    try:
        return concat(b.get(parts, timeout=limit))
    except TimeoutError:
        for w in scorers:
            b.kill(w)
        raise RewardError(f"reward.func_path={reward.func_path}: reward_func did not return within reward.timeout_s="
                          f"{limit:g} s (a batch of {k} queries); fix the function or raise reward.timeout_s") from None


def make_experience(actors: Actors, tokenizer: PreTrainedTokenizerBase, samples: list[Sample], scored, cfg: PipelineConfig, kl_coef: float):
    """Old/reference log-probs, values, KL, shaped rewards and advantages for one rollout batch."""
    rl, n = cfg.rl, cfg.rl.rollout.n_samples_per_prompt
    batch = sequence_batch(samples, tokenizer.pad_token_id)
    mask = batch["action_mask"]
    calls: dict[Role, Callable[[], list[Ref[Any]]]] = {}
    # the reference in the policy ranks: one call for both passes
    both = rl.algorithm.recompute_old_log_probs and actors.hosts.get(Role.REF) == Role.ACTOR and bool(actors.ref)
    if both:
        calls[Role.ACTOR] = lambda: on_shards(actors, [w.old_and_ref_log_probs for w in actors.policy], batch)
    else:
        if rl.algorithm.recompute_old_log_probs:
            calls[Role.ACTOR] = lambda: on_shards(actors, [w.log_probs for w in actors.policy], batch)
        if actors.ref:
            calls[Role.REF] = lambda: on_shards(actors, [w.ref_log_probs for w in actors.ref], batch)
    if actors.critic:
        calls[Role.CRITIC] = lambda: on_shards(actors, [w.values for w in actors.critic], batch)
    results = in_waves(actors, calls)
    if both:
        results[Role.ACTOR], results[Role.REF] = map(list, zip(*results[Role.ACTOR]))
    names = {Role.ACTOR: "old", Role.REF: "ref", Role.CRITIC: "values"}
    got = {names[group]: torch.cat(parts) for group, parts in results.items()}
    old = got.get("old", batch["rollout_log_probs"])
    kl = approx_kl(old, got["ref"], rl.algorithm.kl_estimator) * mask if "ref" in got else torch.zeros_like(mask)
    scores = scored.rewards.float()
    lengths = mask.sum(-1)
    penalty = torch.zeros_like(scores)
    if rl.algorithm.overlong_buffer_len:
        penalty = overlong_penalty(lengths, rl.rollout.generate_max_len, rl.algorithm.overlong_buffer_len, rl.algorithm.overlong_penalty_factor)
    if rl.algorithm.stop_properly_penalty_coef is not None:  # after the overlong penalty, as OpenRLHF's
        truncated = torch.tensor([not s.response_ids or s.response_ids[-1] != tokenizer.eos_token_id for s in samples])
        penalty = stop_properly_penalty(scores + penalty, truncated, rl.algorithm.stop_properly_penalty_coef) - scores
    shaped, dense = scores + penalty, None  # clipped after the group baseline, as OpenRLHF's
    if scored.step_rewards is not None and not rl.algorithm.estimator.grouped:
        # process rewards (or a multi-turn episode's turn rewards) go on the tokens that end each step (each
        # answer); the sequence-level part is only the penalty
        separator = cfg.prm.step_separator
        positions = [s.turn_ends if s.turn_ends is not None else step_end_tokens(tokenizer, s.response_ids, separator)
                     for s in samples]
        values = [v[: len(p)] for v, p in zip(scored.step_rewards, positions)]
        dense = place_on_actions(values, [p[: len(v)] for p, v in zip(positions, values)], samples, mask.shape[1])
        dense = dense.clamp(-rl.algorithm.reward_clip, rl.algorithm.reward_clip)
        shaped = penalty
    advantages, returns = compute_advantages(
        rl.algorithm.advantage_estimator, shaped, mask, n,
        kl=kl, kl_coef=0.0 if rl.algorithm.use_kl_loss else kl_coef, dense=dense, values=got.get("values"),
        gamma=rl.algorithm.gamma, lam=rl.algorithm.lambd, std_norm=rl.algorithm.advantage_std_norm, reward_clip=rl.algorithm.reward_clip,
    )
    batch |= {"old_log_probs": old, "advantages": advantages, "returns": returns}
    if "ref" in got:
        batch |= {"ref_log_probs": got["ref"], "kl_coef": torch.full((mask.shape[0],), kl_coef)}
    if "values" in got:
        batch["values"] = got["values"]
    valid = mask.bool()
    logs = {
        "reward": float(scores.mean()),
        "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "score": float(shaped.mean()) if dense is None else float((dense * mask).sum(-1).mean()),
        "kl": float(masked_mean(kl, mask)),
        "response_length": float(lengths.mean()),
        "tokens": float(batch["attention_mask"].sum()),  # prompts and responses: what training reads
        **({"turns": turns(samples)} if samples[0].turn_ends is not None else {}),  # multi-turn episodes
        "advantage_mean": float(advantages[valid].mean()),
        "advantage_std": float(advantages[valid].std()) if valid.sum() > 1 else 0.0,
        "return_mean": float(returns[valid].mean()),
    }
    if "old" in got:
        logs["rollout_logprob_gap"] = float(masked_mean((old - batch["rollout_log_probs"]).abs(), mask))
    logs |= {f"reward/{k}": v for k, v in scored.extra_logs.items()}
    return batch, logs


def save(actors: Actors, ckpt: dict[str, Path], step: int, extra: dict, on_checkpoint, keep: int) -> None:
    """Critic first (its older tags kept), then the policy, whose `latest` marks the step as complete;
    each announced to `on_checkpoint` (the stage context's) in that order. Each keeps its newest `keep` tags."""
    if actors.critic:
        actors.on_all([w.save for w in actors.critic], str(ckpt["critic"]), step, None, None)
        on_checkpoint(ckpt["critic"], f"step{step}")
    actors.on_all([w.save for w in actors.policy], str(ckpt["policy"]), step, extra, keep)
    on_checkpoint(ckpt["policy"], f"step{step}")
    if actors.critic:
        actors.on_all([w.prune for w in actors.critic[:1]], str(ckpt["critic"]), step, keep)


def resume_best(best: BestStep | None, resumed: dict, folder: BestFolder) -> BestStep | None:
    """The best step the checkpoint records, its export kept (and later ones dropped); forgotten, said so, when its
    export is not in the work dir."""
    if best is None:
        return None
    restored = BestStep.restored(best.metric, resumed.get("best"))
    if folder.resumed(restored.step):
        return restored
    print(f"[rl] rl.best_metric: the export of the best step so far (step {restored.step}) is not in {folder.path}; "
          "the best is taken from the evals to come", flush=True)
    return best


def before_after(before: dict[str, float], after: dict[str, float]) -> str:
    lines = ["| metric | before | after |", "|---|---|---|"]
    # pass@k is there only while every sampled reward is 0 or 1: it may be in one of the two
    lines += [f"| {k} | " + " | ".join(f"{m[k]:.3f}" if k in m else "-" for m in (before, after)) + " |"
              for k in dict.fromkeys([*before, *after])]
    return "\n".join(lines) + "\n"
