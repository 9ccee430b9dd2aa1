"""Time per RL weight sync, broadcast over a gloo group vs whole state dicts through Ray's object store, for the
tiny preset's model and a 132M-parameter Llama-style one, on this CPU: the RL stage itself (policy actor and
one HF engine actor on a local Ray cluster, no reference model), a few steps, its logged `time/weight_sync`.
Trials of the two ways alternate. Writes the trials and per-size medians as JSON.

    python -m benchmarks.weight_sync [--steps 4] [--repeats 2] [--out benchmarks/results/weight_sync.json]
    python -m benchmarks.weight_sync --report benchmarks/results/weight_sync.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import mfu
from benchmarks.report import add_result_args, print_saved, save, with_note

# model.tiny sizes: the tiny preset's, and 132M parameters (Llama-style, 14 layers of width 768)
SIZES = {"tiny": [], "100m": ["model.tiny.hidden_size=768", "model.tiny.intermediate_size=3072",
                              "model.tiny.num_hidden_layers=14", "model.tiny.num_attention_heads=12",
                              "model.tiny.num_key_value_heads=12"]}
MODES = ("broadcast", "object_store")


def config(size: str, mode: str, steps: int):
    from configs import load_config

    return load_config(None, [*SIZES[size], "data.synthetic.num_train=64", "data.synthetic.num_eval=8",
                              "data.synthetic.num_prompts=64", "rl.rollout.engine=hf", "rl.placement.colocate_all=true",
                              f"rl.rollout.weight_sync={mode}", f"rl.max_steps={steps}", "rl.rollout.batch_size=2",
                              "rl.rollout.n_samples_per_prompt=2", "rl.train_batch_size=4", "rl.micro_train_batch_size=4",
                              "rl.rollout.generate_max_len=8", "rl.algorithm.use_kl_loss=false", "rl.algorithm.init_kl_coef=0",
                              "rl.eval_every=1000", "rl.save_every=1000", "eval.max_samples=2",
                              "eval.samples_per_prompt=0", "eval.max_new_tokens=4"])


def trial(size: str, mode: str, steps: int, data: dict, work: Path) -> list[float]:
    """Each step's `time/weight_sync` in one RL stage run."""
    from benchmarks.in_process import make_ctx
    from runtime import rl_driver
    from runtime.resources import local_cluster

    cfg = config(size, mode, steps)
    syncs: list[float] = []
    ctx = make_ctx("rl", cfg, work, lambda m, step: syncs.append(m["time/weight_sync"]) if "time/weight_sync" in m else None)
    with local_cluster(cfg.infra.num_cpus, log_to_driver=False):
        rl_driver.run(ctx, {"sft_model": data["base_model"], "prompts": data["prompts"], "eval_data": data["eval_data"]})
    return syncs


def report(result: dict) -> str:
    lines = [f"Measured {result['date']} on {result['machine']['cpus']} CPUs ({result['machine']['platform']}), "
             f"torch {result['machine']['torch']}; {result['steps']} RL steps a trial, the first sync left out; "
             f"median seconds per sync over {result['repeats']} trial(s) of each.", "",
             "| model | parameters | broadcast (s) | object store (s) | object store / broadcast |", "|---|---|---|---|---|"]
    for size, row in result["sizes"].items():
        b, o = row["broadcast_s"], row["object_store_s"]
        lines.append(f"| {size} | {row['params'] / 1e6:.1f}M | {b:.4f} | {o:.4f} | {o / b:.2f} |")
    return with_note(lines, result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.weight_sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    add_result_args(parser, "benchmarks/results/weight_sync.json")
    args = parser.parse_args(argv)
    if args.report:
        return print_saved(args.report, report)
    from benchmarks.in_process import make_ctx, single_rank_env
    from benchmarks.machine import machine
    from stages.data_prep import stage as data_prep

    single_rank_env()
    root = Path(tempfile.mkdtemp(prefix="rlhf-weight-sync-"))
    result = {"benchmark": "weight_sync", "date": time.strftime("%Y-%m-%d"), "machine": machine(), "steps": args.steps,
              "repeats": args.repeats, "trials": [], "sizes": {}}
    for size in args.sizes:
        data = data_prep.run(make_ctx("data_prep", config(size, MODES[0], args.steps), root / size / "data"), {}).outputs
        for r in range(args.repeats):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:  # alternate which way goes first
                syncs = trial(size, mode, args.steps, data, root / size / f"{mode}-{r}")
                result["trials"].append({"size": size, "mode": mode, "repeat": r, "sync_s": syncs})
                print(f"[weight_sync] {size} {mode}: {[round(s, 4) for s in syncs]}", flush=True)
        per_mode = {mode: statistics.median(s for t in result["trials"] if t["size"] == size and t["mode"] == mode
                                            for s in t["sync_s"][1:]) for mode in MODES}
        result["sizes"][size] = {"params": mfu.count_params(data["base_model"]), **{f"{m}_s": v for m, v in per_mode.items()}}
    save(result, args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
