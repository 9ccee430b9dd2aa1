"""Training throughput of our SFT and DPO stages side by side with TRL's SFTTrainer and DPOTrainer.

    python -m benchmarks run sft dpo [--steps N] [--repeats N]

Both systems train the tiny preset's model (data prep's `base_model`) on the same rows in the same
order: TRL gets the rows our stage's sampler draws, micro-batch after micro-batch, and reads them
with a sequential sampler, so every optimizer step sees the same sequences and the same padding.
Same micro-batch size, optimizer steps, learning rate (constant), AdamW betas, weight decay and
gradient clipping; fp32 on the CPU; no eval or checkpoint while the loop runs. Our stage runs as the
pipeline runs it (one DeepSpeed rank on the CPU, the preset's ZeRO stage); TRL runs with its
defaults otherwise (its default optimizer, and for SFT its default `chunked_nll` loss).

SFT: the sft_data train rows, loss on the response tokens only (TRL gets them tokenized as our stage
tokenizes them: `input_ids` with `labels` at -100 on the prompt). DPO: offline on the pref_data
train pairs (prompt / chosen / rejected text, which TRL tokenizes to the same ids), sigmoid loss at
the preset's beta without the preset's chosen-NLL term, the start model as the frozen reference, its
log-probs precomputed before training in both (our stage always does; TRL's
`precompute_ref_log_probs=True`).

Tokens are the non-pad tokens of every micro-batch (chosen and rejected rows for DPO): for TRL
counted in the batches its collator builds, for our stage summed over the rows its sampler draws
(what its padded batches hold; the two counts agree). Time is the training loop only: for our stage its own
`train/tokens_per_s` over the loop (the clock starts once the engine is built and stops at the last
step's log, before the final eval), for TRL a callback from `on_train_begin` to the last step's
`on_step_end`. Model loading, tokenization and the reference log-probs fall outside.

Each trial runs in a fresh Python process (neither system inherits the other's process group,
threads or allocator); the systems alternate (ours, TRL, ours, TRL, ...) and the table reports the
median of each and the ratio ours / TRL.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import mfu
from benchmarks.report import Report, RunOptions, folder_for
from stages.common import determinism

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STEPS = {"sft": 100, "dpo": 100}
NEVER = 10**9  # eval_every / save_every beyond the run: no eval or checkpoint inside the timed loop
LOG_EVERY = 10  # our trainer logs every 10 steps; TRL logs as often
SYSTEMS = ("ours", "trl")
DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "DS_ACCELERATOR")


# --- the registered benchmarks -------------------------------------------------------------------


def sft(options: RunOptions) -> Report:
    return compare("sft", options)


def dpo(options: RunOptions) -> Report:
    return compare("dpo", options)


def sft_50m(options: RunOptions) -> Report:
    return compare("sft", options, size="50m")


def dpo_50m(options: RunOptions) -> Report:
    return compare("dpo", options, size="50m")


# a compute-bound size: a ~50M-parameter Llama of the tiny preset's kind, on longer problems of the same task
# (18-26 numbers: rows of about 200-300 tokens), micro-batches of 8 rows (4 pairs)
SIZES = {
    "tiny": [],
    "50m": ["model.tiny.hidden_size=640", "model.tiny.intermediate_size=1728", "model.tiny.num_hidden_layers=10",
            "model.tiny.num_attention_heads=10", "model.tiny.num_key_value_heads=10",
            "model.tiny.max_position_embeddings=1024", "data.synthetic.min_terms=18", "data.synthetic.max_terms=26",
            "data.synthetic.num_train=1000", "data.max_len=640"],
}
SIZE_STEPS = {"tiny": DEFAULT_STEPS, "50m": {"sft": 6, "dpo": 4}}
SIZE_TRAINING = {"tiny": [], "50m": ["sft.micro_batch_size=8", "dpo.micro_batch_size=4"]}


def require_trl(benchmark: str) -> None:
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(f"the {benchmark} benchmark compares with TRL, which is not installed: pip install -e '.[bench]'")


def compare(task: str, options: RunOptions, size: str = "tiny") -> Report:
    require_trl(task)
    steps, repeats = options.steps or SIZE_STEPS[size][task], options.repeats_or(2)
    data = tiny_data(options.workdir, tuple(SIZES[size]))
    peak = mfu.matmul_peak()  # this machine's limit, at the trials' dtype and threads
    print(f"[{task}] matmul peak: {peak / 1e9:,.1f} GFLOP/s (fp32, {mfu.threads()} threads)", flush=True)
    trials: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
    for repeat in range(repeats):
        for system in SYSTEMS:  # alternate, so a slow spell of the machine hits both
            result = run_trial(task, system, steps, data, options.workdir / f"{task}-{size}-{system}-{repeat}",
                               overrides=[*SIZES[size], *SIZE_TRAINING[size]])
            trials[system].append(result)
            print(f"[{task}] trial {repeat + 1}/{repeats} {system}: {result['tokens_per_s']:,.0f} tokens/s, "
                  f"{result['samples_per_s']:,.1f} {UNITS[task]}/s, MFU {mfu.utilisation(result, peak):.1%}", flush=True)
    return report(task, steps, repeats, trials, size, peak)


def tiny_data(workdir: Path, overrides: tuple[str, ...] = ()) -> dict[str, Path]:
    """The tiny preset's data prep outputs (base model, tokenizer, datasets), made once per run (`overrides`:
    on top of the preset, into a folder of their own)."""
    return prepared_data(workdir, tuple(overrides))  # one cache entry however the overrides are passed


@functools.cache
def prepared_data(workdir: Path, overrides: tuple[str, ...]) -> dict[str, Path]:
    from benchmarks.in_process import make_ctx
    from configs import load_config
    from stages.data_prep import stage as data_prep

    print("[benchmarks] preparing the tiny preset's data ...", flush=True)
    folder = folder_for(workdir, "data", overrides)
    return data_prep.run(make_ctx("data_prep", load_config(None, list(overrides)), folder), {}).outputs


def trial_env(**extra: str) -> dict[str, str]:
    """The environment of a trial's fresh process: this repo importable, no torch.distributed settings
    inherited (our trial sets its own one-rank ones), no tokenizer threads or progress bars; `extra` on top."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
               TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1", **extra)
    return env


