"""Async against synchronous GRPO: samples/s over the rollout steps and the held-out accuracy they end on.

    python -m benchmarks run async [--steps N] [--repeats N]

Starts from the tiny preset's SFT policy (its SFT stage as `rlhf run` trains it) and runs the RL stage
on a local Ray cluster in one layout for both: an HF engine on a bundle of its own, every model on the
policy's (`rl.rollout.engine=hf`, `rl.placement.colocate_models`), the preset's rollout shape, one CPU per bundle. `sync`
samples, then trains; `async` (`rl.rollout.async_train`) draws step t+1's samples while the policy trains on
step t's; `async-2` and `async-4` keep a queue of 2 and 4 steps drawn ahead (`rl.rollout.async_queue_size`),
their samples up to that many updates stale. The tiny preset's own layout (the hybrid engine, every group
colocated) runs beside them for reference. Each repeat uses its own seed (sampling and prompt order; the start policy is shared), the
systems alternating within a repeat. Samples/s counts the rollout steps' timers (for async the
generation part is the wait for samples the engine drew during the previous step); accuracy is the
stage's held-out eval after the last step (greedy and sampled, `rl_trial.EVAL_SAMPLES` prompts).
"""

from __future__ import annotations

import statistics

from benchmarks import rl_trial, trl_compare
from benchmarks.report import Report, RunOptions

DEFAULT_STEPS = 30  # the tiny preset's RL


def queue_system(n: int) -> str:
    return "async" if n == 1 else f"async-{n}"


LAYOUT = ["rl.rollout.engine=hf", "rl.placement.colocate_all=false", "rl.placement.colocate_models=true", "infra.cpus_per_worker=1",
          "rl.algorithm.recompute_old_log_probs=true"]
QUEUES = (1, 2, 4)  # rl.rollout.async_queue_size: how many updates stale the samples may be
SYSTEMS = {
    "sync": LAYOUT,
    **{queue_system(n): [*LAYOUT, "rl.rollout.async_train=true", f"rl.rollout.async_queue_size={n}"] for n in QUEUES},
    "preset": [],  # the tiny preset's hybrid layout: the policy rank samples with its own weights
}
LABELS = {"sync": "synchronous, HF engine on its own bundle (`rl.rollout.engine=hf`, `rl.placement.colocate_models`)",
          **{queue_system(n): f"`rl.rollout.async_train`, queue of {n} (`async_queue_size={n}`), the same layout" for n in QUEUES},
          "preset": "synchronous, the preset's hybrid layout (policy rank samples, all colocated)"}


def async_rl(options: RunOptions) -> Report:
    steps, repeats = options.steps or DEFAULT_STEPS, options.repeats_or(3)
    data = trl_compare.tiny_data(options.workdir)
    policy = rl_trial.preset_policy(options.workdir, data)
    trials = rl_trial.systems_by_seed(SYSTEMS, steps, repeats, {**data, "policy": policy}, options.workdir, "async",
                                      lambda r: f"{r['samples_per_s']:.1f} samples/s, sampled accuracy "
                                                f"{r['eval']['sampled_accuracy']:.3f}")
    summary = {system: summarize(results) for system, results in trials.items()}
    columns = ["system", "samples/s (median)", "samples/s per seed", "sampled accuracy (mean)", "per seed",
               "greedy accuracy (mean)", "generation wait s/step", "training s/step", "weight sync s/step"]
    rows = [[LABELS[system], f"{s['samples_per_s']:.1f}", ", ".join(f"{r['samples_per_s']:.1f}" for r in trials[system]),
             f"{s['sampled_accuracy']:.3f}", ", ".join(f"{r['eval']['sampled_accuracy']:.3f}" for r in trials[system]),
             f"{s['accuracy']:.3f}", *(f"{s[f'{p}_s'] / steps:.2f}" for p in ("generation", "training", "weight_sync"))]
            for system, s in summary.items()]
    ratios = {system: summary[system]["samples_per_s"] / summary["sync"]["samples_per_s"]
              for system in map(queue_system, QUEUES)}
    rows += [[f"{system} / sync", f"{ratio:.2f}", "", "", "", "", "", "", ""] for system, ratio in ratios.items()]
    ratio = ratios["async"]
    title = (f"Async vs synchronous GRPO, tiny preset: {steps} rollout steps, {repeats} seeds, held-out accuracy on "
             f"{rl_trial.EVAL_SAMPLES} prompts after the last step")
    return Report(title, columns, rows, data={"systems": summary, "ratio_async_sync": ratio, "ratios_to_sync": ratios,
                                              "trials": trials,
                                              "overrides": SYSTEMS})


def summarize(results: list[dict]) -> dict:
    out = {key: statistics.median(r[key] for r in results) for key in
           ("samples_per_s", "generation_s", "training_s", "weight_sync_s")}
    out |= {key: statistics.mean(r["eval"][key] for r in results) for key in ("sampled_accuracy", "accuracy")}
    return out
