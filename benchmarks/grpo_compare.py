"""GRPO throughput of our RL stage side by side with TRL's GRPOTrainer.

    python -m benchmarks run grpo [--steps N] [--repeats N] [--sft-steps N]
    python -m benchmarks run grpo-50m [--steps N] [--repeats N]    # the compute-bound size (SIZE_ROLLOUT)

Both systems start from the same policy (the tiny preset's base model after a short SFT run of our
stage, SFT_STEPS steps or `--sft-steps`, made once per benchmark run) and train on the prompts of data prep's `prompts` split with the
same rule reward (`rewards/arithmetic.py`), the same rollout shape (`rl.rollout.batch_size` prompts x
`rl.rollout.n_samples_per_prompt` samples of at most `rl.rollout.generate_max_len` tokens, temperature 1, no top-k /
top-p), the same optimizer steps per rollout (`train_batch_size` samples in micro-batches of
`micro_train_batch_size`, one epoch), clip range, learning rate (constant), group-normalized
advantages and the k3 KL loss against the frozen start model at the preset's coefficient. fp32 on
the CPU. Ours runs as the pipeline runs it: a local Ray cluster, the policy as a DeepSpeed rank in a
Ray actor and the reward scorer in another, colocated on the 2 cores. Three rows of ours: as the tiny
preset runs (`rl.rollout.engine=hybrid`: the policy rank samples with the weights it trains and holds the
reference; the log-probs it sampled with are the old ones); the same with the old log-probs
recomputed by a forward pass after sampling, as TRL does here (TRL's work); and the engine-actor
layout of the GPU presets (`rl.rollout.engine=hf`: an HF `generate` engine and the reference in actors of
their own, the weights synced into the engine each step), compared with the preset's row. TRL runs
in one process, generating with the policy itself (no vLLM on a CPU).

Samples are prompt x sample pairs (rollouts). Time is the rollout loop only: for ours the sum of its
per-step timers (generation, reward, experience, training, weight sync; actor start-up and the
held-out evals fall outside, the evals cut to two greedy prompts: nothing reads them), for TRL a callback from `on_train_begin` to the last step's
`on_step_end`, split by timing its own `_generate` (generation), `_calculate_rewards` (reward) and the
rest of `_generate_and_score_completions` (experience: old and reference log-probs, advantages); the
remainder of the loop is training. TRL has no weight sync: it samples from the model it trains.
Each trial is a fresh process; the systems alternate and the table gives medians.

A control row runs TRL's same trial as a task on a local Ray cluster started as ours is (workers at
nice 0, the worker set-up of our actors): what running inside a Ray worker costs TRL's own loop, so
that "ours, TRL's work / TRL in a Ray worker" compares the two trainers under the same runtime.
"""

from __future__ import annotations

import importlib.metadata
import json
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from benchmarks import mfu, trl_compare
from benchmarks.report import Report, RunOptions
from stages.common import determinism

# rollout steps per trial: with half as many, the machine's short swings decided the ratio (a system's
# two trials within one run differed by more than the systems did)
DEFAULT_STEPS = 16
# Our stage's rows. `ours` runs as the tiny preset does; TRL recomputes the old log-probs with the policy
# after sampling (its steps per generation exceed its gradient accumulation), which `ours_recompute`
# does too; `ours_padded` lays each sample in a row of its own; `ours_actors` is the engine-actor layout
# of the GPU presets.
OUR_ROWS = {"ours": [], "ours_recompute": ["rl.algorithm.recompute_old_log_probs=true"],
            "ours_padded": ["rl.shared_prompt=false"], "ours_actors": ["rl.rollout.engine=hf"]}
# the systems each size runs (the compute-bound size's trials take minutes: the rows that tell most)
SIZE_SYSTEMS = {"tiny": ("ours", "ours_recompute", "ours_padded", "ours_actors", "trl", "trl_ray"),
                "50m": ("ours", "ours_padded", "trl")}
# (numerator, denominator): label of the ratio row
RATIO_ROWS = {("ours", "trl"): "ours / TRL",
              ("ours_recompute", "trl"): "ours, TRL's work / TRL",
              ("ours", "ours_padded"): "ours / ours in padded rows",
              ("trl_ray", "trl"): "TRL in a Ray worker / TRL",
              ("ours_recompute", "trl_ray"): "ours, TRL's work / TRL in a Ray worker",
              ("ours_actors", "ours"): "ours, engine and reference actors / ours"}
