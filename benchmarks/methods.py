"""Rejection sampling, distillation and conditional SFT against SFT on the tiny task: held-out accuracy.

    python -m benchmarks.methods [rs] [dpo kd] [rm csft] [--workdir DIR] [--out benchmarks/results/methods.json]
                                 [KEY=VALUE ...]

runs data prep and SFT, then the named stages, each stage's own `run` in this process (no Ray, MLflow or
Prefect), on the tiny preset with the overrides given; kd distils the DPO policy into the SFT policy (the
GRPO teacher of the default `kd.teacher: rl` takes an RL run). Each policy is scored as the eval stage
scores it (greedy and sampled accuracy on the held-out prompts) right after its stage, and the JSON file
is written after each, with the date and machine. A stage whose output is already in the work folder is
not run again, and a stage killed midway resumes from its work dir's checkpoints; `--report` prints the
table of a JSON file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.in_process import make_ctx, single_rank_env
from benchmarks.machine import machine

STAGES = {  # name: (module, output, inputs besides sft_model / dpo_model / reward_model)
    "rs": ("stages.rs.stage", "rs_model", ("sft_data", "prompts")),
    "dpo": ("stages.dpo.stage", "dpo_model", ("pref_data",)),
    "kd": ("stages.kd.stage", "kd_model", ("sft_data",)),
    "rm": ("stages.rm.stage", "reward_model", ("pref_data",)),
    "csft": ("stages.csft.stage", "csft_model", ("sft_data",)),
}
UPSTREAM = {"kd": "dpo_model", "csft": "reward_model"}  # what the stage takes from an earlier one here
POLICIES = ("rs", "dpo", "kd", "csft")
COLUMNS = (("accuracy", "greedy accuracy"), ("sampled_accuracy", "sampled accuracy"), ("reward", "greedy reward"))


def stage(name: str, module: str, output: str, cfg, workdir: Path, inputs: dict[str, Path]) -> Path:
    """The stage's output in `workdir/<name>/output`, run (or resumed from its work dir) unless it is there."""
    import importlib

    root = workdir / name
    out = root / "output" / output
    if out.exists():
        return out
    if (root / "output").exists():  # a run killed while writing its outputs: they are made again
        import shutil

        shutil.rmtree(root / "output")
    ctx = make_ctx(name, cfg, root)
    started = time.monotonic()
    result = importlib.import_module(module).run(ctx, inputs)
    print(f"[methods] {name}: {time.monotonic() - started:.0f} s, {result.metrics}", flush=True)
    return result.outputs[output]


def markdown(result: dict) -> str:
    lines = [f"Measured {result['date']}, {result['machine']['cpus']} CPUs ({result['machine']['platform']}), torch "
             f"{result['machine']['torch']}; overrides: {' '.join(result['overrides']) or 'none'}.", "",
             "| model | " + " | ".join(title for _, title in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, metrics in result["models"].items():
        lines.append(f"| {name} | " + " | ".join(f"{metrics[key]:.3f}" if key in metrics else "-" for key, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.methods", description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="*", metavar="STAGE or KEY=VALUE", help=f"stages among {', '.join(STAGES)}; overrides")
    parser.add_argument("--out", default="benchmarks/results/methods.json")
    parser.add_argument("--workdir", default="methods-work", help="where each stage's outputs and work dir go (kept)")
    parser.add_argument("--report", action="store_true", help="print the markdown table of --out and exit")
    args = parser.parse_args(argv)
    if args.report:
        print(markdown(json.loads(Path(args.out).read_text())), end="")
        return 0
    overrides = [item for item in args.items if "=" in item]
    names = [item for item in args.items if "=" not in item]
    unknown = [name for name in names if name not in STAGES]
    if unknown:
        parser.error(f"unknown stage {', '.join(unknown)} (any of: {', '.join(STAGES)})")
    for name, needed in UPSTREAM.items():
        maker = next(n for n, spec in STAGES.items() if spec[1] == needed)
        if name in names and (maker not in names or names.index(maker) > names.index(name)):
            parser.error(f"{name} takes {needed}: name {maker} before it")

    single_rank_env()
    from configs import load_config
    from stages.data.prepared import read_split
    from stages.data_prep import stage as data_prep
    from stages.eval import stage as evaluate
    from stages.rewards.factory import build_scorer

    cfg = load_config(None, [*(["kd.teacher=dpo"] if "kd" in names else []), *overrides])
    workdir, out_file = Path(args.workdir).resolve(), Path(args.out)
    prepared = workdir / "data_prep" / "output"
    if not (prepared / "eval_data").exists():
        data_prep.run(make_ctx("data_prep", cfg, workdir / "data_prep"), {})
    artifacts = {n: prepared / n for n in ("base_model", "sft_data", "pref_data", "prompts", "eval_data")}
    artifacts["sft_model"] = stage("sft", "stages.sft.stage", "sft_model", cfg, workdir,
                                   {n: artifacts[n] for n in ("base_model", "sft_data")})
    prompts = read_split(artifacts["eval_data"], "eval")[: cfg.eval.max_samples]
    sft_eval = read_split(artifacts["sft_data"], "eval")
    scorer = build_scorer(cfg.reward, {})
    models: dict[str, dict[str, float]] = {}
    result = {"benchmark": "methods", "date": time.strftime("%Y-%m-%d"), "machine": machine(), "overrides": overrides,
              "models": models}

    def score(name: str, path: Path) -> None:
        models[name], _ = evaluate.evaluate_model(path, cfg, prompts, sft_eval, scorer)
        print(f"[methods] eval {name}: {models[name]}", flush=True)
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(json.dumps(result, indent=2) + "\n")

    score("sft", artifacts["sft_model"])
    for name in names:
        module, output, needs = STAGES[name]
        inputs = {n: artifacts[n] for n in ("sft_model", *needs)}
        if name in UPSTREAM:
            inputs[UPSTREAM[name]] = artifacts[UPSTREAM[name]]
        artifacts[output] = stage(name, module, output, cfg, workdir, inputs)
        if name in POLICIES:
            score(name, artifacts[output])
    print(markdown(result), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