def run_trial(task: str, system: str, steps: int, data: dict[str, Path], work: Path,
              module: str = "benchmarks.trl_compare", overrides: Sequence[str] = ()) -> dict:
    """One training run of `system` in a fresh process (`python -m module SPEC`); its measurements.
    `overrides`: KEY=VALUE settings on top of the trial's own (where the module reads them)."""
    work.mkdir(parents=True)
    spec = {"task": task, "system": system, "steps": steps, "work": str(work), "overrides": list(overrides),
            "data": {name: str(path) for name, path in data.items()}}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", module, json.dumps(spec)], cwd=REPO_ROOT, env=trial_env(),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{task} trial of {system} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**json.loads((work / "result.json").read_text()), "process_s": time.monotonic() - start}


# --- the table -----------------------------------------------------------------------------------

UNITS = {"sft": "rows", "dpo": "pairs"}
LABELS = {
    "sft": {"ours": "ours: `stages.sft.stage` (DeepSpeed ZeRO-{zero}, 1 CPU rank)", "trl": "TRL {version} `SFTTrainer`"},
    "dpo": {"ours": "ours: `stages.dpo` (DeepSpeed ZeRO-{zero}, 1 CPU rank)", "trl": "TRL {version} `DPOTrainer`"},
}


def report(task: str, steps: int, repeats: int, trials: dict[str, list[dict]], size: str = "tiny",
           peak: float | None = None) -> Report:
    unit, version, first = UNITS[task], importlib.metadata.version("trl"), trials["ours"][0]
    summary = {system: summarize(results, peak) for system, results in trials.items()}
    ratio = {metric: summary["ours"][metric] / summary["trl"][metric] for metric in ("tokens_per_s", "samples_per_s")}
    columns = ["system", "tokens/s (median)", f"{unit}/s (median)", "tokens/s per trial", "tokens per step", "MFU (median)"]
    labels = {system: label.format(version=version, zero=first["zero_stage"]) for system, label in LABELS[task].items()}
    rows = [system_row(labels[system], summary[system], trials[system]) for system in SYSTEMS]
    rows.append(["ours / TRL", f"{ratio['tokens_per_s']:.2f}", f"{ratio['samples_per_s']:.2f}", "", "", ""])
    model = f"{first['params'] / 1e6:.1f}M parameters" if "params" in first else "the tiny preset's model"
    title = (f"{task.upper()} throughput, {model} ({size}): {steps} optimizer steps of {first['micro_batch_size']} {unit}, "
             f"fp32, {repeats} alternating trials per system" +
             (f"; MFU: 6 x parameters x tokens/s (attention left out) over this CPU's fp32 matmul peak, "
              f"{peak / 1e9:,.1f} GFLOP/s" if peak else ""))
    settings = {"steps": steps, "size": size, "micro_batch_size": first["micro_batch_size"], "lr": first["lr"],
                "ours_zero_stage": first["zero_stage"], "matmul_peak_flops": peak, **first["settings"]}
    return Report(title, columns, rows, data={"settings": settings, "trl_version": version,
                                              "systems": summary, "ratio": ratio, "trials": trials})


