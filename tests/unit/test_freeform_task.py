"""The word game of benchmarks/freeform.py: its reward and files, and the table its JSON renders."""

import json
import random

from benchmarks import freeform
from stages.rewards.func_scorer import FunctionScorer


def test_the_reward_is_one_for_the_sorted_words_only(tmp_path):
    files = freeform.write_task(tmp_path, seed=0, n_sft=20, n_pairs=5, n_prompts=5)
    scorer = FunctionScorer(files["reward"])
    rng = random.Random(1)
    prompt, answer = freeform.problem(rng)
    wrong = freeform.swapped(answer, rng)
    assert sorted(wrong.split()) == answer.split() and wrong != answer
    rewards = scorer.score([prompt] * 4, [answer, f" {answer}\nmore", wrong, ""], [answer] * 4).rewards.tolist()
    assert rewards == [1.0, 1.0, 0.0, 0.0]


def test_the_files_are_openrlhf_shaped_and_seeded(tmp_path):
    a = freeform.write_task(tmp_path / "a", seed=3, n_sft=50, n_pairs=5, n_prompts=5)
    b = freeform.write_task(tmp_path / "b", seed=3, n_sft=50, n_pairs=5, n_prompts=5)
    assert all(a[k].read_text() == b[k].read_text() for k in ("sft", "preferences", "prompts"))
    sft = [json.loads(line) for line in a["sft"].read_text().splitlines()]
    flawed = sum(r["response"] != " ".join(sorted(r["response"].split())) for r in sft)
    assert 0 < flawed < len(sft) and set(sft[0]) == {"question", "response"}
    pair = json.loads(a["preferences"].read_text().splitlines()[0])
    assert pair["chosen"][0]["role"] == "assistant" and pair["chosen"] != pair["rejected"]
    prompt = json.loads(a["prompts"].read_text().splitlines()[0])
    assert prompt["context_messages"][0]["role"] == "user" and prompt["answer"]


def test_the_table_is_rendered_from_the_json():
    result = {"date": "2026-11-26", "seed": 0, "wall_s": 325.4, "machine": {"cpus": 2, "platform": "Linux", "torch": "2"},
              "models": {"sft": {"reward": 0.9722, "sampled_reward": 0.7014}}}
    table = freeform.markdown(result)
    assert "| sft | 0.972 | 0.701 | - | - |" in table and "`rlhf run` 325 s" in table
