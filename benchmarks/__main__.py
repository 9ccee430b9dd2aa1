"""Run registered benchmarks: one markdown table each on stdout, every measurement in a JSON file.

    python -m benchmarks run [NAME ...] [--steps N] [--repeats N] [--sft-steps N] [--systems S ...] [--out benchmarks.json]
    python -m benchmarks run scale [--scale-rows N,N,...] [--scale-model 0.5b|50m] [--scale-cache DIR]
    python -m benchmarks list
    python -m benchmarks report [--check]     # the docs' tables from the JSON in benchmarks/results/

A benchmark is a function from `RunOptions` to a `Report` (benchmarks/report.py); add one to
BENCHMARKS to register it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import (
    agent,
    async_rl,
    determinism,
    grpo_compare,
    pipeline,
    rl_objectives,
    rl_throughput,
    rollout_engines,
    scale,
    threads,
    time_to_quality,
    trl_compare,
)
from benchmarks.machine import machine
from benchmarks.report import Report, RunOptions

BENCHMARKS: dict[str, tuple[Callable[[RunOptions], Report | dict[str, Report]], str]] = {
    "pipeline": (pipeline.pipeline, "the tiny pipeline through `rlhf run`: cold/warm wall time, orchestration share, "
                                    "peak memory per stage, and what its models learned"),
    "sft": (trl_compare.sft, "SFT tokens/s: our stage vs TRL's SFTTrainer (needs the bench extra)"),
    "dpo": (trl_compare.dpo, "DPO pairs/s and tokens/s: our stage vs TRL's DPOTrainer (needs the bench extra)"),
    "sft-50m": (trl_compare.sft_50m, "SFT at a compute-bound size (a ~50M Llama, rows of ~200 tokens) vs TRL, with "
                                     "MFU against this CPU's matmul peak (needs the bench extra)"),
    "dpo-50m": (trl_compare.dpo_50m, "DPO at the compute-bound size vs TRL, with MFU (needs the bench extra)"),
    "grpo": (grpo_compare.grpo, "GRPO samples/s and time split: our RL stage vs TRL's GRPOTrainer (needs the bench extra)"),
    "grpo-50m": (grpo_compare.grpo_50m, "GRPO at the compute-bound size (the ~50M Llama, random init) vs TRL, with "
                                        "training MFU (needs the bench extra)"),
    "grpo-ttq": (time_to_quality.time_to_quality, "seconds of GRPO training to a gain in sampled held-out accuracy: our RL "
                                                  "stage vs TRL's GRPOTrainer over seeds (needs the bench extra)"),
    "rl": (rl_throughput.rl, "RL stage samples/s and time split by algorithm: GRPO, RLOO, REINFORCE++-baseline, PPO"),
    "agent": (agent.agent, "multi-turn GRPO on the shipped two-turn environment: held-out success before and after"),
    "agent-async": (agent.agent_async, "multi-turn GRPO synchronous vs async, and through an OpenAI client: samples/s "
                                       "and held-out success"),
    "objectives": (rl_objectives.objectives, "GRPO, GSPO, the ProRL penalty and PPO with its critic from SFT or from the RM: "
                                             "held-out accuracy from the same SFT policy"),
    "async": (async_rl.async_rl, "async vs synchronous GRPO: samples/s and the held-out accuracy each ends on, over seeds"),
    "rollout": (rollout_engines.rollout, "rollout engines: HF `generate` vs vLLM (CPU build) tokens/s by batch size"),
    "threads": (threads.threads, "torch's threads from OMP_NUM_THREADS vs `torch.set_num_threads`: training step "
                                 "and generate time of the tiny model"),
    "determinism": (determinism.determinism, "infra.deterministic on vs off: RL samples/s and SFT tokens/s of the tiny "
                                             "preset in fresh processes"),
    "scale": (scale.scale, "a ~0.5B checkpoint and 20k/200k/1M-row files through `rlhf run --only data_prep,sft`: time "
                           "per stage (compute vs overhead), bytes stored, peak RSS per process, vs `datasets.map`"),
}
# run only when named (`python -m benchmarks run` alone leaves them out): scale is hours and tens of GB at its sizes
NAMED_ONLY = ("scale",)


def run(names: list[str], options: RunOptions, out: Path) -> None:
    reports, started = {}, time.monotonic()
    for name in names:
        made = BENCHMARKS[name][0](options)
        # a benchmark gives one table, or several by name (the pipeline: its timings and what the run learned)
        for key, report in (made.items() if isinstance(made, dict) else [(name, made)]):
            print("\n" + report.markdown(), flush=True)
            reports[key] = report.as_json()
        # written after each benchmark, so a later failure keeps what was measured
        out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "machine": machine(),
                                   "wall_s": time.monotonic() - started, "benchmarks": reports}, indent=2))
    print(f"{len(names)} benchmark(s) in {time.monotonic() - started:.0f} s; wrote {out}")


def rows_list(text: str) -> list[int]:
    """`--scale-rows 20000,200000`: positive row counts."""
    try:
        counts = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: row counts separated by commas, e.g. 20000,200000") from None
    if not counts or min(counts) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: at least one positive row count")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the registered benchmarks")
    commands.add_parser("report", help="rewrite the docs' benchmark tables from their JSON (--check: only say "
                                       "which are stale)", add_help=False)
    run_parser = commands.add_parser("run", help="run benchmarks (default: all but scale) and print their tables")
    run_parser.add_argument("names", nargs="*", metavar="NAME",
                            help=f"any of: {', '.join(BENCHMARKS)} (none: all but {', '.join(NAMED_ONLY)})")
    run_parser.add_argument("--steps", type=int, help="optimizer steps per trial (default: each benchmark's own)")
    run_parser.add_argument("--repeats", type=int, help="trials per system (default: each benchmark's own: 1 for "
                            "the pipeline, 2 for the others)")
    run_parser.add_argument("--sft-steps", type=int, help="SFT steps of the start policy that grpo, rl and rollout train "
                            "once per run (default: 300, grpo_compare.SFT_STEPS; fewer: a quicker, less trained start)")
    run_parser.add_argument("--systems", nargs="+", metavar="SYSTEM",
                            help="grpo and grpo-50m only, named before it: the systems to run, with ours and trl among "
                                 "them (default: all of the benchmark's: " + "; ".join(
                                     f"{name}: {' '.join(grpo_compare.SIZE_SYSTEMS[size])}"
                                     for name, size in grpo_compare.BENCHMARK_SIZES.items()) + ")")
    run_parser.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                            help="config overrides for the `rlhf run` of the pipeline and scale benchmarks")
    run_parser.add_argument("--scale-rows", type=rows_list, metavar="N,N,...",
                            help="scale only: the row counts of its files (default: 20000,200000,1000000)")
    run_parser.add_argument("--scale-model", choices=sorted(scale.MODELS), help="scale only: the generated checkpoint's "
                            "shape (default: 0.5b, ~2 GB; 50m: a quick check of the harness)")
    run_parser.add_argument("--scale-cache", type=Path, help="scale only: where its generated checkpoint and files are "
                            "kept for the next run (default: ~/.cache/rlhf-benchmarks/scale)")
    run_parser.add_argument("--out", type=Path, default=Path("benchmarks.json"), help="JSON results file")
    run_parser.add_argument("--workdir", type=Path, help="scratch folder, kept afterwards (default: a temporary one)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "report":
        from benchmarks import tables

        return tables.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "list":
        for name, (_, description) in BENCHMARKS.items():
            print(f"{name:9} {description}")
        return 0
    if args.workdir and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir}: not empty (the benchmarks need a fresh folder)")
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)} (registered: {', '.join(BENCHMARKS)})")
    if args.systems:
        problem = grpo_compare.systems_problem(args.names or list(BENCHMARKS), args.systems, BENCHMARKS)
        if problem:
            parser.error(f"--systems: {problem}")
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="benchmarks-")))
        workdir.mkdir(parents=True, exist_ok=True)
        options = RunOptions(steps=args.steps, repeats=args.repeats, workdir=workdir, overrides=args.overrides,
                             sft_steps=args.sft_steps, systems=args.systems, scale_rows=args.scale_rows,
                             scale_model=args.scale_model, scale_cache=args.scale_cache)
        run(args.names or [name for name in BENCHMARKS if name not in NAMED_ONLY], options, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