SFT_STEPS = 300  # the start policy: enough SFT for the rule reward to vary within a group
PARTS = ("generation", "reward", "experience", "training", "weight_sync")
EVAL_SAMPLES = 16  # our stage's held-out evals (outside the timed loop) on few prompts
# The compute-bound size: trl_compare's ~50M Llama (random init: its samples run to the length limit and
# score 0, the same work for both systems) on prompts of 18-26 numbers (about 60-90 tokens), 4 prompts
# x 4 samples of 64 tokens per rollout step, one optimizer step of 16 samples in micro-batches of 4.
SIZE_ROLLOUT = {"tiny": [], "50m": ["rl.rollout.batch_size=4", "rl.rollout.n_samples_per_prompt=4",
                                   "rl.rollout.generate_max_len=64", "rl.rollout.prompt_max_len=256", "rl.rollout.micro_batch_size=4",
                                   "rl.train_batch_size=16", "rl.micro_train_batch_size=4"]}
# our stage's held-out evals before and after the loop fall outside the timing and nothing here reads them:
# both sizes keep them as short as they go (2 prompts, greedy, 8 tokens)
UNTIMED_EVALS = ["eval.max_samples=2", "eval.samples_per_prompt=0", "eval.max_new_tokens=8"]
SIZE_STEPS = {"tiny": DEFAULT_STEPS, "50m": 3}


BENCHMARK_SIZES = {"grpo": "tiny", "grpo-50m": "50m"}  # the registered benchmarks (benchmarks/__main__.py)


def grpo(options: RunOptions) -> Report:
    return compare(options, BENCHMARK_SIZES["grpo"])


def grpo_50m(options: RunOptions) -> Report:
    return compare(options, BENCHMARK_SIZES["grpo-50m"])


def systems_problem(benchmarks: list[str], systems: list[str], all_benchmarks: Iterable[str] = ()) -> str | None:
    """What is wrong with running only `systems` in `benchmarks` (`--systems`), or None: no system is a
    benchmark's name (of `all_benchmarks`), only the GRPO comparisons take a choice, each table compares
    against ours and TRL, and each name is a system of every benchmark asked for."""
    named = [s for s in systems if s in all_benchmarks]
    if named:  # `--systems ours trl grpo`: the benchmark's name taken for a system
        return f"{', '.join(named)} is a benchmark, not a system: name the benchmarks before --systems"
    others = [name for name in benchmarks if name not in BENCHMARK_SIZES]
    if others:
        return f"only {' and '.join(BENCHMARK_SIZES)} run a choice of systems, not {', '.join(others)}"
    missing = [s for s in ("ours", "trl") if s not in systems]
    if missing:
        return f"{' and '.join(missing)} must be among them (every ratio is to them)"
    for name in benchmarks:
        own = SIZE_SYSTEMS[BENCHMARK_SIZES[name]]
        unknown = [s for s in systems if s not in own]
        if unknown:
            return f"{name} has no system {', '.join(unknown)} (its systems: {' '.join(own)})"
    return None


def compare(options: RunOptions, size: str) -> Report:
    trl_compare.require_trl(f"grpo ({size})")
    steps, repeats = options.steps or SIZE_STEPS[size], options.repeats_or(2)
    data = trl_compare.tiny_data(options.workdir, tuple(trl_compare.SIZES[size]))
    # the tiny size starts from a short SFT (rewards that vary within a group); the 50m one from its random init
    sft_steps = options.sft_steps or SFT_STEPS
    policy = start_policy(options.workdir, data, sft_steps) if size == "tiny" else data["base_model"]
    peak = mfu.matmul_peak()
    print(f"[grpo] matmul peak: {peak / 1e9:,.1f} GFLOP/s (fp32, {mfu.threads()} threads)", flush=True)
    systems = [s for s in SIZE_SYSTEMS[size] if options.systems is None or s in options.systems]
    trials: dict[str, list[dict]] = {system: [] for system in systems}
    for repeat in range(repeats):
        for system in systems:
            result = trl_compare.run_trial("grpo", system, steps, {**data, "policy": policy},
                                           options.workdir / f"grpo-{size}-{system}-{repeat}", module=__name__,
                                           overrides=[*trl_compare.SIZES[size], *SIZE_ROLLOUT[size], *UNTIMED_EVALS,
                                                      *OUR_ROWS.get(system, [])])
            if size == "tiny":
                result["settings"]["sft_steps"] = sft_steps  # the start policy's (the trial's process records the default)
            trials[system].append(result)
            print(f"[grpo] trial {repeat + 1}/{repeats} {system}: {result['samples_per_s']:,.1f} samples/s "
                  f"({result['tokens_per_s']:,.0f} response tokens/s), training MFU {training_mfu(result, peak):.1%}", flush=True)
    return report(steps, repeats, trials, size, peak)


