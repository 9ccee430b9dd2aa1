"""What `torch.set_num_threads` costs the tiny model on the CPU.

    python -m benchmarks run threads [--steps N] [--repeats N]

Two ways to give torch the same number of threads: OMP_NUM_THREADS at process start (what the
stages' Ray actors do: Ray sets it to an actor's `num_cpus`, `resources.thread_env` to its cores
where it shares them, and `dist_env.use_threads` leaves it) or `torch.set_num_threads` (what they
did before). The second also switches MKL's dynamic threading off for the life of the process, and
MKL then opens a nested OpenMP region for every matmul inside torch's own parallel loops (SDPA's CPU
attention kernels): each costs a futex call.

Each trial is a fresh process with OMP_NUM_THREADS set to the preset's cores, holding the tiny
preset's base model: `--steps` training steps (forward, backward, AdamW) on micro-batches of
`rl.micro_train_batch_size` sequences of prompt plus `rl.rollout.generate_max_len` tokens, then two
`generate` calls of one rollout's shape (`rl.rollout.batch_size` x `rl.rollout.n_samples_per_prompt`
sequences, temperature 1, the faster of the two counts). The two settings alternate; the table
gives medians over the trials.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from benchmarks import trl_compare
from benchmarks.report import Report, RunOptions

DEFAULT_STEPS = 20
WARMUP_STEPS = 2
SETTINGS = {"env": "OMP_NUM_THREADS at start (the actors now)",
            "set_num_threads": "`torch.set_num_threads` (the actors before)"}


def threads(options: RunOptions) -> Report:
    from configs import load_config

    cfg = load_config(None, [])
    steps, repeats, cores = options.steps or DEFAULT_STEPS, options.repeats_or(3), cfg.infra.num_cpus
    if cores is None:  # the tiny preset sets it: the trials' thread count
        raise ValueError("threads: the config sets no infra.num_cpus to give the trials' threads")
    model = trl_compare.tiny_data(options.workdir)["base_model"]
    trials: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
    for repeat in range(repeats):
        for setting in SETTINGS:  # alternate
            spec = {"setting": setting, "model": str(model), "steps": steps, "threads": cores}
            proc = subprocess.run([sys.executable, "-m", __name__, json.dumps(spec)], capture_output=True, text=True,
                                  env=trl_compare.trial_env(OMP_NUM_THREADS=str(cores)), cwd=trl_compare.REPO_ROOT)
            if proc.returncode != 0:
                raise RuntimeError(f"threads trial ({setting}) failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            trials[setting].append(result)
            print(f"[threads] trial {repeat + 1}/{repeats} {setting}: train {result['train_ms']:.1f} ms/step, "
                  f"generate {result['generate_s']:.3f} s", flush=True)
    return report(trials, steps, repeats, cores)


def report(trials: dict[str, list[dict]], steps: int, repeats: int, cores: int) -> Report:
    median = {s: {k: statistics.median(t[k] for t in trials[s]) for k in ("train_ms", "generate_s")} for s in SETTINGS}
    columns = ["how torch got its threads", "training step ms", "generate s (one rollout)", "per trial (ms / s)"]
    rows = [[label, f"{median[s]['train_ms']:.1f}", f"{median[s]['generate_s']:.3f}",
             ", ".join(f"{t['train_ms']:.1f} / {t['generate_s']:.3f}" for t in trials[s])] for s, label in SETTINGS.items()]
    ratio = {k: median["set_num_threads"][k] / median["env"][k] for k in ("train_ms", "generate_s")}
    rows.append(["time with `set_num_threads` / without", f"{ratio['train_ms']:.2f}", f"{ratio['generate_s']:.2f}", ""])
    first = trials["env"][0]
    title = (f"torch threads, tiny base model, {cores} threads: {steps} training steps of {first['batch']} x "
             f"{first['width']} tokens, generate {first['rollout']} x {first['new_tokens']} tokens; "
             f"{repeats} alternating fresh processes per setting")
    return Report(title, columns, rows, data={"medians": median, "ratio": ratio, "trials": trials})


def trial(spec: dict) -> dict:
    """One fresh process: time training steps and generate calls of the tiny model."""
    import torch
    from transformers import AutoModelForCausalLM

    from configs import load_config
    from stages.common import checkpoint

    if spec["setting"] == "set_num_threads":
        torch.set_num_threads(spec["threads"])
    cfg = load_config(None, [])
    rl = cfg.rl
    torch.manual_seed(cfg.seed)
    tokenizer = checkpoint.load_tokenizer(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    prompt_len = rl.rollout.prompt_max_len // 2
    vocab = model.config.vocab_size
    batch = torch.randint(len(tokenizer.all_special_ids), vocab, (rl.micro_train_batch_size, prompt_len + rl.rollout.generate_max_len))
    prompts = batch[:1, :prompt_len].repeat(rl.rollout.batch_size * rl.rollout.n_samples_per_prompt, 1)

    step_ms = []
    for step in range(WARMUP_STEPS + spec["steps"]):
        start = time.perf_counter()
        logits = model(input_ids=batch, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= WARMUP_STEPS:
            step_ms.append((time.perf_counter() - start) * 1000)
    generate_s = []
    with torch.no_grad():
        for _ in range(2):
            start = time.perf_counter()
            # transformers' GenerativePreTrainedModel protocol asks for attributes its own models do not declare
            model.generate(prompts, max_new_tokens=rl.rollout.generate_max_len,  # type: ignore[misc]
                           min_new_tokens=rl.rollout.generate_max_len, do_sample=True, temperature=1.0,
                           pad_token_id=tokenizer.pad_token_id)
            generate_s.append(time.perf_counter() - start)
    return {"train_ms": statistics.median(step_ms), "generate_s": min(generate_s), "torch_threads": torch.get_num_threads(),
            "batch": batch.shape[0], "width": batch.shape[1], "rollout": prompts.shape[0], "new_tokens": rl.rollout.generate_max_len}


if __name__ == "__main__":
    print(json.dumps(trial(json.loads(sys.argv[1]))))
