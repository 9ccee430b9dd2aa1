"""What `infra.deterministic` costs the tiny preset: RL samples/s and SFT tokens/s with it on and off.

    python -m benchmarks run determinism [--steps N] [--repeats N] [--sft-steps N]

The mode fixes MKL's kernel choice (MKL_CBWR=AUTO,STRICT, read once at a process's start) and turns on torch's
deterministic algorithms (stages/common/determinism.py), so each trial is a fresh process started without MKL_CBWR
(a process of the run exports it when the config asks). A pair of trials per repeat, the setting's order
alternating: the RL stage on a local Ray cluster (the GRPO benchmark's trial: the tiny preset's rollout shape from
the same start policy; samples/s over the rollout steps' timers) and our SFT stage in one process (the SFT
benchmark's trial: tokens/s over its optimizer steps). The table gives medians and the ratio of the medians.
"""

from __future__ import annotations

import os
import statistics

from benchmarks import grpo_compare, trl_compare
from benchmarks.report import Report, RunOptions
from stages.common import determinism as mode

DEFAULT_STEPS = 8
DEFAULT_SFT_STEPS = 40
SETTINGS = {False: "off (the schema's default)", True: "on (the tiny preset)"}


def determinism(options: RunOptions) -> Report:
    for key in mode.ENV:  # an off trial must not inherit the mode from this process (a test's, a shell's)
        os.environ.pop(key, None)
    steps, sft_steps, repeats = options.steps or DEFAULT_STEPS, DEFAULT_SFT_STEPS, options.repeats_or(3)
    data = trl_compare.tiny_data(options.workdir)
    policy = grpo_compare.start_policy(options.workdir, data, options.sft_steps or grpo_compare.SFT_STEPS)
    trials: dict[bool, list[dict]] = {setting: [] for setting in SETTINGS}
    for repeat in range(repeats):
        order = list(SETTINGS) if repeat % 2 == 0 else list(reversed(SETTINGS))
        for setting in order:
            flag = [f"infra.deterministic={str(setting).lower()}"]
            work = options.workdir / f"determinism-{repeat}-{int(setting)}"
            rl = trl_compare.run_trial("rl", "ours", steps, {**data, "policy": policy}, work / "rl",
                                       module=grpo_compare.__name__, overrides=flag)
            sft = trl_compare.run_trial("sft", "ours", sft_steps, data, work / "sft", overrides=flag)
            trials[setting].append({"rl_samples_per_s": rl["samples_per_s"], "sft_tokens_per_s": sft["tokens_per_s"]})
            print(f"[determinism] repeat {repeat + 1}/{repeats} {SETTINGS[setting]}: RL {rl['samples_per_s']:.1f} "
                  f"samples/s, SFT {sft['tokens_per_s']:,.0f} tokens/s", flush=True)
    return report(trials, steps, sft_steps, repeats)


def report(trials: dict[bool, list[dict]], steps: int, sft_steps: int, repeats: int) -> Report:
    keys = ("rl_samples_per_s", "sft_tokens_per_s")
    median = {s: {k: statistics.median(t[k] for t in trials[s]) for k in keys} for s in SETTINGS}
    ratio = {k: median[True][k] / median[False][k] for k in keys}
    columns = ["infra.deterministic", "RL samples/s", "SFT tokens/s", "per trial (RL / SFT)"]
    rows = [[label, f"{median[s]['rl_samples_per_s']:.1f}", f"{median[s]['sft_tokens_per_s']:,.0f}",
             ", ".join(f"{t['rl_samples_per_s']:.1f} / {t['sft_tokens_per_s']:,.0f}" for t in trials[s])]
            for s, label in SETTINGS.items()]
    rows.append(["on / off", f"{ratio['rl_samples_per_s']:.2f}", f"{ratio['sft_tokens_per_s']:.2f}", ""])
    title = (f"infra.deterministic, tiny preset: RL (GRPO, {steps} rollout steps, local Ray cluster) and SFT "
             f"({sft_steps} optimizer steps, one process); {repeats} pairs of fresh processes, the order alternating")
    return Report(title, columns, rows, data={"medians": {str(s).lower(): m for s, m in median.items()}, "ratio": ratio,
                                              "trials": {str(s).lower(): t for s, t in trials.items()}})