def training_mfu(result: dict, peak: float) -> float:
    """6 x parameters x the tokens the training passes compute (`trained_tokens`) per second of training,
    over `peak`."""
    per_second = result["trained_tokens"] / result["training_s"]
    return mfu.utilisation({"params": result["params"], "tokens_per_s": per_second}, peak)


def start_policy(workdir: Path, data: dict[str, Path], steps: int = SFT_STEPS) -> Path:
    """Our SFT stage on the base model for `steps` steps, once per benchmark run: the policy both systems start from."""
    work = workdir / f"grpo-start-policy-{steps}"
    if not work.exists():
        print(f"[grpo] training the start policy ({steps} SFT steps) ...", flush=True)
        trl_compare.run_trial("sft", "ours", steps, data, work)
    return work / "output" / "sft_model"


# --- the table -----------------------------------------------------------------------------------


def report(steps: int, repeats: int, trials: dict[str, list[dict]], size: str, peak: float) -> Report:
    version, first = importlib.metadata.version("trl"), trials["ours"][0]
    summary = {system: {**{metric: statistics.median(r[metric] for r in results)
                           for metric in ("samples_per_s", "tokens_per_s", *(f"{p}_s" for p in PARTS))},
                        "training_mfu": statistics.median(training_mfu(r, peak) for r in results)}
               for system, results in trials.items()}
    pairs = [pair for pair in RATIO_ROWS if set(pair) <= set(trials)]
    ratios = {pair: {metric: summary[pair[0]][metric] / summary[pair[1]][metric] for metric in ("samples_per_s", "tokens_per_s")}
              for pair in pairs}
    stage = "`stages.rl` (Ray; DeepSpeed ZeRO-{zero} policy rank sampling itself, reward actor)".format(zero=first["zero_stage"])
    labels = {"ours": f"ours: {stage}, as the tiny preset runs",
              "ours_recompute": "ours, old log-probs recomputed after sampling (TRL's work)",
              "ours_padded": "ours, each sample in a padded row of its own (`rl.shared_prompt=false`)",
              "ours_actors": "ours, `rl.rollout.engine=hf`: HF engine and reference in actors of their own, weight sync",
              "trl": f"TRL {version} `GRPOTrainer` (one process, HF generate)",
              "trl_ray": f"TRL {version} `GRPOTrainer`, the same trial as a task on a local Ray cluster (control)"}
    columns = ["system", "samples/s (median)", "response tokens/s", "samples/s per trial",
               *(f"{p.replace('_', ' ')} s/step" for p in PARTS), "training MFU"]
    rows = []
    for system in trials:
        s = summary[system]
        per_trial = ", ".join(f"{r['samples_per_s']:,.1f}" for r in trials[system])
        rows.append([labels[system], f"{s['samples_per_s']:,.1f}", f"{s['tokens_per_s']:,.0f}", per_trial,
                     *(f"{s[f'{p}_s'] / steps:.2f}" for p in PARTS), f"{s['training_mfu']:.1%}"])
    for pair in pairs:
        r = ratios[pair]
        rows.append([RATIO_ROWS[pair], f"{r['samples_per_s']:.2f}", f"{r['tokens_per_s']:.2f}", "", *[""] * (len(PARTS) + 1)])
    shape = "tiny preset" if size == "tiny" else f"{first['params'] / 1e6:.1f}M parameters ({size}, random init)"
    title = (f"GRPO throughput, {shape}: {steps} rollout steps of {first['prompts']} prompts x "
             f"{first['group_size']} samples (<= {first['max_new_tokens']} tokens), {first['optimizer_steps_per_rollout']} "
             f"optimizer steps each, KL loss, fp32, {repeats} alternating trials per system; training MFU: 6 x parameters x "
             f"the tokens the training passes compute (in shared rows a prompt once per group) per training second "
             f"over this CPU's fp32 matmul peak, "
             f"{peak / 1e9:.1f} GFLOP/s")
    return Report(title, columns, rows, data={"settings": first["settings"], "size": size, "matmul_peak_flops": peak,
                                              "trl_version": version,
                                              "systems": summary, "ratio": ratios["ours", "trl"],
                                              "ratios": {"/".join(pair): r for pair, r in ratios.items()}, "trials": trials})


# --- one trial, in its own process ---------------------------------------------------------------


def bench_config(steps: int, overrides: list[str]):
    """The tiny preset's GRPO (or what `overrides` make of it), constant learning rate, no checkpoints,
    short evals outside the loop."""
    from configs import load_config

    never = trl_compare.NEVER
    return load_config(None, [f"rl.max_steps={steps}", "rl.actor.warmup_ratio=0", "rl.actor.min_lr_ratio=1",
                              f"rl.eval_every={never}", f"rl.save_every={never}", f"eval.max_samples={EVAL_SAMPLES}",
                              *overrides])


