"""Eval stage: every model it is given, on the held-out set, scored by the `reward` section's source
(a `reward_func` file, an RM, a PRM or a remote server). A conditional-SFT policy is prompted with the
target reward its checkpoint records (stages/common/conditioning.py).

Per model (stages.eval.metrics, as the RL stage's periodic evals): the mean reward of the greedy
responses; the mean reward of `eval.samples_per_prompt` responses drawn per prompt at
`eval.sample_temperature` (the policy as RL samples it) and, where those rewards are 0/1, pass@k;
the mean response length (tokens); where `eval.answer_pattern` is set, the exact-match accuracy of the
greedy and the sampled answers against the labels; and the perplexity of the reference solutions (SFT
eval split, response tokens only). Reads `reward_model` / `prm` when the reward is the pipeline's own.
Writes `eval_report/` with `results.json`, `results.md` and per-model generations with their rewards. A
model an earlier run scored from the same checkpoint with the same data, reward and settings is not
scored again: the flow hands its metrics and samples in `ctx.prior_results` (flows/eval_reuse.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from transformers import PreTrainedTokenizerBase, set_seed

from configs.errors import ConfigError
from stages.common import checkpoint, conditioning, determinism
from stages.common.answers import extract_answer, is_correct, matches
from stages.common.generation import generate
from stages.common.progress import Progress
from stages.dag.contract import StageContext, StageResult
from stages.data.prepared import read_split, row_view
from stages.data.tokenization import encode_segments, pad_batch
from stages.eval.metrics import by_prompt, held_out_metrics
from stages.eval.results import SCORE, model_inputs
from stages.rewards.base import RewardSource
from stages.rewards.factory import build_scorer

if TYPE_CHECKING:
    from configs.schema import PipelineConfig



@torch.no_grad()
def perplexity(model, rows: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int) -> float:
    total_loss, total_tokens = 0.0, 0
    for i in range(0, len(rows), batch_size):
        batch = pad_batch(rows[i : i + batch_size], pad_id)
        n = int((batch["labels"][:, 1:] != -100).sum())
        total_loss += float(model(**{k: v.to(model.device) for k, v in batch.items()}, use_cache=False).loss) * n
        total_tokens += n
    return math.exp(total_loss / max(total_tokens, 1))


def decoded(tokenizer: PreTrainedTokenizerBase, sequences: list[list[int]]) -> list[str]:
    """Each sequence's text (`decode` of one sequence is a str; transformers types it with the batched form's list)."""
    return [cast(str, tokenizer.decode(ids, skip_special_tokens=True)) for ids in sequences]


def evaluate_model(model_dir: Path, cfg: PipelineConfig, prompts: list[dict], sft_eval: list[dict],
                   scorer: RewardSource) -> tuple[dict[str, float], list[dict]]:
    e, k = cfg.eval, cfg.eval.samples_per_prompt
    set_seed(cfg.seed)  # each model's sampled responses are drawn from the same seed
    tokenizer = checkpoint.load_tokenizer(model_dir)
    model = checkpoint.load_frozen_lm(model_dir, cfg.model)
    texts, labels = [p["prompt"] for p in prompts], [p["label"] for p in prompts]
    # a conditional-SFT policy is prompted with its target reward; the scorer sees the plain prompts
    conditioned = conditioning.prompts_for(model_dir, texts)
    generated = generate(model, tokenizer, conditioned, batch_size=e.batch_size, max_new_tokens=e.max_new_tokens)
    responses = decoded(tokenizer, generated)
    rewards = scorer.score(texts, responses, labels).rewards.tolist()
    drawn: list[list[str]] = [[] for _ in prompts]  # [n][k] responses
    sampled: list[list[float]] = [[] for _ in prompts]  # and their rewards
    if k:
        asked, asked_labels = [t for t in texts for _ in range(k)], [label for label in labels for _ in range(k)]
        flat = decoded(tokenizer, generate(model, tokenizer, [t for t in conditioned for _ in range(k)], batch_size=e.batch_size,
                                           max_new_tokens=e.max_new_tokens, do_sample=True, temperature=e.sample_temperature))
        scores = scorer.score(asked, flat, asked_labels).rewards.tolist()
        drawn, sampled = by_prompt(flat, len(prompts)), by_prompt(scores, len(prompts))
    samples = [{"prompt": t, "response": r, "reward": v, "label": label}
               for t, r, v, label in zip(texts, responses, rewards, labels)]
    correct = sampled_correct = None
    if e.answer_pattern is not None:
        for s in samples:
            s["answer"] = extract_answer(s["response"], e.answer_pattern)
            s["correct"] = matches(s["answer"], s["label"])
        correct = [s["correct"] for s in samples]
        sampled_correct = [[is_correct(r, label, e.answer_pattern) for r in group] for group, label in zip(drawn, labels)]
    rows = [encode_segments(tokenizer, r["texts"], r["train"]) for r in sft_eval]
    metrics = held_out_metrics(rewards, sampled, [len(ids) for ids in generated], correct, sampled_correct)
    if rows:  # no SFT rows (a config that pins inputs.sft_model and names no data.sft): no perplexity
        metrics["perplexity"] = perplexity(model, rows, e.batch_size, tokenizer.pad_token_id)
    return metrics, samples


COLUMNS = (("reward", "reward", ".3f"), ("sampled_reward", "sampled reward", ".3f"), ("pass_at_k", "pass@k", ".3f"),
           ("accuracy", "accuracy", ".3f"), ("sampled_accuracy", "sampled accuracy", ".3f"),
           ("response_length", "response length", ".1f"), ("perplexity", "perplexity", ".3f"))


def markdown_table(results: dict[str, dict[str, float]], ranked_by: str) -> str:
    """One row per model; the `ranked_by` column (`eval.metric`, what the champion is chosen by) first, in bold."""
    ordered = sorted(COLUMNS, key=lambda c: c[0] != ranked_by)
    shown = [(key, f"**{title}**" if key == ranked_by else title, fmt) for key, title, fmt in ordered
             if any(key in m for m in results.values())]
    lines = ["| model | " + " | ".join(title for _, title, _ in shown) + " |", "|---" * (len(shown) + 1) + "|"]
    for name, m in results.items():
        lines.append(f"| {name} | " + " | ".join(format(m[key], fmt) if key in m else "-" for key, _, fmt in shown) + " |")
    return "\n".join(lines) + "\n"


def ranking_metric(cfg: PipelineConfig, metrics: dict[str, float]) -> float:
    """The model's `eval.metric`; pass@k is missing only where the rewards are not 0/1 (the schema checks the rest)."""
    metric = cfg.eval.metric
    if metric not in metrics:
        r = cfg.reward
        source = f"reward.func_path={r.func_path}" if r.source == "func" else f"reward.source={r.source}"
        raise ConfigError(f"eval.metric={metric}: the sampled rewards of {source} are not all 0 or 1, so there is "
                          "no pass@k; set eval.metric to reward or sampled_reward")
    return metrics[metric]


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg = ctx.config
    determinism.seed_all(cfg.seed, cfg.infra.deterministic)
    prompts = row_view(inputs["eval_data"], "eval")[: cfg.eval.max_samples]  # only the rows it scores are read
    sft_eval = read_split(inputs["sft_data"], "eval") if "sft_data" in inputs else []
    models = model_inputs(inputs)
    scorer = build_scorer(cfg.reward, inputs)  # a bad reward config fails here, before any model loads
    out = ctx.output_dir / "eval_report"
    out.mkdir(parents=True)
    progress = Progress("eval", len(models), every_s=0)
    results: dict[str, dict[str, float]] = {}
    for i, (name, path) in enumerate(models.items()):
        if (prior := ctx.prior_results.get(name)) is not None:  # the same checkpoint, data, reward and settings
            metrics, samples = prior["metrics"], prior["samples"]
            print(f"[eval] {name}: scores of MLflow run {prior['run_id']} reused (the same checkpoint, data, reward "
                  "and settings)", flush=True)
        else:
            metrics, samples = evaluate_model(path, cfg, prompts, sft_eval, scorer)
        results[name] = metrics
        with open(out / f"samples_{name}.jsonl", "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in samples)
        ctx.log_metrics({f"{name}/{k}": v for k, v in metrics.items()}, 0)
        progress.show(i + 1, {f"{name}_{cfg.eval.metric}": ranking_metric(cfg, metrics)})
    (out / "results.json").write_text(json.dumps(results, indent=2))
    table = markdown_table(results, cfg.eval.metric)
    (out / "results.md").write_text(table)
    print(f"[eval] held-out results (champion by eval.metric={cfg.eval.metric})\n" + table, flush=True)
    final = list(results)[-1]
    flat = {f"{name}/{k}": v for name, m in results.items() for k, v in m.items()}
    return StageResult(outputs={"eval_report": out}, metrics={SCORE: ranking_metric(cfg, results[final]), **flat})
