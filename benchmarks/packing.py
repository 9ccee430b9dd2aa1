"""Training tokens/s of each stage's loss with `<stage>.packing` (one padding-free row per micro-batch) against
the padded batch. Each trial is a few optimizer steps (forward, backward, AdamW) of the stage's own loss
code on random token rows, a padded and a packed step side by side on the same micro-batch (each layout
training its own copy of one model), so both see the same load on the machine. Length profiles: rows of
nearly one length (little padding to save), rows of widely spread lengths (about half of a padded batch
is pads), and long spread rows. The first (untimed) step of each trial also compares the two layouts on
identical weights: the gap between their losses and gradients, which is float rounding alone where
packing keeps the samples apart. Writes the trials and the summary as JSON.

    python -m benchmarks.packing [--steps 6] [--repeats 1] [--out benchmarks/results/packing.json]
    python -m benchmarks.packing --device cuda --shape 100m --dtype bf16 --attn sdpa flash_attention_2 \
        --profiles spread long --batch 16 --out packing-gpu.json      # a GPU, where packing should pay
    python -m benchmarks.packing --report benchmarks/results/packing.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import TypedDict

from benchmarks.report import add_result_args, print_saved, save, with_note

PROFILES = {"narrow": (48, 64), "spread": (8, 120), "long": (64, 1024)}  # (shortest, longest) prompt + response, tokens
STAGES = ("rm", "prm", "dpo", "kto", "rl_policy", "rl_critic")
BATCH = 16  # sequences (pairs for rm and dpo) per micro-batch
# Llama-style shapes: the tiny preset's (vocab of the word-level task), and one where compute dominates on a GPU


class LlamaShape(TypedDict, total=False):
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int


SHAPES: dict[str, LlamaShape] = {"tiny": {"vocab_size": 96},
          "100m": {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
                   "num_attention_heads": 12, "num_key_value_heads": 4}}
DTYPES = ("fp32", "bf16")


def sequences(profile: str, n: int, rng: random.Random, vocab: int) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt, chosen, rejected) token lists; each prompt + response between the profile's bounds."""
    low, high = PROFILES[profile]

    def tokens(n: int) -> list[int]:
        return [rng.randrange(8, vocab) for _ in range(n)]

    out = []
    for _ in range(n):
        prompt = tokens(rng.randrange(4, low // 2 + 1))
        out.append((prompt, tokens(rng.randrange(low, high + 1) - len(prompt)), tokens(rng.randrange(low, high + 1) - len(prompt))))
    return out


def on(batch: dict, device: str) -> dict:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}


def stage_batch(stage: str, rows, gen, device: str = "cpu"):
    """A micro-batch as the stage's own collator makes it (on `device`), and the loss function over it."""
    import torch

    from configs.schema import DPOConfig, RLConfig
    from stages.common import packing
    from stages.data.tokenization import IGNORE_INDEX, pad_batch
    from stages.dpo import stage as dpo
    from stages.prm import losses as prm
    from stages.rl.experience import Sample, sequence_batch
    from stages.rl.losses import value_loss
    from stages.rl.workers import actor_loss, critic_values
    from stages.rm import stage as reward_model

    if stage == "rm":
        batch = on(reward_model.pair_batch([(p + c, p + r, 0.0) for p, c, r in rows], 0), device)
        return batch, lambda model, packed: reward_model.bt_loss(reward_model.LastTokenReward(model, packed), batch)[0]
    if stage == "prm":
        seqs = [(p + c, [IGNORE_INDEX] * len(p) + [5 + (i % 2) if i % 4 == 3 else IGNORE_INDEX for i in range(len(c))])
                for p, c, _ in rows]
        batch = on(pad_batch(seqs, 0), device)
        return batch, lambda model, packed: prm.prm_loss(packing.logits(model, batch, packed), batch["labels"], (5, 6))[0]
    if stage in ("dpo", "kto"):
        pairs = [((p, c), (p, r)) for p, c, r in rows]

        def objective(packed):
            if stage == "dpo":
                return dpo.PairObjective(DPOConfig(packing=packed), pairs, 0, shared_prompt=False)
            return dpo.KTOObjective(DPOConfig(loss="kto", packing=packed), pairs, 0, world=1)

        reference = -torch.rand(4 * len(rows), generator=gen) * 50
        batches = {p: on(objective(p).collate(reference, list(range(len(rows)))), device) for p in (False, True)}
        return batches[False], lambda model, packed: objective(packed).loss(model, batches[packed])[0]
    batch = sequence_batch([Sample(p, c, [-1.0] * len(c)) for p, c, _ in rows], 0)
    mask = batch["action_mask"]
    batch |= {"advantages": torch.randn(mask.shape, generator=gen) * mask, "old_log_probs": -4 * mask,
              "values": torch.randn(mask.shape, generator=gen) * mask, "returns": torch.randn(mask.shape, generator=gen) * mask}
    batch = on(batch, device)
    mask = batch["action_mask"]
    if stage == "rl_policy":
        rl = {packed: RLConfig(algorithm={"use_kl_loss": False}, packing=packed, shared_prompt=False) for packed in (False, True)}
        return batch, lambda model, packed: actor_loss(model, batch, rl[packed], None)[0]
    return batch, lambda model, packed: value_loss(critic_values(model, batch, "packed" if packed else "padded"), batch["values"],
                                                   batch["returns"], mask, 0.2)


def model_for(stage: str, shape: str = "tiny", attn: str = "sdpa", device: str = "cpu", dtype: str = "fp32"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, LlamaForTokenClassification

    from configs.schema import TinyModelConfig

    tiny = TinyModelConfig()
    sizes: LlamaShape = {"hidden_size": tiny.hidden_size, "intermediate_size": tiny.intermediate_size,
             "num_hidden_layers": tiny.num_hidden_layers, "num_attention_heads": tiny.num_attention_heads,
             "num_key_value_heads": tiny.num_key_value_heads} | SHAPES[shape]
    # PreTrainedConfig takes extra kwargs (num_labels, classifier_dropout) that its dataclass_transform signature leaves out
    config = LlamaConfig(**sizes, max_position_embeddings=2048, pad_token_id=0, num_labels=1,  # type: ignore[call-arg]
                         classifier_dropout=0.0)
    config._attn_implementation = attn
    cls = {"rm": LlamaForSequenceClassification, "rl_critic": LlamaForTokenClassification}.get(stage, LlamaForCausalLM)
    torch.manual_seed(0)
    # transformers types PreTrainedModel.to as @wraps(Module.to), an unbound method that wants the model twice
    return cls(config).to(device=device, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])  # type: ignore[call-arg]


def gaps(first: dict) -> dict:
    """How far the packed layout's first loss and gradients are from the padded one's, on identical weights:
    the largest absolute difference, and the gradients' over the largest padded gradient."""
    (loss_pad, grads_pad), (loss_pack, grads_pack) = first[False], first[True]
    scale = max(float(g.abs().max()) for g in grads_pad)
    grad_gap = max(float((a - b).abs().max()) for a, b in zip(grads_pad, grads_pack))
    return {"loss_padded": loss_pad, "loss_gap": abs(loss_pad - loss_pack), "grad_gap": grad_gap, "grad_scale": scale,
            "grad_gap_relative": grad_gap / scale if scale else 0.0}


def side_by_side(models: dict, steps: int, device: str, next_step) -> tuple[dict, dict, list]:
    """`steps` optimizer steps (AdamW) of each layout's model (`models`: False, the padded batch; True, the
    layout measured) after one warm-up step each, a padded and a measured step on the same micro-batch,
    their order alternating, so both see the same load on the machine. `next_step()` gives a micro-batch
    and its loss function `(model, layout) -> loss`. Returns each layout's step seconds, the warm-up
    step's (loss, gradients) per layout (for `gaps`) and the timed micro-batches."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    optimizers = {layout: torch.optim.AdamW(m.parameters(), lr=1e-5) for layout, m in models.items()}
    seconds: dict[bool, list[float]] = {False: [], True: []}
    first, batches = {}, []
    for i in range(steps + 1):
        batch, loss_fn = next_step()
        for layout in (False, True) if i % 2 == 0 else (True, False):
            sync()
            started = time.perf_counter()
            loss = loss_fn(models[layout], layout)
            loss.backward()
            if i == 0:
                first[layout] = (float(loss.detach()), [p.grad.float().clone() for p in models[layout].parameters() if p.grad is not None])
            optimizers[layout].step()
            optimizers[layout].zero_grad()
            sync()
            if i:
                seconds[layout].append(time.perf_counter() - started)
        if i:
            batches.append(batch)
    return seconds, first, batches


def trial(stage: str, profile: str, steps: int, seed: int, setup: dict) -> dict:
    """`side_by_side` steps of the padded and the packed layout on two copies of one model. Tokens count
    the samples' own (no pads). `setup`: shape, attn, device, dtype, batch."""
    import torch

    device = setup["device"]
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    models = {packed: model_for(stage, setup["shape"], setup["attn"], device, setup["dtype"]) for packed in (False, True)}
    vocab = SHAPES[setup["shape"]]["vocab_size"]
    seconds, first, batches = side_by_side(models, steps, device,
                                           lambda: stage_batch(stage, sequences(profile, setup["batch"], rng, vocab), gen, device))
    tokens, pads = [], []
    for batch in batches:
        masks = [batch["attention_mask"], *([batch["kl_attention_mask"]] if "kl_attention_mask" in batch else [])]
        tokens.append(sum(int(m.sum()) for m in masks))
        pads.append(1 - tokens[-1] / sum(m.numel() for m in masks))
    return {"stage": stage, "profile": profile, "seed": seed, "attn": setup["attn"], "tokens": tokens,
            "pad_share": statistics.median(pads), "padded_s": seconds[False], "packed_s": seconds[True], **gaps(first)}


def summarize(trials: list[dict]) -> list[dict]:
    """Per attention implementation, profile and stage: tokens/s of each layout (all tokens over all step time),
    the median of the per-step ratios padded / packed time (steps side by side saw the same load) and the
    largest loss and gradient gaps of the trials' first steps."""
    groups: dict = {}
    for t in trials:
        groups.setdefault((t.get("attn", "sdpa"), t["profile"], t["stage"]), []).append(t)
    rows = []
    for (attn, profile, stage), ts in groups.items():
        tokens = sum(sum(t["tokens"]) for t in ts)
        row = {"attn": attn, "profile": profile, "stage": stage,
               "padded_tokens_per_s": tokens / sum(sum(t["padded_s"]) for t in ts),
               "packed_tokens_per_s": tokens / sum(sum(t["packed_s"]) for t in ts),
               "step_speedup_median": statistics.median(a / b for t in ts for a, b in zip(t["padded_s"], t["packed_s"])),
               "pad_share": statistics.median(t["pad_share"] for t in ts)}
        if all("loss_gap" in t for t in ts):
            row |= {"loss_gap": max(t["loss_gap"] for t in ts), "grad_gap_relative": max(t["grad_gap_relative"] for t in ts)}
        rows.append(row)
    return rows


def report(result: dict) -> str:
    m, setup = result["machine"], result.get("setup", {})
    where = m.get("gpu") or f"{m['cpus']} CPUs ({m['platform']})"
    shape, dtype, batch = setup.get("shape", "tiny"), setup.get("dtype", "fp32"), setup.get("batch", BATCH)
    lines = [f"Measured {result['date']} on {where}, torch {m['torch']}, transformers {m['transformers']}; the "
             f"{shape} Llama shape in {dtype}; {result['repeats']} trial(s) of {result['steps']} optimizer steps a layout on "
             f"micro-batches of {batch} sequences (pairs for rm and dpo), a padded and a packed step side by side; tokens/s "
             f"counts the samples' own tokens. Gaps: packed minus padded on the same weights (first step), the loss's "
             f"absolute and the gradients' largest over the largest gradient.", "",
             "| attention | lengths | stage | pads in the padded batch | padded tokens/s | packed tokens/s | packed speed-up "
             "(median over steps of padded time / packed time) | loss gap | gradient gap |",
             "|---|---|---|---|---|---|---|---|---|"]
    summary = result["summary"]
    if isinstance(summary, dict):  # results written before the attention column: {profile: {stage: row}}
        summary = [{"attn": "sdpa", "profile": p, "stage": st, **r} for p, stages in summary.items() for st, r in stages.items()]
    for row in summary:
        low, high = PROFILES[row["profile"]]
        gap = (f"{row['loss_gap']:.1e} | {row['grad_gap_relative']:.1e}" if "loss_gap" in row else "- | -")
        lines.append(f"| {row['attn']} | {row['profile']} ({low}-{high}) | {row['stage']} | {row['pad_share']:.0%} | "
                     f"{row['padded_tokens_per_s']:,.0f} | {row['packed_tokens_per_s']:,.0f} | {row['step_speedup_median']:.2f} | {gap} |")
    return with_note(lines, result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--profiles", nargs="+", default=["narrow", "spread"], choices=list(PROFILES))
    parser.add_argument("--device", default="cpu", help="cpu, or cuda")
    parser.add_argument("--attn", nargs="+", default=["sdpa"], help="attention implementations, each its own trials "
                        "(sdpa, eager, flash_attention_2, ...: what transformers accepts)")
    parser.add_argument("--shape", default="tiny", choices=list(SHAPES))
    parser.add_argument("--dtype", default="fp32", choices=DTYPES)
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences (pairs for rm and dpo) per micro-batch")
    parser.add_argument("--note", help="a line about the conditions, kept in the JSON")
    add_result_args(parser, "benchmarks/results/packing.json")
    args = parser.parse_args(argv)
    if args.report:
        return print_saved(args.report, report)
    from benchmarks.machine import machine

    setup = {"device": args.device, "shape": args.shape, "dtype": args.dtype, "batch": args.batch}
    result = {"benchmark": "packing", "date": time.strftime("%Y-%m-%d"), "machine": machine() | gpu(args.device),
              "steps": args.steps, "repeats": args.repeats, "setup": setup, "trials": [], "failures": []}
    if args.note:
        result["note"] = args.note
    for attn in args.attn:
        for profile in args.profiles:
            for stage in args.stages:
                for r in range(args.repeats):
                    try:
                        t = trial(stage, profile, args.steps, r, setup | {"attn": attn})
                    except Exception as e:  # noqa: BLE001 - an attention kernel that cannot run is a finding, not the end
                        result["failures"].append({"attn": attn, "profile": profile, "stage": stage, "error": f"{type(e).__name__}: {e}"[:2000]})
                        print(f"[packing] {attn} {profile} {stage}: failed: {result['failures'][-1]['error'][:300]}", flush=True)
                        continue
                    result["trials"].append(t)
                    print(f"[packing] {attn} {profile} {stage}: padded {sum(t['tokens']) / sum(t['padded_s']):,.0f} tokens/s, "
                          f"packed {sum(t['tokens']) / sum(t['packed_s']):,.0f}; gaps loss {t['loss_gap']:.1e}, "
                          f"gradient {t['grad_gap_relative']:.1e}", flush=True)
    result["summary"] = summarize(result["trials"])
    save(result, args.out, report)
    return 0


def gpu(device: str) -> dict:
    """The GPU's name, where the trials ran on one."""
    import torch

    return {"gpu": torch.cuda.get_device_name(device)} if device.startswith("cuda") else {}


if __name__ == "__main__":
    raise SystemExit(main())