def ours(cfg, data: dict[str, Path], work: Path, in_process: bool = False) -> dict:
    """Our RL stage's trial: on a local Ray cluster as the flow runs it, or (`in_process`: no Ray, as on a
    bare GPU machine) with its workers in this process."""
    from benchmarks.in_process import make_ctx
    from runtime import rl_driver
    from stages.rl import stage as rl_stage

    steps: list[dict] = []
    ctx = make_ctx("rl", cfg, work, lambda metrics, step: steps.append(metrics) if "rollout/samples_per_s" in metrics else None)
    inputs = {"sft_model": data["policy"], "prompts": data["prompts"], "eval_data": data["eval_data"]}
    if in_process:
        rl_stage.run_in_process(ctx, inputs)
    else:
        from runtime.resources import local_cluster

        with local_cluster(cfg.infra.num_cpus, log_to_driver=False):  # as the flow starts one
            rl_driver.run(ctx, inputs)
    per_step = cfg.rl.rollout.batch_size * cfg.rl.rollout.n_samples_per_prompt
    parts = {f"{p}_s": sum(m.get(f"time/{p}", 0.0) for m in steps) for p in PARTS}
    return {"samples": per_step * len(steps), "response_tokens": sum(m["train/response_length"] * per_step for m in steps),
            "seconds": sum(parts.values()), **parts, "zero_stage": cfg.infra.zero_stage}


def trl_trainer(cfg, data: dict[str, Path], work: Path):
    """TRL's GRPOTrainer on the same start policy, prompts, reward and settings as our stage's trial."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from configs.schema import TrainingConfig
    from stages.data.prepared import read_split
    from stages.rewards.factory import build_scorer

    rl = cfg.rl
    scorer = build_scorer(cfg.reward)

    def reward(prompts, completions, label, **_):
        return scorer.score(prompts, completions, label).rewards.tolist()

    rows = read_split(data["prompts"], "train")
    dataset = Dataset.from_list([{"prompt": r["prompt"], "label": r["label"]} for r in rows])
    per_rollout = rl.rollout.batch_size * rl.rollout.n_samples_per_prompt
    # the policy's optimizer settings as our policy rank gets them (stages/rl/workers.py)
    shared = set(TrainingConfig.model_fields) & set(type(rl.actor).model_fields)  # not the policy's own (ema_beta, ranks)
    train = TrainingConfig(**rl.actor.model_dump(include=shared), micro_batch_size=rl.micro_train_batch_size,
                           grad_accum_steps=rl.train_batch_size // rl.micro_train_batch_size)
    common = trl_compare.trl_training_args(cfg, train, rl.max_steps * per_rollout // rl.train_batch_size, work)
    # the reference TRL builds from the checkpoint loads in float32 unless told (it warns that the policy, passed
    # built, ignores these): on a GPU, in the precision the policy trains in
    half = (common["bf16"] and "bfloat16") or (common["fp16"] and "float16")
    args = GRPOConfig(
        **common, model_init_kwargs={"dtype": half} if half else None,
        steps_per_generation=per_rollout // rl.micro_train_batch_size, num_generations=rl.rollout.n_samples_per_prompt,
        max_completion_length=rl.rollout.generate_max_len, temperature=rl.rollout.temperature, top_p=1.0, top_k=0,
        beta=rl.algorithm.init_kl_coef, num_iterations=rl.max_epochs, epsilon=rl.algorithm.eps_clip_low, epsilon_high=rl.algorithm.eps_clip_high,
        # bnpo: the token mean of each micro-batch (ours: of each optimizer step); the same work either way
        scale_rewards="group", loss_type="bnpo",
    )
    return GRPOTrainer(model=trl_compare.load_model(cfg, {"base_model": data["policy"]}), reward_funcs=reward,
                       args=args, train_dataset=dataset,
                       processing_class=trl_compare.load_tokenizer({"base_model": data["policy"]}))


def trl(cfg, data: dict[str, Path], work: Path) -> dict:
    trainer = trl_trainer(cfg, data, work)
    clock = PartClock(trainer)
    measured = trl_compare.timed_train(trainer, count_tokens=False)  # its collator passes rows through
    loop = measured["seconds"]
    parts = {"generation_s": clock.seconds["_generate"], "reward_s": clock.seconds["_calculate_rewards"],
             "experience_s": clock.seconds["_generate_and_score_completions"] - clock.seconds["_generate"]
             - clock.seconds["_calculate_rewards"], "weight_sync_s": 0.0}
    parts["training_s"] = loop - clock.seconds["_generate_and_score_completions"]
    return {"samples": clock.samples, "response_tokens": clock.response_tokens, "seconds": loop, **parts,
            "trl_defaults": measured["trl_defaults"]}


def trl_in_ray(cfg, data: dict[str, Path], work: Path) -> dict:
    """`trl` as a task on a local Ray cluster started as our stage's is, its worker set up as our actors
    are: the cost of the runtime alone, with TRL's loop unchanged."""
    import ray

    from runtime.resources import local_cluster
    from stages.common.dist_env import prepare_process

    threads = cfg.infra.num_cpus
    data, work = {name: path.resolve() for name, path in data.items()}, work.resolve()

    @ray.remote(num_cpus=threads)
    def trial() -> dict:
        prepare_process(threads)
        return trl(cfg, data, work)

    with local_cluster(threads, log_to_driver=False):
        return ray.get(trial.remote())


