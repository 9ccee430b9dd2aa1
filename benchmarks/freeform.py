"""The pipeline on a user's own task: a word game, OpenRLHF-format files, a `reward_func` and a Qwen2-style
checkpoint (byte-level BPE, ChatML) loaded by `model.name_or_path` — nothing of the arithmetic preset but
its step counts (`base: tiny`).

The task: "Sort alphabetically: pear fig apple" -> "apple fig pear". A share of the SFT responses swap two
words, as the arithmetic task's slip, so SFT learns a policy that samples wrong orders; the reward is 1
for the sorted words and 0 otherwise, a check no regex on a number can make. The preference pairs put the
sorted response against a swapped one.

    python -m benchmarks.freeform [--out benchmarks/results/freeform.json] [--workdir DIR] [--seed 0]

builds the files, the checkpoint and the config in the work folder, runs `rlhf run` there, and writes the
eval stage's per-model rewards (greedy, sampled, pass@k) with the date and machine to the JSON file;
`--report` prints the table of a JSON file (docs/own-task.md holds it).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import machine
from benchmarks.report import save

WORDS = ("apple", "berry", "cherry", "date", "fig", "grape", "kiwi", "lemon", "mango", "melon", "olive",
         "peach", "pear", "plum", "quince", "rhubarb")
PROMPT = "Sort alphabetically: {}"
FLAWED_SHARE = 0.3
# the tiny preset's model size (GQA as Qwen2 has it); the tokenizer's byte-level BPE learns the words
MODEL_SIZE = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 256}

REWARD_FILE = '''"""1 when the response is the prompt's words in alphabetical order, else 0."""


def reward_func(queries, prompts, labels):
    return [float(q[len(p):].strip().split("\\n")[0].strip() == label) for q, p, label in zip(queries, prompts, labels)]
'''


def problem(rng: random.Random) -> tuple[str, str]:
    """(prompt, the sorted words)."""
    words = rng.sample(WORDS, rng.randint(3, 4))
    return PROMPT.format(" ".join(words)), " ".join(sorted(words))


def swapped(answer: str, rng: random.Random) -> str:
    """The sorted words with two of them exchanged: a plausible wrong answer."""
    words = answer.split()
    i, j = rng.sample(range(len(words)), 2)
    words[i], words[j] = words[j], words[i]
    return " ".join(words)


def write_task(folder: Path, seed: int, n_sft: int = 4000, n_pairs: int = 2000, n_prompts: int = 1200) -> dict[str, Path]:
    """The three OpenRLHF-shaped files and the reward file; every row a pure function of `seed`."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = {name: folder / f"{name}.jsonl" for name in ("sft", "preferences", "prompts")}
    with open(files["sft"], "w") as f:
        for _ in range(n_sft):
            prompt, answer = problem(rng)
            response = swapped(answer, rng) if rng.random() < FLAWED_SHARE else answer
            f.write(json.dumps({"question": prompt, "response": response}) + "\n")
    with open(files["preferences"], "w") as f:
        for _ in range(n_pairs):
            prompt, answer = problem(rng)
            f.write(json.dumps({"prompt": prompt,
                                "chosen": [{"role": "assistant", "content": answer}],
                                "rejected": [{"role": "assistant", "content": swapped(answer, rng)}]}) + "\n")
    with open(files["prompts"], "w") as f:
        for _ in range(n_prompts):
            prompt, answer = problem(rng)
            f.write(json.dumps({"context_messages": [{"role": "user", "content": prompt}], "answer": answer}) + "\n")
    files["reward"] = folder / "sort_reward.py"
    files["reward"].write_text(REWARD_FILE)
    return files


def corpus(seed: int) -> list[str]:
    """Text the checkpoint's byte-level BPE is trained on: the task's words and phrasing."""
    rng = random.Random(seed + 1)
    return [f"{p}\n{a}" for p, a in (problem(rng) for _ in range(2000))]


CONFIG = """# The word game on a Qwen2-style checkpoint: only the model, the data and the reward differ from tiny.
base: tiny
model:
  name_or_path: {model}
data:
  source: files
  max_len: 96
  sft: {{paths: [{sft}], input_key: question, output_key: response, eval_ratio: 0.05}}
  preference: {{paths: [{preferences}], input_key: prompt, eval_ratio: 0.05}}
  prompts: {{paths: [{prompts}], input_key: context_messages, label_key: answer, eval_ratio: 0.15}}
reward:
  source: func
  func_path: {reward}
eval:
  answer_pattern: null        # free-form: scored by the reward alone
"""


def prepare(workdir: Path, seed: int) -> Path:
    """Files, checkpoint and config in `workdir`; returns the config's path."""
    from tests.model_families import save_family_checkpoint

    files = write_task(workdir / "data", seed)
    model = save_family_checkpoint("qwen2", workdir / "model", corpus(seed), seed=seed, size=MODEL_SIZE, vocab_size=400)
    config = workdir / "freeform.yaml"
    config.write_text(CONFIG.format(model=model, **{k: v for k, v in files.items()}))
    return config


def eval_results(workdir: Path) -> dict[str, dict[str, float]]:
    """The newest eval run's per-model metrics in the work folder's store."""
    from mlflow import MlflowClient

    from stages.eval.results import per_model

    client = MlflowClient(f"sqlite:///{workdir / '.rlhf' / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`rlhf.stage` = 'eval'", order_by=["attributes.start_time DESC"], max_results=1)
    run = runs[0]
    return per_model(run.data.metrics, [f"{m}_model" for m in ("base", "sft", "rl", "dpo")])


COLUMNS = (("reward", "greedy reward"), ("sampled_reward", "sampled reward"), ("pass_at_k", "pass@k"),
           ("response_length", "response length"))


def markdown(result: dict) -> str:
    """The eval table of a result file, as the docs show it."""
    lines = [f"Measured {result['date']}, seed {result['seed']}, {result['machine']['cpus']} CPUs "
             f"({result['machine']['platform']}), torch {result['machine']['torch']}; `rlhf run` {result['wall_s']:.0f} s.",
             "", "| model | " + " | ".join(title for _, title in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, metrics in result["models"].items():
        lines.append(f"| {name} | " + " | ".join(f"{metrics[key]:.3f}" if key in metrics else "-" for key, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.freeform", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/freeform.json")
    parser.add_argument("--workdir", default=None, help="where the files, model and store go (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", action="store_true", help="print the markdown table of --out and exit")
    args = parser.parse_args(argv)
    if args.report:
        print(markdown(json.loads(Path(args.out).read_text())), end="")
        return 0
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rlhf-freeform-")).resolve()
    config = prepare(workdir, args.seed)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "flows.cli.main", "run", "--config", str(config), f"seed={args.seed}"],
                          cwd=workdir)
    if done.returncode:
        return done.returncode
    result = {"benchmark": "freeform", "date": time.strftime("%Y-%m-%d"), "machine": machine(), "seed": args.seed,
              "wall_s": round(time.monotonic() - started, 1), "models": eval_results(workdir)}
    save(result, args.out, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
