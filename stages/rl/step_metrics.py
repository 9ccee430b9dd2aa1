"""The RL stage's per-step metrics under the pipeline's metric scheme: the headline curves in the
`train/` chart section (`train/reward`, `train/kl`, `train/response_length`), rollout diagnostics under
`rollout/`, the workers' own under `actor/`, `critic/`, `reward/` and `time/`, and no series for a value
the config holds fixed (a fixed KL coefficient, no dynamic filtering, synchronous training's staleness, no
weight sync in hybrid mode, a constant learning rate)."""

from __future__ import annotations

HEADLINE = ("reward", "kl", "response_length")
SECTIONS = ("actor/", "critic/", "reward/", "time/")


def fixed_keys(rl) -> set[str]:
    """The step logs whose value the `rl` config section holds constant."""
    fixed = set()
    if rl.algorithm.kl_target is None:
        fixed.add("kl_coef")
    if not rl.algorithm.dynamic_filtering:
        fixed.add("filtered_groups")
    if not rl.rollout.async_train:
        fixed.add("staleness")
    if rl.rollout.engine == "hybrid":
        fixed.add("time/weight_sync")
    for group in ("actor", "critic"):
        if getattr(rl, group).constant_lr:
            fixed.add(f"{group}/lr")
    return fixed


def step_metrics(logs: dict[str, float], rl) -> dict[str, float]:
    """`{"reward": r, "reward_std": s, "actor/entropy": e, ...}` -> `{"train/reward": r, "rollout/reward_std": s,
    "actor/entropy": e, ...}`, less the keys `fixed_keys(rl)` names."""
    fixed = fixed_keys(rl)
    named = {}
    for key, value in logs.items():
        if key in fixed:
            continue
        if key in HEADLINE:
            named[f"train/{key}"] = value
        elif key.startswith(SECTIONS):
            named[key] = value
        else:
            named[f"rollout/{key.removeprefix('rollout_')}"] = value
    return named