def system_row(label: str, summary: dict, trials: list[dict]) -> list[str]:
    per_trial = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in trials)
    return [label, f"{summary['tokens_per_s']:,.0f}", f"{summary['samples_per_s']:,.1f}", per_trial,
            f"{summary['tokens_per_step']:,.0f}", "-" if summary["mfu"] is None else f"{summary['mfu']:.1%}"]


def summarize(results: list[dict], peak: float | None = None) -> dict:
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in results),
        "samples_per_s": statistics.median(r["samples_per_s"] for r in results),
        "tokens_per_step": results[0]["tokens"] / results[0]["steps"],
        "mfu": statistics.median(mfu.utilisation(r, peak) for r in results) if peak and "params" in results[0] else None,
    }


# --- one trial, in its own process ---------------------------------------------------------------


def bench_config(task: str, steps: int, extra: Sequence[str] = ()):
    """The tiny preset with a constant learning rate and nothing but training inside the loop; both
    systems read their settings from it. DPO: the plain sigmoid loss (no chosen-NLL term). `extra`:
    overrides on top."""
    from configs import load_config

    overrides = [f"{task}.max_steps={steps}", f"{task}.warmup_ratio=0", f"{task}.min_lr_ratio=1",
                 f"{task}.eval_every={NEVER}", f"{task}.save_every={NEVER}"]
    if task == "dpo":
        overrides += ["dpo.loss=sigmoid", "dpo.nll_loss_coef=0"]
    return load_config(None, [*overrides, *extra])


def drawn_rows(n_rows: int, train, steps: int, seed: int) -> list[int]:
    """Row indices in the order our stage trains on them: its sampler on one rank, micro-batch after micro-batch."""
    from stages.common.trainer import SampleStream

    stream = SampleStream(n_rows, train.micro_batch_size, 0, 1, seed)
    return [i for g in range(steps * train.grad_accum_steps) for i in stream.micro_batch(g)]


