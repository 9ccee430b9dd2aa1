"""GRPO on one CUDA GPU at a user's scale: our RL stage against TRL's GRPOTrainer, side by side.

Both start from the random-init checkpoint of Qwen2-0.5B's shape that benchmarks/gpu_stages.py builds, with
the word game's local prompts and `reward_func` ([own task](../docs/own-task.md)), and run the same rollout
shape (prompts x samples of a fixed number of new tokens, temperature 1) with HF `generate` in bf16, then the
same optimizer steps: group-normalised advantages, the k3 KL loss against the start model at the tiny
preset's coefficient, its clip range, a constant learning rate. Ours is the RL stage's own loop with its
workers in this process (`stages.rl.stage.run_in_process`: a bare GPU machine has no Ray), the policy under
DeepSpeed ZeRO-2, and in a third row ZeRO-0 as the qwen2.5-0.5b-gsm8k preset runs it, sampling with the
weights it trains (`rl.rollout.engine=hybrid`). TRL trains the model in bf16 as it loads a bf16 hub checkpoint. A random
init samples to the length limit in both systems, the same work, so this measures throughput, not
learning. Time is the rollout loop only (see benchmarks/grpo_compare.py); each trial is a fresh process,
the systems alternate, the table gives medians.

    python -m benchmarks.gpu_grpo [--steps 6] [--repeats 2] [--out gpu_grpo.json]
    python -m benchmarks.gpu_grpo --device cpu --tiny --steps 2 --repeats 1   # the code paths on a CPU
    python -m benchmarks.gpu_grpo --report benchmarks/results/gpu_grpo.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SYSTEMS = ("ours", "trl", "ours_zero0")
LABELS = {"ours": "ours: `stages.rl` (in-process workers, DeepSpeed ZeRO-2 policy sampling itself)",
          "trl": "TRL {version} `GRPOTrainer` (HF generate)",
          "ours_zero0": "ours, DeepSpeed ZeRO-0 (nothing partitioned on one GPU), as the one-GPU preset runs"}
SYSTEM_OVERRIDES = {"ours_zero0": ["infra.zero_stage=0"]}
RATIO_LABELS = {"ours": "ours / TRL", "ours_zero0": "ours at ZeRO-0 / TRL"}
NEVER = 10**9


def settings(tiny: bool, cuda: bool, steps: int) -> list[str]:
    """The trial's overrides on the task's config: 16 prompts x 8 samples of 64 new tokens, two optimizer
    steps of 64 samples (micro-batches of 16), no eval or checkpoint inside the loop."""
    prompts, group, new_tokens, micro = (4, 4, 8, 4) if tiny else (16, 8, 64, 16)
    per_rollout = prompts * group
    return [f"infra.precision={'bf16' if cuda else 'fp32'}", "infra.zero_stage=2", "rl.rollout.engine=hybrid",
            "rl.algorithm.advantage_estimator=group_norm", f"rl.max_steps={steps}", f"rl.rollout.batch_size={prompts}",
            f"rl.rollout.n_samples_per_prompt={group}", f"rl.rollout.generate_max_len={new_tokens}",
            f"rl.rollout.micro_batch_size={per_rollout}", f"rl.train_batch_size={per_rollout // 2}",
            f"rl.micro_train_batch_size={micro}", "rl.actor.warmup_ratio=0", "rl.actor.min_lr_ratio=1",
            f"rl.eval_every={NEVER}", f"rl.save_every={NEVER}", "eval.max_samples=4", "eval.samples_per_prompt=0",
            "eval.max_new_tokens=4", "rl.shared_prompt=false"]


def trial_config(spec: dict):
    from configs import load_config

    return load_config(spec["data"]["config"], spec["overrides"])


def trial_main(spec: dict) -> None:
    import torch

    from benchmarks import grpo_compare
    from stages.common import dist_env

    os.environ.update(dist_env.single_rank_env())  # one DeepSpeed rank (the trial's environment has none)
    work = Path(spec["work"])
    data = {name: Path(path) for name, path in spec["data"].items()}
    cfg = trial_config(spec)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    # ours: no Ray on a bare GPU machine, the stage's workers in this process
    measured = (grpo_compare.trl(cfg, data, work) if spec["system"] == "trl"
                else grpo_compare.ours(cfg, data, work, in_process=True))
    result = {"system": spec["system"], **measured, "samples_per_s": measured["samples"] / measured["seconds"],
              "tokens_per_s": measured["response_tokens"] / measured["seconds"],
              "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None}
    (work / "result.json").write_text(json.dumps(result))


def run(args) -> dict:
    import torch

    from benchmarks import trl_compare
    from benchmarks.gpu_smoke import device_name
    from benchmarks.gpu_stages import prepare
    from benchmarks.machine import machine
    from benchmarks.mfu import count_params
    from configs import load_config
    from stages.common import dist_env
    from stages.dag.contract import StageContext
    from stages.data_prep.stage import run as data_prep

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but torch sees no CUDA GPU here; use --device cpu --tiny")
    os.environ.update(dist_env.single_rank_env())
    root = Path(args.workdir or tempfile.mkdtemp(prefix="rlhf-gpu-grpo-")).resolve()
    config = prepare(root / "task", args.tiny, args.seed)
    overrides = settings(args.tiny, cuda, args.steps)
    if args.tiny:  # held-out sets of a few rows
        overrides += [f"data.{name}.eval_min_rows=8" for name in ("sft", "preference", "prompts")]
    ctx = StageContext(stage="data_prep", config=load_config(str(config), overrides),
                       output_dir=root / "data_prep" / "output", work_dir=root / "data_prep" / "work")
    ctx.output_dir.mkdir(parents=True)
    prepared = data_prep(ctx, {}).outputs
    data = {"config": config, "policy": prepared["base_model"], "base_model": prepared["base_model"],
            "prompts": prepared["prompts"], "eval_data": prepared["eval_data"]}
    trials: dict[str, list[dict]] = {s: [] for s in args.systems}
    failed: dict[str, str] = {}
    for repeat in range(args.repeats):
        for system in (s for s in args.systems if s not in failed):
            try:
                result = trl_compare.run_trial("grpo", system, args.steps, data, root / f"{system}-{repeat}",
                                               module="benchmarks.gpu_grpo",
                                               overrides=[*overrides, *SYSTEM_OVERRIDES.get(system, [])])
            except RuntimeError as exc:  # reported with the table; the other systems go on
                failed[system] = str(exc)[-2000:]
                print(f"[gpu_grpo] {system} failed:\n{failed[system]}", flush=True)
                continue
            trials[system].append(result)
            print(f"[gpu_grpo] trial {repeat + 1}/{args.repeats} {system}: {result['samples_per_s']:,.1f} samples/s, "
                  f"generation {result['generation_s']:.2f} s, experience {result['experience_s']:.2f} s, "
                  f"training {result['training_s']:.2f} s", flush=True)
    cfg = load_config(str(config), overrides)
    return {"benchmark": "gpu_grpo", "date": time.strftime("%Y-%m-%d"), "machine": machine(), "device": device_name(),
            "params": count_params(prepared["base_model"]), "model": "tiny" if args.tiny else "qwen2-0.5b shape",
            "steps": args.steps, "repeats": args.repeats,
            "trl_version": importlib.metadata.version("trl") if "trl" in args.systems else None,
            "shape": {"prompts": cfg.rl.rollout.batch_size, "group": cfg.rl.rollout.n_samples_per_prompt,
                      "new_tokens": cfg.rl.rollout.generate_max_len, "train_batch": cfg.rl.train_batch_size,
                      "micro_batch": cfg.rl.micro_train_batch_size, "precision": cfg.infra.precision},
            "trials": {s: t for s, t in trials.items() if t}, "failed": failed}


PART_COLUMNS = ("generation_s", "experience_s", "training_s")


def report(result: dict) -> str:
    """A result file's heading and table, as docs/gpu.md shows them."""
    s, steps = result["shape"], result["steps"]
    head = (f"{result['device']}, {result['date']}: GRPO, {result['params'] / 1e6:.1f}M parameters ({result['model']}), "
            f"{steps} rollout steps of {s['prompts']} prompts x {s['group']} samples x {s['new_tokens']} new tokens, "
            f"optimizer steps of {s['train_batch']} samples in micro-batches of {s['micro_batch']}, {s['precision']}; "
            f"{result['repeats']} alternating trials per system.")
    lines = ["| system | samples/s (median) | response tokens/s | samples/s per trial | generation s/step | "
             "experience s/step | training s/step | peak GPU GiB |", "|---|---|---|---|---|---|---|---|"]
    medians = {}
    for system, trials in result["trials"].items():
        medians[system] = statistics.median(t["samples_per_s"] for t in trials)
        parts = [statistics.median(t[p] for t in trials) / steps for p in PART_COLUMNS]
        peak = statistics.median(t["peak_mem_gib"] for t in trials) if trials[0]["peak_mem_gib"] is not None else None
        tokens = statistics.median(t["tokens_per_s"] for t in trials)
        lines.append(f"| {LABELS[system].format(version=result['trl_version'])} | {medians[system]:,.1f} | {tokens:,.0f} | "
                     + ", ".join(f"{t['samples_per_s']:,.1f}" for t in trials) + " | "
                     + " | ".join(f"{p:.2f}" for p in parts) + f" | {'-' if peak is None else peak} |")
    for system in (s for s in medians if s != "trl" and "trl" in medians):
        lines.append(f"| {RATIO_LABELS[system]} | {medians[system] / medians['trl']:.2f} |  |  |  |  |  |  |")
    for system, error in result.get("failed", {}).items():
        lines.append(f"\n{system} failed: {error.strip().splitlines()[-1]}")
    return head + "\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gpu_stages import device_options, use_device

    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_grpo", description=__doc__.split("\n\n")[0])
    device_options(parser, "gpu_grpo.json")
    parser.add_argument("--steps", type=int, default=6, help="rollout steps per trial")
    parser.add_argument("--repeats", type=int, default=2, help="alternating trials per system")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    args = parser.parse_args(argv)
    if args.report:
        print(report(json.loads(Path(args.report).read_text())), end="")
        return 0
    use_device(args.device)
    result = run(args)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + report(result), end="", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):
        trial_main(json.loads(sys.argv[1]))  # one trial, started by `run`
    else:
        raise SystemExit(main())
