"""RL objectives and critic starts on the tiny task: the held-out accuracy each reaches from the same SFT policy.

    python -m benchmarks run objectives [--steps N] [--repeats N]

Starts from the tiny preset's own SFT policy (its SFT stage as `rlhf run` trains it) and runs the preset's RL
stage (one RL run per process: benchmarks/rl_trial.py) for each system, the systems alternating within a
seed, each seed its own sampling and prompt order:

- `grpo`: the preset's GRPO, each token's ratio clipped (`rl.algorithm.policy_loss_type: ppo`);
- `gspo`: GSPO, the sequence's ratio clipped (`policy_loss_type: gspo`) at the GSPO paper's 3e-4 / 4e-4;
- `prorl`: GRPO with ProRL's stop-properly penalty at OpenRLHF's ProRL v2 setting (a response cut at
  `rl.rollout.generate_max_len` scores 0: `rl.algorithm.stop_properly_penalty_coef: 0`);
- `ppo-critic-sft` and `ppo-critic-rm`: PPO (GAE, a critic, the KL penalty in the reward) with the critic
  started from the SFT policy and a fresh head, or from the preset's reward model, trained here on the
  preset's preference pairs (`rl.critic.init_from: path`).

The reward is the preset's rule reward in every system. Accuracy is the stage's held-out eval before the
first step (the SFT policy) and after the last (greedy and sampled, `rl_trial.EVAL_SAMPLES` prompts).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import rl_trial, trl_compare
from benchmarks.report import Report, RunOptions

DEFAULT_STEPS = 30  # the tiny preset's RL
PPO = ["rl.algorithm.advantage_estimator=gae", "rl.algorithm.use_kl_loss=false", "rl.algorithm.init_kl_coef=0.05",
       "rl.algorithm.kl_estimator=k1"]
SYSTEMS = {
    "grpo": [],
    "gspo": ["rl.algorithm.policy_loss_type=gspo", "rl.algorithm.eps_clip_low=3e-4", "rl.algorithm.eps_clip_high=4e-4"],
    "prorl": ["rl.algorithm.stop_properly_penalty_coef=0"],
    "ppo-critic-sft": PPO,
    "ppo-critic-rm": [*PPO, "rl.critic.init_from=path"],  # init_path: the reward model trained here
}
LABELS = {"grpo": "GRPO (token ratio clipped, the preset)",
          "gspo": "GSPO (sequence ratio clipped at 3e-4 / 4e-4)",
          "prorl": "GRPO + ProRL stop-properly penalty 0",
          "ppo-critic-sft": "PPO, critic from the SFT policy",
          "ppo-critic-rm": "PPO, critic from the reward model"}


def reward_model(workdir: Path, data: dict[str, Path], policy: Path) -> Path:
    """The tiny preset's rm stage on the SFT policy and the preference pairs, in this process, once per run."""
    from benchmarks.in_process import single_rank_env
    from benchmarks.methods import stage
    from configs import load_config

    single_rank_env()
    return stage("rm", "stages.rm.stage", "reward_model", load_config(None, []), workdir,
                 {"sft_model": policy, "pref_data": data["pref_data"]})


def objectives(options: RunOptions) -> Report:
    steps, repeats = options.steps or DEFAULT_STEPS, options.repeats_or(1)
    data = trl_compare.tiny_data(options.workdir)
    policy = rl_trial.preset_policy(options.workdir, data)
    rm = reward_model(options.workdir / "objectives-rm", data, policy)
    trials: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
    for seed in range(1, repeats + 1):
        for system, overrides in SYSTEMS.items():
            extra = [f"rl.critic.init_path={rm}"] if system == "ppo-critic-rm" else []
            result = trl_compare.run_trial("grpo", system, steps, {**data, "policy": policy},
                                           options.workdir / f"objectives-{system}-{seed}", module=rl_trial.__name__,
                                           overrides=[*overrides, *extra, f"seed={seed}"])
            trials[system].append(result)
            print(f"[objectives] seed {seed} {system}: sampled accuracy {result['before']['sampled_accuracy']:.3f} -> "
                  f"{result['eval']['sampled_accuracy']:.3f}", flush=True)
    columns = ["system", "sampled accuracy: SFT -> after (mean)", "per seed", "greedy accuracy: SFT -> after (mean)",
               "samples/s (median)"]
    rows, summary = [], {}
    for system, results in trials.items():
        s = summary[system] = summarize(results)
        rows.append([LABELS[system], f"{s['before_sampled_accuracy']:.3f} -> {s['sampled_accuracy']:.3f}",
                     ", ".join(f"{r['eval']['sampled_accuracy']:.3f}" for r in results),
                     f"{s['before_accuracy']:.3f} -> {s['accuracy']:.3f}", f"{s['samples_per_s']:.1f}"])
    title = (f"RL objectives and critic starts, tiny preset: {steps} rollout steps from its SFT policy, {repeats} seed(s), "
             f"held-out accuracy on {rl_trial.EVAL_SAMPLES} prompts")
    return Report(title, columns, rows, data={"systems": summary, "trials": trials, "overrides": SYSTEMS})


def summarize(results: list[dict]) -> dict:
    out = {key: statistics.mean(r["eval"][key] for r in results) for key in ("sampled_accuracy", "accuracy")}
    out |= {f"before_{key}": statistics.mean(r["before"][key] for r in results) for key in ("sampled_accuracy", "accuracy")}
    out["samples_per_s"] = statistics.median(r["samples_per_s"] for r in results)
    return out
