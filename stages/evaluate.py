"""Eval stage: every model it is given, on the held-out set.

Per model: exact-match accuracy of greedy answers against the labels, sampled accuracy (the
share of correct answers among `eval.samples_per_prompt` drawn at `eval.sample_temperature`, the
policy as RL samples it), mean response length (tokens), and perplexity of the reference
solutions (SFT eval split, response tokens only).
Writes `eval_report/` with `results.json`, `results.md` and per-model generations.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from transformers import set_seed

from stages.common import checkpoint
from stages.common.answers import extract_answer, is_correct, matches
from stages.common.generation import generate
from stages.common.progress import Progress
from stages.common.tokenization import encode_segments, pad_batch
from stages.contract import StageContext, StageResult
from stages.data_prep import read_split
from stages.eval_results import model_inputs


@torch.no_grad()
def perplexity(model, rows: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int) -> float:
    total_loss, total_tokens = 0.0, 0
    for i in range(0, len(rows), batch_size):
        batch = pad_batch(rows[i : i + batch_size], pad_id)
        n = int((batch["labels"][:, 1:] != -100).sum())
        total_loss += float(model(**batch, use_cache=False).loss) * n
        total_tokens += n
    return math.exp(total_loss / max(total_tokens, 1))


def evaluate_model(model_dir: Path, cfg, prompts: list[dict], sft_eval: list[dict]) -> tuple[dict[str, float], list[dict]]:
    e = cfg.eval
    set_seed(cfg.seed)  # each model's sampled answers are drawn from the same seed
    tokenizer = checkpoint.load_tokenizer(model_dir)
    model = checkpoint.load_causal_lm(model_dir, cfg.model)
    model.eval()
    generated = generate(model, tokenizer, [p["prompt"] for p in prompts], batch_size=e.batch_size, max_new_tokens=e.max_new_tokens)
    samples, correct = [], 0
    for row, ids in zip(prompts, generated):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        answer = extract_answer(text, e.answer_pattern)
        ok = matches(answer, row["label"])
        correct += ok
        samples.append({"prompt": row["prompt"], "response": text, "answer": answer, "label": row["label"], "correct": ok})
    rows = [encode_segments(tokenizer, r["texts"], r["train"]) for r in sft_eval]
    metrics = {
        "accuracy": correct / len(prompts),
        **({"sampled_accuracy": sampled_accuracy(model, tokenizer, prompts, e)} if e.samples_per_prompt else {}),
        "response_length": sum(len(ids) for ids in generated) / len(generated),
        "perplexity": perplexity(model, rows, e.batch_size, tokenizer.pad_token_id) if rows else float("nan"),
    }
    return metrics, samples


def sampled_accuracy(model, tokenizer, prompts: list[dict], e) -> float:
    k = e.samples_per_prompt
    generated = generate(model, tokenizer, [p["prompt"] for p in prompts for _ in range(k)], batch_size=e.batch_size,
                         max_new_tokens=e.max_new_tokens, do_sample=True, temperature=e.sample_temperature)
    labels = [p["label"] for p in prompts for _ in range(k)]
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in generated]
    return sum(is_correct(t, label, e.answer_pattern) for t, label in zip(texts, labels)) / len(texts)


COLUMNS = (("accuracy", "accuracy", ".3f"), ("sampled_accuracy", "sampled accuracy", ".3f"),
           ("response_length", "response length", ".1f"), ("perplexity", "perplexity", ".3f"))


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    shown = [c for c in COLUMNS if any(c[0] in m for m in results.values())]
    lines = ["| model | " + " | ".join(title for _, title, _ in shown) + " |", "|---" * (len(shown) + 1) + "|"]
    for name, m in results.items():
        lines.append(f"| {name} | " + " | ".join(format(m[key], fmt) if key in m else "-" for key, _, fmt in shown) + " |")
    return "\n".join(lines) + "\n"


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg = ctx.config
    set_seed(cfg.seed)
    prompts = read_split(inputs["eval_data"], "eval")[: cfg.eval.max_samples]
    sft_eval = read_split(inputs["sft_data"], "eval") if "sft_data" in inputs else []
    models = model_inputs(inputs)
    out = ctx.output_dir / "eval_report"
    out.mkdir(parents=True)
    progress = Progress("eval", len(models), every_s=0)
    results: dict[str, dict[str, float]] = {}
    for i, (name, path) in enumerate(models.items()):
        metrics, samples = evaluate_model(path, cfg, prompts, sft_eval)
        results[name] = metrics
        with open(out / f"samples_{name}.jsonl", "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in samples)
        ctx.log_metrics({f"{name}/{k}": v for k, v in metrics.items()}, 0)
        progress.update(i + 1, **{f"{name}_accuracy": metrics["accuracy"]})
    (out / "results.json").write_text(json.dumps(results, indent=2))
    table = markdown_table(results)
    (out / "results.md").write_text(table)
    print("[eval] held-out results\n" + table, flush=True)
    final = list(results)[-1]
    flat = {f"{name}/{k}": v for name, m in results.items() for k, v in m.items()}
    return StageResult(outputs={"eval_report": out}, metrics={"accuracy": results[final]["accuracy"], **flat})