def sft_rows(cfg, data: dict[str, Path], steps: int) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) of the SFT rows in training order, tokenized as our stage tokenizes them."""
    from stages.common import checkpoint
    from stages.data.prepared import read_split
    from stages.data.tokenization import encode_segments

    tokenizer = checkpoint.load_tokenizer(data["base_model"])
    rows = read_split(data["sft_data"], "train")
    return [encode_segments(tokenizer, rows[i]["texts"], rows[i]["train"])
            for i in drawn_rows(len(rows), cfg.sft, steps, cfg.seed)]


def pref_rows(cfg, data: dict[str, Path], steps: int) -> list[dict]:
    """The preference pairs (prompt, chosen, rejected text) in training order."""
    from stages.data.prepared import read_split

    rows = read_split(data["pref_data"], "train")
    return [rows[i] for i in drawn_rows(len(rows), cfg.dpo, steps, cfg.seed)]


def ours_sft(cfg, data: dict[str, Path], steps: int, work: Path) -> dict:
    from stages.sft import stage as sft

    rate = run_our_stage(sft.run, "sft", cfg, work, {"base_model": data["base_model"], "sft_data": data["sft_data"]})
    tokens = sum(len(ids) for ids, _ in sft_rows(cfg, data, steps))  # the non-pad tokens of its padded batches
    return {"tokens": tokens, "seconds": tokens / rate}


def ours_dpo(cfg, data: dict[str, Path], steps: int, work: Path) -> dict:
    from stages.common import checkpoint
    from stages.dpo import stage as dpo_stage

    # the start model is the base checkpoint: throughput does not depend on what the weights learned
    inputs = {"sft_model": data["base_model"], "pref_data": data["pref_data"]}
    rate = run_our_stage(dpo_stage.run, "dpo", cfg, work, inputs)
    tokenizer = checkpoint.load_tokenizer(data["base_model"])
    pairs = dpo_stage.encode_pairs(tokenizer, pref_rows(cfg, data, steps))
    tokens = sum(len(p) + len(r) for pair in pairs for p, r in pair)  # chosen and rejected rows, pads excluded
    return {"tokens": tokens, "seconds": tokens / rate}


def run_our_stage(run, stage: str, cfg, work: Path, inputs: dict[str, Path]) -> float:
    """Run a stage in-process on one DeepSpeed rank; its `train/tokens_per_s` over the whole loop."""
    from benchmarks.in_process import make_ctx, single_rank_env

    single_rank_env()
    rates: list[float] = []
    ctx = make_ctx(stage, cfg, work, lambda metrics, step: rates.append(metrics["train/tokens_per_s"])
                   if "train/tokens_per_s" in metrics else None)
    run(ctx, inputs)
    return rates[-1]  # logged at the last step: tokens since the loop began / seconds since it began


def trl_sft(cfg, data: dict[str, Path], steps: int, work: Path) -> dict:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    dataset = Dataset.from_list([{"input_ids": ids, "labels": labels} for ids, labels in sft_rows(cfg, data, steps)])
    args = SFTConfig(**trl_training_args(cfg, cfg.sft, steps, work), max_length=cfg.data.max_len)
    trainer = SFTTrainer(model=load_model(cfg, data), args=args, train_dataset=dataset,
                         processing_class=load_tokenizer(data))
    return timed_train(trainer)


def trl_dpo(cfg, data: dict[str, Path], steps: int, work: Path) -> dict:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    d = cfg.dpo
    pairs = [{k: row[k] for k in ("prompt", "chosen", "rejected")} for row in pref_rows(cfg, data, steps)]
    dataset = Dataset.from_list(pairs)
    args = DPOConfig(**trl_training_args(cfg, d, steps, work), max_length=cfg.data.max_len, beta=d.beta,
                     loss_type=["sigmoid"], precompute_ref_log_probs=True)
    # no ref_model: with precomputed log-probs TRL scores the start model once, before training
    trainer = DPOTrainer(model=load_model(cfg, data), args=args, train_dataset=dataset,
                         processing_class=load_tokenizer(data))
    return timed_train(trainer)


def trl_training_args(cfg, train, steps: int, work: Path) -> dict:
    """TrainingArguments matching our stage's run: batch, steps, constant lr, our engine's AdamW settings,
    the config's precision on a CUDA GPU where there is one (else fp32 on the CPU), the rows in the order
    given, no eval, no checkpoints, no reporting."""
    import torch

    from stages.common import deepspeed_engine

    adam = deepspeed_engine.engine_config(cfg.infra, train, steps)["optimizer"]["params"]
    return dict(
        output_dir=str(work / "trl"), seed=cfg.seed,
        max_steps=steps, per_device_train_batch_size=train.micro_batch_size,
        gradient_accumulation_steps=train.grad_accum_steps,
        learning_rate=train.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=adam["weight_decay"], adam_beta1=adam["betas"][0], adam_beta2=adam["betas"][1],
        max_grad_norm=train.grad_clip,
        use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available() and cfg.infra.precision == "bf16",
        fp16=torch.cuda.is_available() and cfg.infra.precision == "fp16", gradient_checkpointing=train.gradient_checkpointing,
        train_sampling_strategy="sequential", dataloader_num_workers=0, dataloader_pin_memory=False,
        logging_steps=LOG_EVERY, eval_strategy="no", save_strategy="no", report_to=[], disable_tqdm=True,
    )


def load_model(cfg, data: dict[str, Path]):
    """The start model with the attention our stages use; on a CUDA GPU in the config's half precision, as
    TRL loads a bf16 hub checkpoint (fp32 on the CPU)."""
    import torch

    from stages.common import checkpoint

    model = checkpoint.load_causal_lm(data["base_model"], cfg.model)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.infra.precision)
    # transformers types PreTrainedModel.to as @wraps(Module.to), an unbound method that wants the model twice
    return model.to(half) if half is not None and torch.cuda.is_available() else model  # type: ignore[arg-type]


def load_tokenizer(data: dict[str, Path]):
    from stages.common import checkpoint

    return checkpoint.load_tokenizer(data["base_model"])


def timed_train(trainer, count_tokens: bool = True) -> dict:
    """Train; the non-pad tokens of the batches TRL built (`count_tokens`: its collator builds padded
    tensors), the seconds of its training loop, and the defaults it trained with."""
    from transformers import TrainerCallback

    class LoopTimer(TrainerCallback):
        """From the loop's start to the end of its last optimizer step (the final log and `train()`'s
        wrap-up excluded, as the final eval is for our stage)."""

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == state.max_steps:
                self.seconds = time.monotonic() - self.start

    timer, counter = LoopTimer(), TokenCounter(trainer.data_collator)
    trainer.add_callback(timer)
    if count_tokens:
        trainer.data_collator = counter  # after __init__: DPO's reference pass is not counted
    trainer.train()
    return {"tokens": counter.tokens, "seconds": timer.seconds,
            "trl_defaults": {"optim": getattr(trainer.args.optim, "value", trainer.args.optim),
                             "loss_type": trainer.args.loss_type}}


class TokenCounter:
    """A data collator wrapper adding up the non-pad tokens of the batches it builds."""

    def __init__(self, collate):
        self.collate, self.tokens = collate, 0

    def __call__(self, examples):
        batch = self.collate(examples)
        self.tokens += int(batch["attention_mask"].sum())
        return batch


TRIALS = {("sft", "ours"): ours_sft, ("sft", "trl"): trl_sft, ("dpo", "ours"): ours_dpo, ("dpo", "trl"): trl_dpo}


def trial_main(spec: dict) -> None:
    import torch

    task, steps, work = spec["task"], spec["steps"], Path(spec["work"])
    data = {name: Path(path) for name, path in spec["data"].items()}
    cfg = bench_config(task, steps, spec.get("overrides", []))
    determinism.export_env(cfg.infra.deterministic)  # as a run does, before any process of it computes
    train = getattr(cfg, task)
    measured = TRIALS[task, spec["system"]](cfg, data, steps, work)
    samples = steps * train.grad_accum_steps * train.micro_batch_size
    result = {
        "system": spec["system"], "steps": steps, "micro_batch_size": train.micro_batch_size, "lr": train.lr,
        **measured, "tokens_per_s": measured["tokens"] / measured["seconds"],
        "samples_per_s": samples / measured["seconds"],
        "torch_threads": torch.get_num_threads(), "params": mfu.count_params(data["base_model"]),
        "settings": {"precision": cfg.infra.precision, "grad_clip": train.grad_clip,
                     **({"beta": train.beta} if task == "dpo" else {})},
    }
    if spec["system"] == "ours":
        result["zero_stage"] = cfg.infra.zero_stage
    (work / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    trial_main(json.loads(sys.argv[1]))
