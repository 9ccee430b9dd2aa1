"""The pipeline's stages on one GPU: each stage's own `run` function, in order, in this one process (no Ray,
Prefect or MLflow): data_prep -> sft -> rm -> rl -> dpo -> eval.

The task is the word game of benchmarks/freeform.py (OpenRLHF-format local files and its `reward_func`) on a
random-init checkpoint of Qwen2-0.5B's shape (24 layers, hidden 896, GQA 14/2, tied embeddings; a byte-level BPE
of a few hundred tokens, so 0.36B parameters, Qwen2-0.5B's non-embedding count), built from a config. Training
runs in bf16 under DeepSpeed ZeRO-2, then ZeRO-3 (a world of one over NCCL), with SDPA attention and
gradient checkpointing, a few steps each; RL is GRPO with the policy sampling itself (hybrid) under ZeRO-2 and
an HF engine beside it under ZeRO-3 (whose partitions the policy cannot sample with).

Prints a table: per stage and ZeRO stage the wall time, training tokens/s, generation tokens/s (RL's rollouts),
peak GPU memory, MFU (6 x parameters x trained tokens/s, attention left out, against the GPU's dense bf16 peak),
and whether each stage's checkpoint loads back with `from_pretrained` and generates (the RM: scores). A stage
that fails is reported with its error and the stages that need its output are skipped; the run goes on with
the next ZeRO stage. Writes the rows, errors and versions as JSON.

    python -m benchmarks.gpu_stages [--zero 2 3] [--steps 8] [--out gpu_stages.json] [--workdir DIR]
    python -m benchmarks.gpu_stages --zero 2 --liger --offload   # with model.use_liger_kernel, rl.placement.ref_offload
    python -m benchmarks.gpu_stages --device cpu --tiny     # the same code paths on a CPU, a small model
    python -m benchmarks.gpu_stages --report benchmarks/results/gpu_stages.json   # the table of a result file
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
import traceback
from pathlib import Path

SIZES = {
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "max_position_embeddings": 512},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 256},
}
STAGES = ("data_prep", "sft", "rm", "rl", "dpo", "eval")
TRAINED = ("sft", "rm", "dpo", "rl.actor")  # config sections of the models these stages train
MODEL_OUTPUTS = {"sft_model", "reward_model", "rl_model", "dpo_model"}

CONFIG = """base: tiny
model:
  name_or_path: {model}
  attn_implementation: sdpa
data:
  source: files
  max_len: 96
  sft: {{paths: [{sft}], input_key: question, output_key: response}}
  preference: {{paths: [{preferences}], input_key: prompt}}
  prompts: {{paths: [{prompts}], input_key: context_messages, label_key: answer}}
reward:
  source: func
  func_path: {reward}
eval:
  answer_pattern: null
"""


def settings(args, zero: int) -> list[str]:
    """Overrides for one ZeRO stage's chain: a few steps of every stage, batches that keep a GPU busy."""
    cuda, n = args.device == "cuda", args.steps
    mb = 8 if args.tiny else args.micro_batch
    prompts, new_tokens = (4, 8) if args.tiny else (16, 24)  # the CPU run only walks the code paths
    out = [f"infra.zero_stage={zero}", f"infra.precision={'bf16' if cuda else 'fp32'}", "rl.rollout.engine=auto",
           "rl.algorithm.advantage_estimator=group_norm", "rl.max_steps=2", f"rl.rollout.batch_size={prompts // 2}",
           "rl.rollout.n_samples_per_prompt=4", f"rl.train_batch_size={prompts * 2}", f"rl.micro_train_batch_size={prompts}",
           "rl.rollout.micro_batch_size=32", f"rl.rollout.generate_max_len={new_tokens}", "rl.eval_every=100",
           "rl.save_every=100", f"eval.max_samples={prompts}", "eval.samples_per_prompt=2",
           f"eval.max_new_tokens={new_tokens}", "eval.batch_size=32",
           f"sft.micro_batch_size={mb}", f"rm.micro_batch_size={max(mb // 2, 1)}", f"dpo.micro_batch_size={max(mb // 2, 1)}"]
    if args.tiny:  # held-out sets of a few rows: every eval pass still runs, on less
        out += [f"data.{name}.eval_min_rows=8" for name in ("sft", "preference", "prompts")]
    for section in ("sft", "rm", "dpo"):
        out += [f"{section}.max_steps={n}", f"{section}.eval_every={n}", f"{section}.save_every={10 * n}",
                f"{section}.epochs=1"]
    if args.liger:  # Liger's Triton kernels in every causal LM the stages load (a CPU run: the stages' one-line error)
        out.append("model.use_liger_kernel=true")
    if args.offload:  # RL's reference on the CPU between its uses
        out.append("rl.placement.ref_offload=true")
    return out + [f"{section}.gradient_checkpointing=true" for section in TRAINED]


