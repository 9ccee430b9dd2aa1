"""Rollout engines side by side: response tokens/s of HF `generate` and of vLLM (CPU build) at
several batch sizes.

    python -m benchmarks run rollout [--repeats N]

Both are the RL stage's own engine actors (`HFRolloutEngine`, `VLLMRolloutEngine`) on a local Ray
cluster, each with the machine's cores, holding the same policy (the tiny base model after a short
SFT run, shared with the GRPO benchmark) and sampling the same prompts at temperature 1 for up to
`rl.rollout.generate_max_len` tokens. The HF engine gets the whole batch in one `generate` call
(`rl.rollout.micro_batch_size` = the batch size). vLLM runs from the environment that
`flows.cli.vllm_env.machine_cache_python` finds or makes (RLHF_VLLM_PYTHON, else ~/.cache/rlhf-pipeline).
Engine start-up falls outside the timing; each batch size is timed `--repeats` times per engine,
alternating, and the table gives medians.
"""

from __future__ import annotations

import statistics
import time
from typing import cast

from benchmarks import grpo_compare, trl_compare
from benchmarks.report import Report, RunOptions

BATCH_SIZES = (16, 64, 256)
ENGINES = ("hf", "vllm")


def rollout(options: RunOptions) -> Report:
    import ray
    from ray.actor import ActorClass

    from configs import load_config
    from flows.cli import vllm_env
    from runtime import rollout_engines
    from runtime.resources import actor_class, local_cluster, thread_env
    from runtime.vllm_engine import VLLMRolloutEngine, runtime_env
    from stages.common import checkpoint
    from stages.dag.contract import NodeInputs
    from stages.data.prepared import read_split
    from stages.rl.workers import HFRolloutEngine

    repeats = options.repeats_or(3)
    data = trl_compare.tiny_data(options.workdir)
    policy = str(grpo_compare.start_policy(options.workdir, data, options.sft_steps or grpo_compare.SFT_STEPS))
    vllm_python = vllm_env.machine_cache_python()
    biggest = max(BATCH_SIZES)
    cfg = load_config(None, [f"rl.rollout.micro_batch_size={biggest}", "rl.rollout.engine=vllm", f"rl.rollout.vllm_python={vllm_python}"])
    threads = cfg.infra.num_cpus
    if threads is None:  # the tiny preset sets it: each engine's cores
        raise ValueError("rollout: the config sets no infra.num_cpus to give the engines")
    tokenizer = checkpoint.load_tokenizer(policy)
    prompts = [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
               for r in read_split(data["prompts"], "train")[:biggest]]

    given = NodeInputs({"sft_model": str(policy)})
    # @ray.remote made it an actor class; mypy keeps a decorated class's own type
    vllm_engine = cast("ActorClass[VLLMRolloutEngine]", VLLMRolloutEngine)
    with local_cluster(threads, log_to_driver=False):
        rollout_engines.check(cfg, cluster_gpus=0)
        print("[rollout] starting the engines ...", flush=True)
        engines = {
            "hf": actor_class(HFRolloutEngine).options(num_cpus=0, **thread_env(threads)).remote(cfg, given, threads),
            "vllm": vllm_engine.options(num_cpus=0, runtime_env=runtime_env(rollout_engines.vllm_python(cfg), threads))
            .remote(given, rollout_engines.vllm_options(cfg, 0), threads),
        }
        ray.get([e.ready.remote() for e in engines.values()])
        trials: dict[str, dict[int, list[dict]]] = {e: {b: [] for b in BATCH_SIZES} for e in ENGINES}
        for batch in BATCH_SIZES:
            for repeat in range(repeats):
                for name in ENGINES:  # alternate
                    start = time.monotonic()
                    samples = ray.get(engines[name].generate.remote(
                        prompts[:batch], cfg.seed + repeat, cfg.rl.rollout.temperature, cfg.rl.rollout.generate_max_len))
                    seconds = time.monotonic() - start
                    tokens = sum(len(s.response_ids) for s in samples)
                    trials[name][batch].append({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds})
            print(f"[rollout] batch {batch}: " + ", ".join(
                f"{name} {statistics.median(t['tokens_per_s'] for t in trials[name][batch]):,.0f} tokens/s"
                for name in ENGINES), flush=True)
    return report(trials, repeats, cfg.rl.rollout.generate_max_len, threads)


def report(trials: dict[str, dict[int, list[dict]]], repeats: int, max_new_tokens: int, threads: int) -> Report:
    columns = ["batch (prompts)", "HF `generate` tokens/s", "vLLM tokens/s", "vLLM / HF", "mean response tokens"]
    rows, medians = [], {}
    for batch in BATCH_SIZES:
        rate = {e: statistics.median(t["tokens_per_s"] for t in trials[e][batch]) for e in ENGINES}
        medians[batch] = rate
        mean_len = statistics.mean(t["tokens"] for e in ENGINES for t in trials[e][batch]) / batch
        rows.append([str(batch), f"{rate['hf']:,.0f}", f"{rate['vllm']:,.0f}", f"{rate['vllm'] / rate['hf']:.2f}",
                     f"{mean_len:.1f}"])
    title = (f"Rollout engines: response tokens/s sampling at temperature 1, <= {max_new_tokens} new tokens, "
             f"{threads} threads each, median of {repeats} calls")
    return Report(title, columns, rows, data={"tokens_per_s": medians, "trials": trials})
