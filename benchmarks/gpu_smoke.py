"""GPU smoke test of the training stages' engines: a randomly initialised ~0.5B Llama-style model, a few
steps of each stage's loss (SFT, RM, DPO, one RL step with HF generation) in bf16 under ZeRO-2 and
ZeRO-3, on one GPU. Prints tokens/s, peak GPU memory and model FLOPs utilisation per stage and
ZeRO stage as a markdown table, and writes the rows as JSON.

    python -m benchmarks.gpu_smoke [--zero 2 3] [--steps 5] [--seq-len 512] [--batch 8] [--out gpu_smoke.json]
    python -m benchmarks.gpu_smoke --tiny --device cpu     # the same code paths on a CPU, a small model

The losses are the stages' own (`stages.sft.stage.lm_loss`, `stages.rm.losses.pairwise_loss`,
`stages.dpo.losses.dpo_loss`, `stages.rl.losses.policy_loss`) in engines built from the pipeline's
DeepSpeed config (`stages.common.deepspeed_engine`). Tokens are random: this measures speed and
memory, not learning. MFU counts 6 x parameters x trained tokens per second (the attention term
left out) against the GPU's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import torch

# dense bf16 peak FLOP/s by GPU name fragment (vendor data sheets, without sparsity)
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12}


class LlamaSize(TypedDict):
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int


SIZES: dict[str, LlamaSize] = {
    "0.5b": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=16, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=1000),
}


def single_rank_env(device: str) -> None:
    from stages.common import dist_env

    os.environ.update(dist_env.single_rank_env())
    if device == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"


def build(kind: str, size: str, zero: int, precision: str, lr: float = 1e-5):
    """A fresh random model of `kind` (causal LM or scalar-head RM) in a DeepSpeed engine."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    from configs.schema import InfraConfig, TrainingConfig
    from stages.common import checkpoint, deepspeed_engine

    torch.manual_seed(0)
    # PreTrainedConfig takes extra kwargs (num_labels) that its dataclass_transform signature leaves out
    config = LlamaConfig(**SIZES[size], num_labels=1, pad_token_id=0)  # type: ignore[call-arg]
    cls = LlamaForSequenceClassification if kind == "rm" else LlamaForCausalLM
    # transformers types PreTrainedModel.to as @wraps(Module.to), an unbound method that wants the model twice
    model = cls(config).to(checkpoint.torch_dtype(precision))  # type: ignore[arg-type]
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    infra = InfraConfig(zero_stage=zero, precision=precision)
    train = TrainingConfig(lr=lr, micro_batch_size=1, warmup_ratio=0.0, min_lr_ratio=1.0)
    engine = deepspeed_engine.initialize(model, deepspeed_engine.engine_config(infra, train, 100))
    n_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    return engine, n_params