class PartClock:
    """Times three of the trainer's own methods (wrapped on the instance; behaviour unchanged) and counts
    the completions it scored."""

    METHODS = ("_generate", "_calculate_rewards", "_generate_and_score_completions")

    def __init__(self, trainer):
        self.seconds = dict.fromkeys(self.METHODS, 0.0)
        self.samples = self.response_tokens = 0
        for name in self.METHODS:
            setattr(trainer, name, self.timed(name, getattr(trainer, name)))

    def timed(self, name: str, method):
        def wrapper(*args, **kwargs):
            start = time.monotonic()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[name] += time.monotonic() - start
                if name == "_calculate_rewards":  # (inputs, prompts, completions, completion_ids_list)
                    ids = args[3] if len(args) > 3 else kwargs["completion_ids_list"]
                    self.samples += len(ids)
                    self.response_tokens += sum(len(i) for i in ids)
        return wrapper


def mean_prompt_tokens(cfg, data: dict[str, Path]) -> float:
    """The prompts' mean length in tokens, as both systems encode them (the rollouts draw them evenly)."""
    from stages.common import checkpoint
    from stages.data.prepared import read_split
    from stages.rl.stage import encode_prompts

    tokenizer = checkpoint.load_tokenizer(str(data["policy"]))
    prompts = encode_prompts(tokenizer, read_split(data["prompts"], "train"), cfg.rl.rollout.prompt_max_len, "prompts/train")
    return statistics.mean(len(p.ids) for p in prompts)


def trial_main(spec: dict) -> None:
    import torch

    work = Path(spec["work"])
    data = {name: Path(path) for name, path in spec["data"].items()}
    cfg = bench_config(spec["steps"], spec["overrides"])
    determinism.export_env(cfg.infra.deterministic)  # as a run does, before any process of it computes
    rl = cfg.rl
    measured = {"trl": trl, "trl_ray": trl_in_ray}.get(spec["system"], ours)(cfg, data, work)
    prompt_tokens = mean_prompt_tokens(cfg, data)
    result = {
        "system": spec["system"], "rollout_steps": spec["steps"], "prompts": rl.rollout.batch_size,
        "group_size": rl.rollout.n_samples_per_prompt, "max_new_tokens": rl.rollout.generate_max_len,
        "optimizer_steps_per_rollout": rl.rollout.batch_size * rl.rollout.n_samples_per_prompt // rl.train_batch_size,
        **measured, "samples_per_s": measured["samples"] / measured["seconds"],
        "tokens_per_s": measured["response_tokens"] / measured["seconds"], "torch_threads": torch.get_num_threads(),
        "params": mfu.count_params(data["policy"]), "mean_prompt_tokens": prompt_tokens,
        # the tokens the training passes compute: each sample's prompt and response, or in shared rows a
        # prompt once per group (pads left out either way)
        "trained_tokens": measured["response_tokens"] + prompt_tokens * measured["samples"] / (
            rl.rollout.n_samples_per_prompt if spec["system"] in OUR_ROWS and rl.shared_prompt else 1),
        "settings": {"precision": cfg.infra.precision, "lr": rl.actor.lr, "kl_coef": rl.algorithm.init_kl_coef,
                     "kl_estimator": rl.algorithm.kl_estimator, "train_batch_size": rl.train_batch_size,
                     "micro_train_batch_size": rl.micro_train_batch_size, "sft_steps": SFT_STEPS,
                     "recompute_old_log_probs": rl.algorithm.recompute_old_log_probs, "engine": rl.rollout.engine},
    }
    (work / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    trial_main(json.loads(sys.argv[1]))