def prepare(workdir: Path, tiny: bool, seed: int) -> Path:
    """The task's files, the random-init checkpoint and the config file; returns the config's path."""
    from benchmarks.freeform import corpus, write_task
    from tests.model_families import save_family_checkpoint

    files = write_task(workdir / "data", seed, n_sft=600, n_pairs=400, n_prompts=300)
    model = save_family_checkpoint("qwen2", workdir / "model", corpus(seed), seed=seed,
                                   size=SIZES["tiny" if tiny else "0.5b"], vocab_size=400)
    path = workdir / "gpu_stages.yaml"
    path.write_text(CONFIG.format(model=model, **files))
    return path


def reload_check(name: str, path: Path, device: str) -> str:
    """'ok' when the checkpoint loads with `from_pretrained` and generates (an RM: scores), else the error."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
        enc = tok(["Sort alphabetically: pear fig apple"], return_tensors="pt").to(device)
        if name == "reward_model":
            from stages.rewards.rm_scorer import RewardModelScorer

            score = RewardModelScorer([path], device=device).score(["Sort alphabetically: pear fig apple"],
                                                                   ["apple fig pear"], [None]).rewards
            return "ok" if torch.isfinite(score).all() else f"score {score.tolist()}"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
        # transformers types PreTrainedModel.to as @wraps(Module.to), an unbound method that wants the model twice
        out = model.to(device).generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)  # type: ignore[arg-type]
        return "ok" if out.shape[1] > enc["input_ids"].shape[1] else "generated nothing"
    except Exception as exc:  # reported in the table: the point of the check
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def liger_parity(path: Path, cfg, device: str) -> dict:
    """The SFT checkpoint loaded twice, as the stages load it (bf16): with Liger's kernels and without. How many
    modules Liger replaced, and the gaps between the two models' token log-probs, mean token losses and
    gradients on 8 rows of 64 random tokens: Liger computes the same function, to bf16's rounding."""
    import torch

    from stages.common.checkpoint import load_causal_lm

    outs = {}
    for liger in (False, True):
        model = load_causal_lm(path, cfg.model.model_copy(update={"use_liger_kernel": liger}), precision="bf16", device_map=device)
        ids = torch.randint(0, model.config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(0)).to(device)
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
        loss = -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        grads = torch.cat([w.grad.float().flatten() for w in model.parameters() if w.grad is not None])
        replaced = sum(type(m).__name__.startswith("Liger") for m in model.modules())
        outs[liger] = (logp.detach(), loss.item(), grads, replaced)
        del model
    (lp0, l0, g0, _), (lp1, l1, g1, replaced) = outs[False], outs[True]
    return {"modules replaced": replaced, "max log-prob gap": round((lp0 - lp1).abs().max().item(), 5),
            "loss": [round(l0, 5), round(l1, 5)],
            "gradient gap / largest gradient": round(((g0 - g1).abs().max() / g0.abs().max()).item(), 5)}


def rates(stage: str, logged: list[tuple[dict, int]], cfg) -> tuple[float | None, float | None]:
    """(training tokens/s, generation tokens/s) from what the stage logged."""
    if stage in ("sft", "rm", "dpo"):
        tps = [m["train/tokens_per_s"] for m, _ in logged if "train/tokens_per_s" in m]
        return (tps[-1] if tps else None), None
    if stage == "rl":
        steps = [m for m, _ in logged if "time/training" in m]
        if not steps:
            return None, None
        trained = sum(m["rollout/tokens"] * cfg.rl.max_epochs for m in steps) / sum(m["time/training"] for m in steps)
        samples = cfg.rl.rollout.batch_size * cfg.rl.rollout.n_samples_per_prompt
        generated = sum(m["train/response_length"] * samples for m in steps) / sum(m["time/generation"] for m in steps)
        return trained, generated
    return None, None


