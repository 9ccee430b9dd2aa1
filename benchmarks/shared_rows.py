"""Where `rl.shared_prompt` pays: the RL policy's training step with a prompt's samples in one row against
each sample in a padded row of its own. Each trial is a few optimizer steps (forward, backward, AdamW)
of the stage's own policy loss (`stages.rl.workers.actor_loss`) on random token rows, groups of
`--samples` responses to one prompt; a padded and a shared step side by side on the same micro-batch
(each layout training its own copy of one model), so both see the same load on the machine. Length
profiles set the prompt and the longest response. The first (untimed) step of each trial also compares
the two layouts on identical weights: the gap between their losses and gradients (float rounding alone,
the layout being exact). Writes the trials and the summary as JSON.

    python -m benchmarks.shared_rows [--steps 6] [--repeats 1] [--out benchmarks/results/shared-rows.json]
    python -m benchmarks.shared_rows --device cuda --shape 100m --dtype bf16 fp32 \
        --out shared-rows-gpu.json                              # a GPU: whether the presets' setting holds there
    python -m benchmarks.shared_rows --report benchmarks/results/shared-rows.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.packing import DTYPES, SHAPES, gaps, gpu, model_for, side_by_side
from benchmarks.report import add_result_args, print_saved, save, with_note

# (prompt tokens, longest response): the tiny preset's (prompts of 11-15 tokens, answers of about 20),
# and prompts long or short against their responses
PROFILES = {"tiny": (14, 24), "long-prompt": (256, 64), "even": (64, 64), "long-response": (64, 256)}
GROUPS, SAMPLES = 4, 8  # prompts per micro-batch, responses per prompt (the tiny preset's rollout.n_samples_per_prompt)


def group_rows(profile: str, groups: int, samples: int, rng: random.Random, vocab: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, response) token lists: `samples` responses to each of `groups` prompts, each response
    between half the profile's longest and the longest."""
    prompt_len, longest = PROFILES[profile]

    def tokens(n: int) -> list[int]:
        return [rng.randrange(8, vocab) for _ in range(n)]

    rows = []
    for _ in range(groups):
        prompt = tokens(prompt_len)
        rows += [(prompt, tokens(rng.randrange(max(1, longest // 2), longest + 1))) for _ in range(samples)]
    return rows


def policy_batch(rows, gen, device: str) -> dict:
    """The micro-batch as the RL stage makes it: right-padded rows with advantages and old log-probs."""
    import torch

    from stages.rl.experience import Sample, sequence_batch

    batch = sequence_batch([Sample(p, r, [-1.0] * len(r)) for p, r in rows], 0)
    mask = batch["action_mask"]
    batch |= {"advantages": torch.randn(mask.shape, generator=gen) * mask, "old_log_probs": -4 * mask}
    return {k: v.to(device) for k, v in batch.items()}


def trial(profile: str, steps: int, seed: int, setup: dict) -> dict:
    """`side_by_side` steps of padded and shared rows on two copies of one model; tokens count the samples'
    own (no pads, each sample's prompt included)."""
    import torch

    from configs.schema import RLConfig
    from stages.rl.workers import actor_loss

    device, vocab = setup["device"], SHAPES[setup["shape"]]["vocab_size"]
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    models = {shared: model_for("rl_policy", setup["shape"], setup["attn"], device, setup["dtype"]) for shared in (False, True)}
    rl = {shared: RLConfig(algorithm={"use_kl_loss": False}, shared_prompt=shared) for shared in (False, True)}

    def next_step():
        batch = policy_batch(group_rows(profile, setup["groups"], setup["samples"], rng, vocab), gen, device)
        return batch, lambda model, shared: actor_loss(model, batch, rl[shared], None)[0]

    seconds, first, batches = side_by_side(models, steps, device, next_step)
    return {"profile": profile, "seed": seed, "dtype": setup["dtype"], "tokens": [int(b["attention_mask"].sum()) for b in batches],
            "padded_s": seconds[False], "shared_s": seconds[True], **gaps(first)}


def summarize(trials: list[dict]) -> list[dict]:
    """Per dtype and profile: tokens/s of each layout, the median per-step ratio padded / shared time
    (steps side by side saw the same load) and the largest gaps of the trials' first steps."""
    groups: dict = {}
    for t in trials:
        groups.setdefault((t["dtype"], t["profile"]), []).append(t)
    rows = []
    for (dtype, profile), ts in groups.items():
        tokens = sum(sum(t["tokens"]) for t in ts)
        rows.append({"dtype": dtype, "profile": profile,
                     "padded_tokens_per_s": tokens / sum(sum(t["padded_s"]) for t in ts),
                     "shared_tokens_per_s": tokens / sum(sum(t["shared_s"]) for t in ts),
                     "step_speedup_median": statistics.median(a / b for t in ts for a, b in zip(t["padded_s"], t["shared_s"])),
                     "loss_gap": max(t["loss_gap"] for t in ts), "grad_gap_relative": max(t["grad_gap_relative"] for t in ts)})
    return rows


def report(result: dict) -> str:
    m, setup = result["machine"], result["setup"]
    where = m.get("gpu") or f"{m['cpus']} CPUs ({m['platform']})"
    lines = [f"Measured {result['date']} on {where}, torch {m['torch']}, transformers {m['transformers']}; the "
             f"{setup['shape']} Llama shape, {setup['attn']} attention; {result['repeats']} trial(s) of {result['steps']} "
             f"optimizer steps a layout on micro-batches of {setup['groups']} prompts x {setup['samples']} responses, a "
             f"padded and a shared step side by side; tokens/s counts the samples' own tokens, each sample's prompt "
             f"included. Gaps: shared minus padded on the same weights (first step), the loss's absolute and the "
             f"gradients' largest over the largest gradient.", "",
             "| dtype | prompt / longest response (tokens) | padded tokens/s | shared tokens/s | shared speed-up "
             "(median over steps of padded time / shared time) | loss gap | gradient gap |",
             "|---|---|---|---|---|---|---|"]
    for row in result["summary"]:
        prompt_len, longest = PROFILES[row["profile"]]
        lines.append(f"| {row['dtype']} | {row['profile']} ({prompt_len} / {longest}) | {row['padded_tokens_per_s']:,.0f} | "
                     f"{row['shared_tokens_per_s']:,.0f} | {row['step_speedup_median']:.2f} | {row['loss_gap']:.1e} | "
                     f"{row['grad_gap_relative']:.1e} |")
    return with_note(lines, result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shared_rows", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument("--device", default="cpu", help="cpu, or cuda")
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="an attention that takes a 4D mask")
    parser.add_argument("--shape", default="tiny", choices=list(SHAPES))
    parser.add_argument("--dtype", nargs="+", default=["fp32"], choices=DTYPES)
    parser.add_argument("--groups", type=int, default=GROUPS, help="prompts per micro-batch")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="responses per prompt")
    parser.add_argument("--note", help="a line about the conditions, kept in the JSON")
    add_result_args(parser, "benchmarks/results/shared-rows.json")
    args = parser.parse_args(argv)
    if args.report:
        return print_saved(args.report, report)
    from benchmarks.machine import machine

    setup = {"device": args.device, "shape": args.shape, "attn": args.attn, "groups": args.groups, "samples": args.samples}
    result = {"benchmark": "shared-rows", "date": time.strftime("%Y-%m-%d"), "machine": machine() | gpu(args.device),
              "steps": args.steps, "repeats": args.repeats, "setup": setup, "trials": []}
    if args.note:
        result["note"] = args.note
    for dtype in args.dtype:
        for profile in args.profiles:
            for r in range(args.repeats):
                t = trial(profile, args.steps, r, setup | {"dtype": dtype})
                result["trials"].append(t)
                print(f"[shared-rows] {dtype} {profile}: padded {sum(t['tokens']) / sum(t['padded_s']):,.0f} tokens/s, "
                      f"shared {sum(t['tokens']) / sum(t['shared_s']):,.0f}; gaps loss {t['loss_gap']:.1e}, "
                      f"gradient {t['grad_gap_relative']:.1e}", flush=True)
    result["summary"] = summarize(result["trials"])
    save(result, args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
