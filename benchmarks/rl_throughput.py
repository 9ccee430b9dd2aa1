"""RL stage throughput by algorithm: samples per second and where a rollout step's time goes.

    python -m benchmarks run rl [--steps N]

Starts from the same policy as the GRPO benchmark (a short SFT run of the tiny base model) and runs
the RL stage on a local Ray cluster once per variant below, with the tiny preset's rollout shape.
Samples/s is over the rollout steps only (the sum of the per-step timers: generation, reward
scoring, experience making, training, weight sync), as in the GRPO benchmark; actor start-up and
the held-out evals fall outside. TRL 1.13.0 has no PPO trainer to run beside ours; GRPO's
comparison with TRL is the `grpo` benchmark.
"""

from __future__ import annotations

from benchmarks import grpo_compare, trl_compare
from benchmarks.report import Report, RunOptions

DEFAULT_STEPS = 8
VARIANTS = {
    "GRPO (KL loss, reference)": ["rl.algorithm.advantage_estimator=group_norm"],
    "RLOO (no reference)": ["rl.algorithm.advantage_estimator=rloo", "rl.algorithm.init_kl_coef=0", "rl.algorithm.use_kl_loss=false"],
    "REINFORCE++-baseline (KL in the reward)": ["rl.algorithm.advantage_estimator=reinforce_baseline", "rl.algorithm.use_kl_loss=false",
                                                "rl.algorithm.init_kl_coef=0.01"],
    "PPO (critic + reference, GAE)": ["rl.algorithm.advantage_estimator=gae", "rl.algorithm.use_kl_loss=false", "rl.algorithm.init_kl_coef=0.05"],
}


def rl(options: RunOptions) -> Report:
    steps = options.steps or DEFAULT_STEPS
    data = trl_compare.tiny_data(options.workdir)
    policy = grpo_compare.start_policy(options.workdir, data, options.sft_steps or grpo_compare.SFT_STEPS)
    results = {}
    for i, (name, overrides) in enumerate(VARIANTS.items()):
        result = trl_compare.run_trial("rl", "ours", steps, {**data, "policy": policy}, options.workdir / f"rl-{i}",
                                       module=grpo_compare.__name__, overrides=overrides)
        results[name] = result
        print(f"[rl] {name}: {result['samples_per_s']:,.1f} samples/s", flush=True)
    parts = grpo_compare.PARTS
    columns = ["variant", "samples/s", "response tokens/s", *(f"{p.replace('_', ' ')} s/step" for p in parts)]
    rows = [[name, f"{r['samples_per_s']:,.1f}", f"{r['tokens_per_s']:,.0f}", *(f"{r[f'{p}_s'] / steps:.2f}" for p in parts)]
            for name, r in results.items()]
    first = next(iter(results.values()))
    title = (f"RL stage by algorithm, tiny preset: {steps} rollout steps of {first['prompts']} prompts x "
             f"{first['group_size']} samples, every actor colocated on the CPU's cores, rl.rollout.engine={first['settings']['engine']}")
    return Report(title, columns, rows, data={"variants": results, "overrides": VARIANTS})