def run_chain(args, zero: int, config: Path, prepared: dict[str, Path], n_params: int, root: Path) -> tuple[list, list]:
    """sft, rm, rl, dpo and eval under one ZeRO stage; rows and errors."""
    import torch

    from benchmarks.gpu_smoke import PEAK_BF16, device_name
    from configs import load_config
    from stages.common import deepspeed_engine
    from stages.dag.contract import StageContext
    from stages.dag.declaration import STAGES as SPECS
    from stages.rl.stage import run_in_process

    cfg = load_config(str(config), settings(args, zero))
    cuda = args.device == "cuda"
    peak = next((v for k, v in PEAK_BF16.items() if k in device_name()), None) if cuda else None
    available, rows, errors = dict(prepared), [], []
    for spec in (s for s in SPECS if s.name in STAGES[1:]):
        wanted = spec.wanted_inputs(cfg)
        missing = [name for name in wanted if name not in available]
        if missing:
            rows.append({"stage": spec.name, "zero": zero, "status": f"skipped (no {', '.join(missing)})"})
            continue
        inputs = {name: available[name] for name in (*wanted, *spec.optional_inputs) if name in available}
        logged: list[tuple[dict, int]] = []

        def log_metrics(metrics: dict[str, float], step: int, logged: list[tuple[dict, int]] = logged) -> None:
            logged.append((dict(metrics), step))

        ctx = StageContext(stage=spec.name, config=cfg, output_dir=root / f"z{zero}" / spec.name / "output",
                           work_dir=root / f"z{zero}" / spec.name / "work", log_metrics=log_metrics)
        ctx.output_dir.mkdir(parents=True)
        fn = run_in_process if spec.name == "rl" else spec.load()
        print(f"== {spec.name} (ZeRO-{zero})", flush=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            result = fn(ctx, inputs)
        except Exception as exc:  # reported, and the chain goes on without this stage's outputs
            errors.append({"stage": spec.name, "zero": zero, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc()})
            rows.append({"stage": spec.name, "zero": zero, "status": f"failed: {type(exc).__name__}: {str(exc)[:160]}"})
            print(errors[-1]["traceback"], flush=True)
            continue
        finally:
            if cuda:
                torch.cuda.synchronize()
        wall = time.perf_counter() - started
        available.update(result.outputs)
        train_tps, gen_tps = rates(spec.name, logged, cfg)
        checks = {name: reload_check(name, path, args.device) for name, path in result.outputs.items() if name in MODEL_OUTPUTS}
        parity = liger_parity(result.outputs["sft_model"], cfg, args.device) if args.liger and cuda and spec.name == "sft" else None
        rows.append({
            "stage": spec.name, "zero": zero, "status": "ok", "wall_s": round(wall, 1),
            "train_tokens_per_s": round(train_tps) if train_tps else None,
            "gen_tokens_per_s": round(gen_tps) if gen_tps else None,
            "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "mfu": round(6 * n_params * train_tps / peak, 4) if peak and train_tps else None,
            "checkpoint": ", ".join(f"{k} {v}" for k, v in checks.items()) or "-",
            "metrics": {k: v for k, v in result.metrics.items() if isinstance(v, (int, float))},
            **({"liger_parity": parity} if parity else {}),
        })
        del result
        deepspeed_engine.release_engines()  # as a pooled stage worker does between stages
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return rows, errors


def markdown(rows: list[dict]) -> str:
    cols = (("stage", "stage"), ("zero", "ZeRO"), ("wall_s", "wall s"), ("train_tokens_per_s", "train tokens/s"),
            ("gen_tokens_per_s", "generated tokens/s"), ("peak_mem_gib", "peak GPU GiB"), ("mfu", "MFU"),
            ("checkpoint", "checkpoint loads and generates"))
    lines = ["| " + " | ".join(title for _, title in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        if r.get("status", "ok") != "ok":
            lines.append(f"| {r['stage']} | {r['zero']} | {r['status']} |" + " |" * (len(cols) - 3))
            continue
        lines.append("| " + " | ".join("-" if r.get(k) is None else str(r[k]) for k, _ in cols) + " |")
    return "\n".join(lines) + "\n"


def report(result: dict) -> str:
    """A result file's heading and table, as docs/gpu.md shows them."""
    v = result["versions"]
    asked = [name for name, on in result.get("options", {}).items() if on]
    head = (f"{result['device']}, {result['date']}: {result['params'] / 1e6:.1f}M parameters ({result['model']}), "
            f"torch {v['torch']}, transformers {v['transformers']}, DeepSpeed {v['deepspeed']}"
            + (f"; with {' and '.join(asked)}." if asked else "."))
    parity = next((r["liger_parity"] for r in result["rows"] if "liger_parity" in r), None)
    tail = ("\nLiger against the plain model (the SFT checkpoint, bf16, 8 x 64 random tokens): "
            f"{parity['modules replaced']} modules replaced, log-probs within {parity['max log-prob gap']}, "
            f"mean loss {parity['loss'][0]} -> {parity['loss'][1]}, gradients within "
            f"{parity['gradient gap / largest gradient']:.2%} of the largest.\n") if parity else ""
    return head + "\n\n" + markdown(result["rows"]) + tail


def versions() -> dict[str, str]:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("torch", "transformers", "deepspeed", "peft", "datasets", "pydantic")}


def device_options(parser: argparse.ArgumentParser, out: str) -> None:
    """The options the GPU scripts share: where to run, the small CPU variant, seed, files, --report."""
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a small model (a CPU run of the code paths)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=out)
    parser.add_argument("--workdir", default=None, help="task files, checkpoints and outputs (default: a temp dir)")
    parser.add_argument("--report", metavar="JSON", help="print the table of a result file and exit")


def use_device(device: str) -> None:
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU even where there is a GPU (child processes inherit it)
        os.environ["DS_ACCELERATOR"] = "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_stages", description=__doc__.split("\n\n")[0])
    device_options(parser, "gpu_stages.json")
    parser.add_argument("--zero", type=int, nargs="+", default=[2, 3], choices=[0, 2, 3])
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps of sft, rm and dpo")
    parser.add_argument("--micro-batch", type=int, default=32, help="SFT rows per micro-batch (RM, DPO: half as many pairs)")
    parser.add_argument("--liger", action="store_true", help="model.use_liger_kernel: Liger's kernels in every causal LM")
    parser.add_argument("--offload", action="store_true", help="rl.placement.ref_offload: RL's reference on the CPU between uses")
    args = parser.parse_args(argv)
    if args.report:
        print(report(json.loads(Path(args.report).read_text())), end="")
        return 0
    use_device(args.device)
    import torch

    from benchmarks.gpu_smoke import device_name
    from benchmarks.machine import machine
    from benchmarks.mfu import count_params
    from configs import load_config
    from stages.common import dist_env
    from stages.dag.contract import StageContext
    from stages.data_prep.stage import run as data_prep

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA GPU here; use --device cpu --tiny", flush=True)
        return 2
    os.environ.update(dist_env.single_rank_env())
    root = Path(args.workdir or tempfile.mkdtemp(prefix="rlhf-gpu-stages-")).resolve()
    config = prepare(root / "task", args.tiny, args.seed)
    cfg = load_config(str(config), settings(args, args.zero[0]))
    ctx = StageContext(stage="data_prep", config=cfg, output_dir=root / "data_prep" / "output", work_dir=root / "data_prep" / "work")
    ctx.output_dir.mkdir(parents=True)
    started = time.perf_counter()
    prepared = data_prep(ctx, {}).outputs
    rows = [{"stage": "data_prep", "zero": "-", "status": "ok", "wall_s": round(time.perf_counter() - started, 1)}]
    n_params = count_params(prepared["base_model"])
    print(f"model: {n_params / 1e6:.1f}M parameters; device: {device_name()}", flush=True)
    errors: list[dict] = []
    for zero in args.zero:
        chain_rows, chain_errors = run_chain(args, zero, config, prepared, n_params, root)
        rows += chain_rows
        errors += chain_errors
    result = {"benchmark": "gpu_stages", "date": time.strftime("%Y-%m-%d"), "machine": machine(),
              "device": device_name(), "versions": versions(), "params": n_params,
              "model": "tiny" if args.tiny else "qwen2-0.5b shape", "options": {"Liger's kernels": args.liger,
                                                                                 "the reference offloaded": args.offload},
              "rows": rows, "errors": errors}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + report(result), end="", flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
