"""RL stage throughput on the tiny preset: samples per second and where a rollout step's time goes.

    python -m benchmarks.rl_throughput [--sft-steps N] [--steps N] [KEY=VALUE ...]

Builds the tiny data and an SFT policy once (in a temporary folder, `--sft-steps` optimizer steps),
then runs the RL stage on a local Ray cluster for each variant below and prints one table row per
variant: samples/s over all rollout steps, and the mean seconds per step spent in generation,
reward scoring, experience making (old/reference log-probs, values, advantages), training and the
weight sync into the rollout engine. Extra KEY=VALUE overrides apply to every variant.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "GRPO (KL loss, reference)": ["rl.advantage_estimator=group_norm"],
    "RLOO (no reference)": ["rl.advantage_estimator=rloo", "rl.init_kl_coef=0", "rl.use_kl_loss=false"],
    "PPO (critic + reference)": ["rl.advantage_estimator=gae", "rl.use_kl_loss=false", "rl.init_kl_coef=0.05"],
}
PARTS = ("generation", "reward", "experience", "training", "weight_sync")


def single_rank_env() -> None:
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      DS_ACCELERATOR="cpu")


def make_ctx(stage: str, cfg, root: Path, log=None):
    from stages.contract import StageContext

    ctx = StageContext(stage=stage, config=cfg, output_dir=root / "output", work_dir=root / "work")
    ctx.output_dir.mkdir(parents=True)
    if log is not None:
        ctx.log_metrics = log
    return ctx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--steps", type=int, default=10, help="rollout steps per variant")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import ray
    import torch

    from configs import load_config
    from stages import data_prep, sft
    from stages.rl import stage as rl_stage

    single_rank_env()
    root = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    cfg = load_config(None, [f"sft.max_steps={args.sft_steps}", "sft.save_every=100000", *args.overrides])
    print(f"preparing data and a {args.sft_steps}-step SFT policy in {root} ...", flush=True)
    data = data_prep.run(make_ctx("data_prep", cfg, root / "data"), {}).outputs
    policy = sft.run(make_ctx("sft", cfg, root / "sft"), {"base_model": data["base_model"], "sft_data": data["sft_data"]})
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

    ray.init(address="local", num_cpus=cfg.infra.num_cpus, include_dashboard=False, log_to_driver=False)
    rows = []
    for name, variant in VARIANTS.items():
        vcfg = load_config(None, [*variant, f"rl.max_steps={args.steps}", f"rl.eval_every={10**6}", *args.overrides])
        steps: list[dict[str, float]] = []
        ctx = make_ctx("rl", vcfg, root / name.split()[0].lower(),
                       lambda m, s, steps=steps: steps.append(m) if "samples_per_s" in m else None)
        start = time.monotonic()
        rl_stage.run(ctx, {"sft_model": policy.outputs["sft_model"], "prompts": data["prompts"], "eval_data": data["eval_data"]})
        wall = time.monotonic() - start
        samples = vcfg.rl.rollout_batch_size * vcfg.rl.n_samples_per_prompt * len(steps)
        step_s = sum(sum(m.get(f"time/{p}", 0.0) for p in PARTS) for m in steps)
        rows.append((name, samples / step_s, *(sum(m.get(f"time/{p}", 0.0) for m in steps) / len(steps) for p in PARTS), wall))
    ray.shutdown()

    print(f"\nRL throughput, tiny preset ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"{args.steps} rollout steps of {vcfg.rl.rollout_batch_size} prompts x {vcfg.rl.n_samples_per_prompt} samples)")
    header = ["variant", "samples/s", *(f"{p} s/step" for p in PARTS), "stage wall s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, rate, *rest in rows:
        print(f"| {name} | {rate:.1f} | " + " | ".join(f"{v:.2f}" for v in rest[:-1]) + f" | {rest[-1]:.1f} |")


if __name__ == "__main__":
    main()
