"""Training tokens/s of each stage's loss with `<stage>.packing` (one padding-free row per micro-batch) against
the padded batch, on this machine's attention (SDPA on a CPU). Each trial is a few optimizer steps (forward,
backward, AdamW) of the stage's own loss code on random token rows of the tiny preset's model shape, a
padded and a packed step side by side on the same micro-batch (each layout training its own copy), so
both see the same load on the machine. Two length profiles: rows of nearly one length (little padding
to save) and rows of widely spread lengths (about half of a padded batch is pads). Writes the trials
and the summary as JSON.

    python -m benchmarks.packing [--steps 6] [--repeats 1] [--out benchmarks/results/packing.json]
    python -m benchmarks.packing --report benchmarks/results/packing.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.report import add_result_args, print_saved, save, with_note

PROFILES = {"narrow": (48, 64), "spread": (8, 120)}  # (shortest, longest) prompt + response, in tokens
STAGES = ("rm", "prm", "dpo", "kto", "rl_policy", "rl_critic")
BATCH = 16  # sequences (pairs for rm and dpo) per micro-batch
VOCAB = 96


def sequences(profile: str, n: int, rng: random.Random) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt, chosen, rejected) token lists; each prompt + response between the profile's bounds."""
    low, high = PROFILES[profile]

    def tokens(n: int) -> list[int]:
        return [rng.randrange(8, VOCAB) for _ in range(n)]

    out = []
    for _ in range(n):
        prompt = tokens(rng.randrange(4, low // 2 + 1))
        out.append((prompt, tokens(rng.randrange(low, high + 1) - len(prompt)), tokens(rng.randrange(low, high + 1) - len(prompt))))
    return out


def stage_batch(stage: str, rows, gen):
    """A micro-batch as the stage's own collator makes it, and the loss function over it."""
    import torch

    from configs.schema import DPOConfig, RLConfig
    from stages import prm, reward_model
    from stages.common import packing
    from stages.common.tokenization import IGNORE_INDEX, pad_batch
    from stages.dpo import stage as dpo
    from stages.rl.experience import Sample, sequence_batch
    from stages.rl.losses import value_loss
    from stages.rl.workers import actor_loss, critic_values

    if stage == "rm":
        batch = reward_model.pair_batch([(p + c, p + r, 0.0) for p, c, r in rows], 0)
        return batch, lambda model, packed: reward_model.bt_loss(reward_model.LastTokenReward(model, packed), batch)[0]
    if stage == "prm":
        seqs = [(p + c, [IGNORE_INDEX] * len(p) + [5 + (i % 2) if i % 4 == 3 else IGNORE_INDEX for i in range(len(c))])
                for p, c, _ in rows]
        batch = pad_batch(seqs, 0)
        return batch, lambda model, packed: prm.prm_loss(packing.logits(model, batch, packed), batch["labels"], (5, 6))[0]
    if stage in ("dpo", "kto"):
        pairs = [((p, c), (p, r)) for p, c, r in rows]

        def objective(packed):
            if stage == "dpo":
                return dpo.PairObjective(DPOConfig(packing=packed), pairs, 0, shared_prompt=False)
            return dpo.KTOObjective(DPOConfig(loss="kto", packing=packed), pairs, 0, world=1)

        batches = {p: objective(p).collate(-torch.rand(4 * len(rows), generator=gen) * 50, list(range(len(rows))))
                   for p in (False, True)}
        return batches[False], lambda model, packed: objective(packed).loss(model, batches[packed])[0]
    batch = sequence_batch([Sample(p, c, [-1.0] * len(c)) for p, c, _ in rows], 0)
    mask = batch["action_mask"]
    batch |= {"advantages": torch.randn(mask.shape, generator=gen) * mask, "old_log_probs": -4 * mask,
              "values": torch.randn(mask.shape, generator=gen) * mask, "returns": torch.randn(mask.shape, generator=gen) * mask}
    if stage == "rl_policy":
        return batch, lambda model, packed: actor_loss(model, batch, RLConfig(use_kl_loss=False, packing=packed), None)[0]
    return batch, lambda model, packed: value_loss(critic_values(model, batch, packed), batch["values"], batch["returns"],
                                                   mask, 0.2)


def model_for(stage: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, LlamaForTokenClassification

    from configs.schema import TinyModelConfig

    tiny = TinyModelConfig()
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=tiny.hidden_size, intermediate_size=tiny.intermediate_size,
                         num_hidden_layers=tiny.num_hidden_layers, num_attention_heads=tiny.num_attention_heads,
                         num_key_value_heads=tiny.num_key_value_heads, max_position_embeddings=256, pad_token_id=0,
                         num_labels=1, classifier_dropout=0.0)
    config._attn_implementation = "sdpa"
    cls = {"rm": LlamaForSequenceClassification, "rl_critic": LlamaForTokenClassification}.get(stage, LlamaForCausalLM)
    torch.manual_seed(0)
    return cls(config)


def trial(stage: str, profile: str, steps: int, seed: int) -> dict:
    """`steps` optimizer steps of each layout after one warm-up step each, on two copies of one model:
    a padded step and a packed one on the same micro-batch, their order alternating, so both see the
    same load on the machine. Tokens count the samples' own (no pads)."""
    import torch

    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    models = {packed: model_for(stage) for packed in (False, True)}
    optimizers = {packed: torch.optim.AdamW(m.parameters(), lr=1e-5) for packed, m in models.items()}
    seconds: dict[bool, list[float]] = {False: [], True: []}
    tokens, pads = [], []
    for i in range(steps + 1):
        batch, loss_fn = stage_batch(stage, sequences(profile, BATCH, rng), gen)
        for packed in (False, True) if i % 2 == 0 else (True, False):
            started = time.perf_counter()
            loss_fn(models[packed], packed).backward()
            optimizers[packed].step()
            optimizers[packed].zero_grad()
            if i:
                seconds[packed].append(time.perf_counter() - started)
        masks = [batch["attention_mask"], *([batch["kl_attention_mask"]] if "kl_attention_mask" in batch else [])]
        tokens.append(sum(int(m.sum()) for m in masks))
        pads.append(1 - tokens[-1] / sum(m.numel() for m in masks))
    tokens, pads = tokens[1:], pads[1:]
    return {"stage": stage, "profile": profile, "seed": seed, "tokens": tokens, "pad_share": statistics.median(pads),
            "padded_s": seconds[False], "packed_s": seconds[True]}


def summarize(trials: list[dict]) -> dict:
    """Per profile and stage: tokens/s of each layout (all tokens over all step time) and the median of the
    per-step ratios packed / padded (steps side by side saw the same load)."""
    out: dict = {}
    for t in trials:
        row = out.setdefault(t["profile"], {}).setdefault(t["stage"], {"tokens": 0, "padded_s": 0.0, "packed_s": 0.0,
                                                                       "ratios": [], "pad_share": []})
        row["tokens"] += sum(t["tokens"])
        row["padded_s"] += sum(t["padded_s"])
        row["packed_s"] += sum(t["packed_s"])
        row["ratios"] += [a / b for a, b in zip(t["padded_s"], t["packed_s"])]
        row["pad_share"].append(t["pad_share"])
    return {profile: {stage: {"padded_tokens_per_s": r["tokens"] / r["padded_s"], "packed_tokens_per_s": r["tokens"] / r["packed_s"],
                              "step_speedup_median": statistics.median(r["ratios"]),
                              "pad_share": statistics.median(r["pad_share"])} for stage, r in stages.items()}
            for profile, stages in out.items()}


def report(result: dict) -> str:
    m = result["machine"]
    lines = [f"Measured {result['date']} on {m['cpus']} CPUs ({m['platform']}), torch {m['torch']}, transformers "
             f"{m['transformers']}, SDPA attention; {result['repeats']} trial(s) of {result['steps']} optimizer steps a "
             f"layout on micro-batches of {BATCH} sequences (pairs for rm and dpo), a padded and a packed step side by "
             f"side; tokens/s counts the samples' own tokens.", "",
             "| lengths | stage | pads in the padded batch | padded tokens/s | packed tokens/s | packed speed-up (median over steps of padded time / packed time) |",
             "|---|---|---|---|---|---|"]
    for profile, stages in result["summary"].items():
        low, high = PROFILES[profile]
        for stage, row in stages.items():
            lines.append(f"| {profile} ({low}-{high}) | {stage} | {row['pad_share']:.0%} | {row['padded_tokens_per_s']:,.0f} | "
                         f"{row['packed_tokens_per_s']:,.0f} | {row['step_speedup_median']:.2f} |")
    return with_note(lines, result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument("--note", help="a line about the conditions, kept in the JSON")
    add_result_args(parser, "benchmarks/results/packing.json")
    args = parser.parse_args(argv)
    if args.report:
        return print_saved(args.report, report)
    from benchmarks.__main__ import machine

    result = {"benchmark": "packing", "date": time.strftime("%Y-%m-%d"), "machine": machine(), "steps": args.steps,
              "repeats": args.repeats, "trials": []}
    if args.note:
        result["note"] = args.note
    for profile in args.profiles:
        for stage in args.stages:
            for r in range(args.repeats):
                t = trial(stage, profile, args.steps, seed=r)
                result["trials"].append(t)
                print(f"[packing] {profile} {stage}: padded {sum(t['tokens']) / sum(t['padded_s']):,.0f} tokens/s, "
                      f"packed {sum(t['tokens']) / sum(t['packed_s']):,.0f}", flush=True)
    result["summary"] = summarize(result["trials"])
    save(result, args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