def sft_step(engine, batch: int, seq: int, vocab: int) -> int:
    from stages.sft.stage import lm_loss

    ids = torch.randint(1, vocab, (batch, seq), device=engine.device)
    loss, _, tokens = lm_loss(engine, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    engine.backward(loss)
    engine.step()
    return tokens


def rm_step(engine, batch: int, seq: int, vocab: int) -> int:
    from stages.rm.losses import pairwise_loss

    ids = torch.randint(1, vocab, (2 * batch, seq), device=engine.device)  # chosen rows, then rejected
    scores = engine(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.squeeze(-1).float()
    loss = pairwise_loss(scores[:batch], scores[batch:])
    engine.backward(loss)
    engine.step()
    return ids.numel()


def dpo_step(engine, batch: int, seq: int, vocab: int) -> int:
    from stages.dpo.losses import dpo_loss, sequence_logps, token_logps

    ids = torch.randint(1, vocab, (2 * batch, seq), device=engine.device)
    mask = torch.ones_like(ids[:, 1:])
    logps = sequence_logps(token_logps(engine(input_ids=ids).logits[:, :-1], ids[:, 1:]), mask)
    reference = logps.detach() + 0.1  # the frozen reference's log-probs stand in as a fixed offset
    losses, _, _ = dpo_loss(logps[:batch], logps[batch:], reference[:batch], reference[batch:], beta=0.1)
    engine.backward(losses.mean())
    engine.step()
    return ids.numel()


def rl_step(engine, batch: int, seq: int, vocab: int) -> int:
    """Generate `seq // 2` tokens for `batch` prompts of `seq // 2` tokens with HF generate, then one
    PPO-clip step on them (old log-probs from the same weights, random advantages)."""
    from stages.rl.losses import log_probs_from_logits, policy_loss

    half = seq // 2
    prompts = torch.randint(1, vocab, (batch, half), device=engine.device)
    engine.module.config.use_cache = True
    with torch.no_grad():
        out = engine.module.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=half,
                                     min_new_tokens=half, do_sample=True, pad_token_id=0,
                                     synced_gpus=engine.zero_optimization_stage() == 3)
    engine.module.config.use_cache = False
    labels = out[:, 1:]
    mask = torch.zeros_like(labels, dtype=torch.float)
    mask[:, half - 1:] = 1.0  # the generated tokens
    log_probs = log_probs_from_logits(engine(input_ids=out).logits[:, :-1], labels)
    advantages = torch.randn(batch, 1, device=engine.device).expand_as(log_probs)
    loss, _ = policy_loss(log_probs, log_probs.detach(), advantages, mask)
    engine.backward(loss)
    engine.step()
    return out.numel()


STAGES: dict[str, tuple[str, Callable]] = {"sft": ("lm", sft_step), "rm": ("rm", rm_step), "dpo": ("lm", dpo_step),
                                           "rl": ("lm", rl_step)}


def measure(stage: str, zero: int, args) -> dict:
    kind, step = STAGES[stage]
    cuda = args.device == "cuda"
    precision = "bf16" if cuda else "fp32"
    engine, n_params = build(kind, args.size, zero, precision)
    vocab = SIZES[args.size]["vocab_size"]
    step(engine, args.batch, args.seq_len, vocab)  # warm-up: kernels, allocator, optimizer state
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start, tokens = time.perf_counter(), 0
    for _ in range(args.steps):
        tokens += step(engine, args.batch, args.seq_len, vocab)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    rate = tokens / seconds
    peak = PEAK_BF16.get(next((k for k in PEAK_BF16 if k in device_name()), "")) if cuda else None
    row = {"stage": stage, "zero": zero, "params_m": round(n_params / 1e6, 1), "tokens_per_s": round(rate, 1),
           "step_s": round(seconds / args.steps, 3),
           "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
           # the RL step's generation makes no training FLOPs worth counting: MFU over its whole time
           "mfu": round(6 * n_params * rate / peak, 3) if peak else None}
    if args.profile:
        # bound now: `engine` is deleted below, so a closure over it reads as undefined
        row["profile"] = profile_step(functools.partial(step, engine, args.batch, args.seq_len, vocab), cuda)
    del engine
    from stages.common.deepspeed_engine import release_engines

    release_engines()  # else the next row's peak memory counts this engine too
    if cuda:
        torch.cuda.empty_cache()
    return row


def profile_step(run_step: Callable[[], int], cuda: bool, top: int = 8) -> dict:
    """One more step under torch.profiler: its wall time, the share of it the GPU was busy, and the ops with
    the most self time on the device (the CPU without a GPU), each with its share of the step."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        run_step()
        if cuda:
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    events = prof.key_averages()

    def self_us(e) -> float:
        return e.self_device_time_total if cuda else e.self_cpu_time_total

    # on a GPU the kernels' own rows give the busy time; the ops that launched them are ranked by it
    kernels = [e for e in events if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
    ops = [e for e in events if not cuda or e.device_type != torch.autograd.DeviceType.CUDA]
    busy = sum(self_us(e) for e in (kernels if cuda else ops))
    ranked = sorted(ops, key=self_us, reverse=True)[:top]
    return {"step_ms": round(wall_us / 1e3, 1), "busy_share": round(busy / wall_us, 3),
            "top": [{"op": e.key[:80], "ms": round(self_us(e) / 1e3, 2), "share": round(self_us(e) / wall_us, 3),
                     "calls": e.count} for e in ranked]}


def device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def markdown(rows: list[dict]) -> str:
    lines = ["| stage | ZeRO | params (M) | tokens/s | s/step | peak GPU memory (GiB) | MFU |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['zero']} | {r['params_m']} | {r['tokens_per_s']} | {r['step_s']} | "
                     f"{r['peak_mem_gib'] if r['peak_mem_gib'] is not None else '-'} | {r['mfu'] if r['mfu'] is not None else '-'} |")
    return "\n".join(lines)


def report(result: dict) -> str:
    """A result file's heading and table, as docs/gpu.md shows them."""
    a = result["args"]
    return (f"{result['device']}, {result.get('date', '')}: batch {a['batch']} x {a['seq_len']} tokens, {a['steps']} "
            f"steps after one warm-up\n\n{markdown(result['rows'])}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a small model (for a CPU run of the code paths)")
    parser.add_argument("--zero", type=int, nargs="+", default=[2, 3], choices=[2, 3])
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default="gpu_smoke.json")
    parser.add_argument("--report", metavar="JSON", help="print the table of a result file and exit")
    parser.add_argument("--profile", action="store_true", help="profile one more step of each row: busy share, top ops")
    args = parser.parse_args(argv)
    if args.report:
        print(report(json.loads(Path(args.report).read_text())))
        return 0
    args.size = "tiny" if args.tiny else "0.5b"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here (use --device cpu --tiny to run the code paths on a CPU)")
    single_rank_env(args.device)
    from stages.common import deepspeed_engine

    deepspeed_engine.init_distributed()
    rows = []
    for zero in args.zero:
        for stage in args.stages:
            rows.append(measure(stage, zero, args))
            print(f"[gpu_smoke] {stage} ZeRO-{zero}: {rows[-1]}", flush=True)
            with open(args.out, "w") as f:  # after every row: a run cut short keeps what it measured
                json.dump({"benchmark": "gpu_smoke", "device": device_name(), "date": time.strftime("%Y-%m-%d"),
                           "args": vars(args), "rows": rows},
                          f, indent=2)
    header = f"{device_name()}, torch {torch.__version__}, batch {args.batch} x {args.seq_len} tokens, {args.steps} steps"
    print(f"\n{header}\n\n{markdown(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
