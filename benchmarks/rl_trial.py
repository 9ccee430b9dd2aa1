"""One RL stage run for the benchmarks that compare RL settings (`async`, `agent`), in a process of its
own (`trl_compare.run_trial(..., module="benchmarks.rl_trial")`): the tiny preset's GRPO with the
trial's overrides from a given start policy, on a local Ray cluster; it writes the rollout steps' timers
and the held-out evals before and after to `result.json`. `preset_policy` makes that start policy: the
tiny preset's own SFT stage, its settings unchanged."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks import grpo_compare
from benchmarks.report import folder_for

EVAL_SAMPLES = 100


def preset_policy(workdir: Path, data: dict[str, Path], overrides: Sequence[str] = ()) -> Path:
    """The tiny preset's SFT stage on its base model (as `rlhf run` trains it, with `overrides`), once per
    benchmark run and overrides."""
    from benchmarks import trl_compare

    work = folder_for(workdir, "preset-sft", overrides)
    if not work.exists():
        print("[benchmarks] training the start policy (the tiny preset's SFT stage) ...", flush=True)
        trl_compare.run_trial("sft", "preset", 0, data, work, module=__name__, overrides=overrides)
    return work / "output" / "sft_model"


def systems_by_seed(systems: dict[str, list[str]], steps: int, repeats: int, data: dict[str, Path], workdir: Path,
                    name: str, line: Callable[[dict], str]) -> dict[str, list[dict]]:
    """Each system's GRPO trial for seeds 1..`repeats`, the systems alternating within a seed (each a process of
    its own, in `workdir/<name>-<system>-<seed>`); `line(result)` is printed after each."""
    from benchmarks import trl_compare

    trials: dict[str, list[dict]] = {system: [] for system in systems}
    for seed in range(1, repeats + 1):
        for system, overrides in systems.items():
            result = trl_compare.run_trial("grpo", system, steps, data, workdir / f"{name}-{system}-{seed}",
                                           module=__name__, overrides=[*overrides, f"seed={seed}"])
            trials[system].append(result)
            print(f"[{name}] seed {seed} {system}: {line(result)}", flush=True)
    return trials


def sft_main(spec: dict) -> None:
    from benchmarks.in_process import make_ctx, single_rank_env
    from configs import load_config
    from stages.sft import stage as sft

    single_rank_env()
    work, data = Path(spec["work"]), {name: Path(path) for name, path in spec["data"].items()}
    cfg = load_config(None, spec["overrides"])
    sft.run(make_ctx("sft", cfg, work), {"base_model": data["base_model"], "sft_data": data["sft_data"]})
    (work / "result.json").write_text(json.dumps({"system": "preset"}))


def trial_main(spec: dict) -> None:
    from benchmarks.in_process import make_ctx
    from runtime import rl_driver
    from runtime.resources import local_cluster

    work, data = Path(spec["work"]), {name: Path(path) for name, path in spec["data"].items()}
    cfg = grpo_compare.bench_config(spec["steps"], [*spec["overrides"], f"eval.max_samples={EVAL_SAMPLES}"])
    steps: list[dict] = []
    evals: dict[int, dict] = {}

    def log(metrics: dict, step: int) -> None:
        if "rollout/samples_per_s" in metrics:
            steps.append(metrics)
        if any(k.startswith("eval/") for k in metrics):
            evals[step] = {k.removeprefix("eval/"): v for k, v in metrics.items() if k.startswith("eval/")}

    ctx = make_ctx("rl", cfg, work, log)
    with local_cluster(cfg.infra.num_cpus, log_to_driver=False):
        result = rl_driver.run(ctx, {"sft_model": data["policy"], "prompts": data["prompts"], "eval_data": data["eval_data"]})
    parts = {f"{p}_s": sum(m.get(f"time/{p}", 0.0) for m in steps) for p in grpo_compare.PARTS}
    samples = cfg.rl.rollout.batch_size * cfg.rl.rollout.n_samples_per_prompt * len(steps)
    (work / "result.json").write_text(json.dumps({
        "system": spec["system"], "overrides": spec["overrides"], "rollout_steps": len(steps), "samples": samples,
        "seconds": sum(parts.values()), **parts, "samples_per_s": samples / sum(parts.values()),
        "before": evals.get(0, {}),
        "eval": {k.removeprefix("eval/"): v for k, v in result.metrics.items() if k.startswith("eval/")},
    }))


if __name__ == "__main__":
    given = json.loads(sys.argv[1])
    (sft_main if given["task"] == "sft" else trial_main)(given)
