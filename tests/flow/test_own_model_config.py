"""A new user's config: only `model`, `data` and `reward` sections, for a checkpoint of a hub family and
OpenRLHF-format files. On this 2-core machine the schema's defaults (sized for real models: 2048-token rows,
1024-token prompts and responses, precision auto) must choose an RL layout that fits (hybrid, colocated),
drop and count a row over data.max_len rather than stop, sample no further than the model's context window,
run every stage to an eval table scored by the user's reward, and leave nothing for a later stage to wait on."""

import json

import pytest

from tests.flow.conftest import mlflow_client
from tests.model_families import save_family_checkpoint

pytestmark = pytest.mark.slow

REWARD = ("def reward_func(queries, prompts, labels):\n"
          "    return [float(label in query[len(prompt):]) for query, prompt, label in zip(queries, prompts, labels)]\n")


def lines(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_a_config_of_only_model_data_and_reward_runs_every_stage(cli, workdir, prefect_server, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)  # the tests' shared server, not a temporary one of its own
    pairs = [(a, a % 5 + 1) for a in range(40)]
    ask = lambda a, b: f"What is {a} plus {b}?"  # noqa: E731
    sft_rows = [{"question": ask(a, b), "response": f"{a + b}"} for a, b in pairs]
    # one row over the default data.max_len (2048 tokens): dropped and counted, not the end of the run
    sft_rows.insert(7, {"question": ask(1, 2), "response": " ".join(["3"] * 2100)})
    (workdir / "sft.jsonl").write_text(lines(sft_rows))
    (workdir / "prefs.jsonl").write_text(lines(
        {"prompt": ask(a, b), "chosen": [{"role": "assistant", "content": f"{a + b}"}],
         "rejected": [{"role": "assistant", "content": f"{a + b + 1}"}]} for a, b in pairs))
    (workdir / "prompts.jsonl").write_text(lines(
        {"context_messages": [{"role": "user", "content": ask(a, b)}], "answer": str(a + b)} for a, b in pairs))
    (workdir / "reward.py").write_text(REWARD)
    model = save_family_checkpoint("qwen2", workdir / "model", [f"{ask(a, b)} {a + b}" for a, b in pairs] * 3)
    (workdir / "mine.yaml").write_text(
        f"model:\n  name_or_path: {model}\n"
        "data:\n  source: files\n"
        "  sft: {paths: [sft.jsonl], input_key: question, output_key: response}\n"
        "  preference: {paths: [prefs.jsonl], input_key: prompt}\n"
        "  prompts: {paths: [prompts.jsonl], input_key: context_messages, label_key: answer}\n"
        "reward:\n  source: func\n  func_path: reward.py\n")
    done = cli("run", "--config", "mine.yaml")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rl.rollout.engine=auto: rl.rollout.engine=hybrid, every group colocated" in done.stdout
    assert "[data_prep] dropped rows longer than data.max_len=2048" in done.stdout
    assert "(1 rows over data.max_len dropped)" in done.stdout  # the run's summary table, data_prep's row
    client = mlflow_client(workdir)
    experiment = client.get_experiment_by_name("rlhf-pipeline")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`rlhf.kind` = 'pipeline'")
    stages = {k.removeprefix("stage."): v.split()[0] for k, v in parent.data.tags.items() if k.startswith("stage.")}
    assert {s: stages[s] for s in ("data_prep", "sft", "rm", "rl", "dpo", "eval")} == dict.fromkeys(
        ("data_prep", "sft", "rm", "rl", "dpo", "eval"), "ran")
    eval_run = client.get_run(parent.data.tags["stage.eval"].split()[1])
    for model_name in ("base", "sft", "rl", "dpo"):
        assert {f"{model_name}/reward", f"{model_name}/sampled_reward"} <= set(eval_run.data.metrics)
    assert not any(k.endswith("/accuracy") for k in eval_run.data.metrics)  # no answer_pattern: rewards only
    assert parent.data.params["sft.lr"] == "5e-06" and parent.data.params["rl.rollout.engine"] == "hybrid"
