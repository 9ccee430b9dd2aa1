"""Every stage on the model families users bring (tests/model_families.py): Llama-3, Qwen2, Mistral and
Mixtral, each a tiny random-init checkpoint with its own tokenizer and chat-template shape, fed
OpenRLHF-format files (SFT question/response rows, chat-list preference pairs, `context_messages`
prompts with an `answer` label, some with a system prompt) and a reward_func file. Steps are few:
this checks that each stage runs on each family and saves what the next one loads; learning is the
flow tests' job. The MoE family trains with every stage's router loss (`aux_loss_coef`)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from configs import DataError, load_config
from stages.common import checkpoint, generation, shared_prompt
from stages.data import prepared as prepared_data
from stages.data.tokenization import encode_segments
from stages.data_prep import stage as data_prep
from stages.dpo import stage as dpo
from stages.eval import stage as evaluate
from stages.lora_merge import stage as lora_merge
from stages.prm import stage as prm
from stages.rl import stage as rl_stage
from stages.rl.workers import sample
from stages.rm import stage as reward_model
from stages.sft import stage as sft
from tests.model_families import FAMILIES, save_family_checkpoint
from tests.stage.conftest import make_ctx

pytestmark = pytest.mark.slow

SYSTEM = "You are a careful calculator. Think about the numbers, then reply with the sum only, as 'Answer: N'."
REWARD = ("def reward_func(queries, prompts, labels):\n"
          "    return [1.0 if label in query[len(prompt):] else 0.0 for query, prompt, label in zip(queries, prompts, labels)]\n")
TRAINED = ("sft", "rm", "prm", "dpo")
MOE = {"mixtral"}


def question(a: int, b: int) -> str:
    return f"What is {a} plus {b}?"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """OpenRLHF-format data files and a reward_func file."""
    root = tmp_path_factory.mktemp("family_data")
    pairs = [(a, a % 7 + 1) for a in range(1, 13)]
    sft_rows = [{"question": question(a, b), "response": f"Answer: {a + b}"} for a, b in pairs]
    pref_rows = [{"chosen": [{"role": "user", "content": question(a, b)}, {"role": "assistant", "content": f"Answer: {a + b}"}],
                  "rejected": [{"role": "user", "content": question(a, b)}, {"role": "assistant", "content": f"Answer: {a + b + 1}"}]}
                 for a, b in pairs[:8]]
    prompt_rows = [{"context_messages": ([{"role": "system", "content": SYSTEM}] if a % 2 else [])
                    + [{"role": "user", "content": question(a, b)}], "answer": str(a + b)} for a, b in pairs[:8]]
    (root / "reward.py").write_text(REWARD)
    corpus = [SYSTEM, *(f"{r['question']} {r['response']}" for r in sft_rows)] * 4
    return SimpleNamespace(sft=write_jsonl(root / "sft.jsonl", sft_rows), pref=write_jsonl(root / "pref.jsonl", pref_rows),
                           prompts=write_jsonl(root / "prompts.jsonl", prompt_rows), reward=str(root / "reward.py"),
                           corpus=corpus)


def family_overrides(name: str, model_dir, files) -> list[str]:
    aux = [f"{s}.aux_loss_coef=0.01" for s in (*TRAINED, "rl.actor")] if name in MOE else []
    return [
        f"model.name_or_path={model_dir}", "model.attn_implementation=sdpa",
        "data.source=files", "data.max_len=192",
        f"data.sft.paths=[{files.sft}]", "data.sft.input_key=question", "data.sft.output_key=response",
        "data.sft.eval_ratio=0.25",
        f"data.preference.paths=[{files.pref}]", "data.preference.eval_ratio=0.25",
        f"data.prompts.paths=[{files.prompts}]", "data.prompts.input_key=context_messages",
        "data.prompts.label_key=answer", "data.prompts.eval_ratio=0.5",
        "reward.source=func", f"reward.func_path={files.reward}",
        *(f"{s}.{k}" for s in TRAINED for k in ("max_steps=2", "micro_batch_size=2", "eval_every=2", "save_every=2", "lr=1e-3")),
        "rl.max_steps=1", "rl.rollout.batch_size=2", "rl.rollout.n_samples_per_prompt=2", "rl.train_batch_size=4",
        "rl.micro_train_batch_size=4", "rl.rollout.micro_batch_size=4", "rl.rollout.generate_max_len=8", "rl.rollout.prompt_max_len=128",
        "rl.eval_every=1", "rl.save_every=1", "rl.rollout.engine=hybrid", "rl.placement.colocate_all=true", "rl.actor.lr=1e-3",
        "eval.answer_pattern=Answer:\\s*(-?\\d+)", "eval.max_samples=4", "eval.samples_per_prompt=1", "eval.max_new_tokens=8", "eval.batch_size=4",
        "infra.cpus_per_worker=2", *aux,
    ]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, files, tmp_path_factory):
    """A family's checkpoint, its config, and data prep's outputs from the files."""
    root = tmp_path_factory.mktemp(request.param)
    model_dir = save_family_checkpoint(request.param, root / "model", files.corpus)
    cfg = load_config(None, family_overrides(request.param, model_dir, files))
    outputs = data_prep.run(make_ctx("data_prep", cfg, root / "data_prep"), {}).outputs
    return SimpleNamespace(name=request.param, root=root, model=model_dir, cfg=cfg, data=outputs, files=files)


def run_stage(family, module, name: str, inputs: dict, overrides=(), logged=None):
    cfg = load_config(None, [*family_overrides(family.name, family.model, family.files), *overrides]) if overrides else family.cfg
    log = (lambda metrics, step: logged.append((step, metrics))) if logged is not None else None
    return module.run(make_ctx(name, cfg, family.root / name, log), inputs)


def logged_keys(logged) -> set[str]:
    return {k for _, m in logged for k in m}


def test_data_prep_renders_with_the_family_template(family):
    tok = checkpoint.load_tokenizer(family.model)
    sft_row = prepared_data.read_split(family.data["sft_data"], "train")[0]
    prompts = prepared_data.read_split(family.data["prompts"], "train") + prepared_data.read_split(family.data["eval_data"], "eval")
    assert sft_row["train"] == [False, True] and sft_row["texts"][1].rstrip("\n").endswith(tok.eos_token)
    assert any(SYSTEM in p["prompt"] for p in prompts)  # Mistral folds it into the first user turn
    assert tok.pad_token is not None  # Llama-3 and Mistral have none: their EOS pads, and is still trained on
    assert tok.eos_token_id in encode_segments(tok, sft_row["texts"], sft_row["train"])[1]  # a label, though it pads
    trained = {r["texts"][0]: r["texts"][1] for split in ("train", "eval")
               for r in prepared_data.read_split(family.data["sft_data"], split)}
    pairs = [p for split in ("train", "eval") for p in prepared_data.read_split(family.data["pref_data"], split)]
    shared = [p for p in pairs if p["prompt"] in trained]
    assert shared and all(trained[p["prompt"]].startswith(p["chosen"]) for p in shared)  # as SFT trains it, to the EOS
    assert all(p["chosen"].endswith(tok.eos_token) and p["rejected"].endswith(tok.eos_token) for p in pairs)
    if tok.bos_token:  # the template adds it; tokenizing rendered text must not add a second one
        ids = tok(prompts[0]["prompt"], add_special_tokens=False)["input_ids"]
        assert prompts[0]["prompt"].startswith(tok.bos_token) and ids.count(tok.bos_token_id) == 1


def test_data_preview_shows_the_family_template_and_marks_the_trained_tokens(family):
    import io

    from rich.console import Console

    from flows.cli.data_preview import preview

    out = io.StringIO()
    preview(family.cfg, 1, Console(file=out, width=400, no_color=True))
    shown = out.getvalue()
    tok = checkpoint.load_tokenizer(family.model)
    sft_row = prepared_data.read_split(family.data["sft_data"], "train")[0]
    assert "== sft_data/train" in shown and "== pref_data/train" in shown and "== prompts/train" in shown
    assert sft_row["texts"][0] in shown  # the prompt as the family's template renders it, unmarked
    marked = shown.split("== sft_data/train")[1].split("⟦", 1)[1].split("⟧", 1)[0]
    assert marked.lstrip().startswith("Answer:") and tok.eos_token in marked  # the reply and its EOS carry the loss


def test_a_system_prompt_over_the_length_limits_names_the_row(family):
    """Prompts are never cut (a cut system prompt would change the task): too long is an error naming the row."""
    tok = checkpoint.load_tokenizer(family.model)

    def n_tokens(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    rows = prepared_data.read_split(family.data["prompts"], "train")
    with_system = [n_tokens(r["prompt"]) for r in rows if SYSTEM in r["prompt"]]
    others = [n_tokens(r["prompt"]) for r in rows if SYSTEM not in r["prompt"]]
    others += [sum(map(n_tokens, r["texts"])) for r in prepared_data.read_split(family.data["sft_data"], "train")]
    others += [sum(n_tokens(r[k]) for k in ("prompt", "chosen", "rejected"))
               for r in prepared_data.read_split(family.data["pref_data"], "train")]
    assert max(others) < min(with_system)
    with pytest.raises(DataError, match=rf"prompts.jsonl line \d+: \d+ tokens, longer than data.max_len={max(others)}"):
        run_stage(family, data_prep, "data_prep_short", {}, [f"data.max_len={max(others)}", "data.strict_lengths=true"])
    first = next(i for i, r in enumerate(rows) if SYSTEM in r["prompt"])
    with pytest.raises(DataError, match=rf"prompts/train row {first}: prompt is \d+ tokens, over rl.rollout.prompt_max_len={max(others)}"):
        rl_stage.encode_prompts(tok, rows, max(others), "prompts/train")


def test_batched_generation_pads_left_and_matches_one_prompt_at_a_time(family):
    tok = checkpoint.load_tokenizer(family.model)
    model = checkpoint.load_causal_lm(family.model, family.cfg.model)
    prompts = [p["prompt"] for p in prepared_data.read_split(family.data["eval_data"], "eval")]
    assert len({len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts}) > 1
    batched = generation.generate(model, tok, prompts, batch_size=len(prompts), max_new_tokens=6)
    assert batched == [generation.generate(model, tok, [p], batch_size=1, max_new_tokens=6)[0] for p in prompts]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    rl = family.cfg.rl
    assert [s.response_ids for s in sample(model, tok, rl, ids, 0, None, 6)] == [
        sample(model, tok, rl, [i], 0, None, 6)[0].response_ids for i in ids]


def test_sft(family):
    logged = []
    result = run_stage(family, sft, "sft", {"base_model": family.data["base_model"], "sft_data": family.data["sft_data"]},
                       logged=logged)
    assert torch.isfinite(torch.tensor(result.metrics["eval/loss"]))
    assert ("train/aux_loss" in logged_keys(logged)) == (family.name in MOE)
    model = AutoModelForCausalLM.from_pretrained(result.outputs["sft_model"])
    assert type(model) is type(AutoModelForCausalLM.from_pretrained(family.model))


def test_rm(family):
    logged = []
    result = run_stage(family, reward_model, "rm", {"sft_model": family.data["base_model"], "pref_data": family.data["pref_data"]},
                       logged=logged)
    assert torch.isfinite(torch.tensor([result.metrics["eval/loss"], result.metrics["eval/reward_std"]])).all()
    assert ("train/aux_loss" in logged_keys(logged)) == (family.name in MOE)


def test_prm_on_synthetic_steps(family):
    """PRM data comes only from the synthetic task: data prep adds the step placeholder to the family's
    tokenizer, growing the embeddings only where the vocabulary has no room (Qwen2 pads its own)."""
    overrides = ["data.source=synthetic", "data.max_len=256", "data.synthetic.num_train=8", "data.synthetic.num_eval=4",
                 "data.synthetic.num_prompts=4"]
    prepared = run_stage(family, data_prep, "prm_data_prep", {}, overrides).outputs
    vocab = AutoConfig.from_pretrained(family.model).vocab_size
    tok = checkpoint.load_tokenizer(prepared["base_model"])
    assert AutoConfig.from_pretrained(prepared["base_model"]).vocab_size == max(vocab, len(tok))
    logged = []
    result = run_stage(family, prm, "prm", {"sft_model": prepared["base_model"], "prm_data": prepared["prm_data"]}, overrides,
                       logged=logged)
    assert torch.isfinite(torch.tensor(result.metrics["eval/loss"]))
    assert ("train/aux_loss" in logged_keys(logged)) == (family.name in MOE)


def test_dpo(family):
    logged = []
    result = run_stage(family, dpo, "dpo", {"sft_model": family.data["base_model"], "pref_data": family.data["pref_data"]},
                       logged=logged)
    assert torch.isfinite(torch.tensor(result.metrics["train/loss"]))
    assert ("train/aux_loss" in logged_keys(logged)) == (family.name in MOE)


def test_dpo_pair_log_probs_equal_two_padded_rows(family):
    """A pair shares its prompt in one row unless the model's sliding window is shorter than its
    sequences (Mistral's here): the shared row's 4D mask has no window."""
    tok = checkpoint.load_tokenizer(family.model)
    model = AutoModelForCausalLM.from_pretrained(family.model, attn_implementation="sdpa")
    pairs = dpo.encode_pairs(tok, prepared_data.read_split(family.data["pref_data"], "train"))
    window = shared_prompt.attention_window(model.config)
    objective = dpo.PairObjective(family.cfg.dpo, pairs, tok.pad_token_id, shared_prompt=True, window=window)
    longest = max(len(p) + len(r) for p, r in objective.sequences)
    assert objective.shared_prompt == (window is None)
    assert window is None or longest > window
    batch = objective.collate(torch.zeros(2 * len(pairs)), list(range(len(pairs))))
    sums, _ = dpo.response_logps(model, batch, shared=objective.shared_prompt)
    padded, _ = dpo.response_logps(model, dpo.sequence_batch(objective.sequences, tok.pad_token_id))
    assert sums.tolist() == pytest.approx(padded.tolist(), abs=1e-4)


def test_rl_log_probs_of_a_prompts_samples_in_one_row_equal_padded_rows(family):
    """`rl.shared_prompt` on each family's own tokenizer and model: a prompt's samples in one row give the
    padded rows' log-probs, or the layout stays padded where the model has a sliding window."""
    from stages.rl.experience import Sample, sequence_batch
    from stages.rl.workers import row_layout, token_log_probs

    tok = checkpoint.load_tokenizer(family.model)
    model = AutoModelForCausalLM.from_pretrained(family.model, attn_implementation="sdpa").eval()
    prompts = [tok(r["prompt"])["input_ids"] for r in prepared_data.read_split(family.data["prompts"], "train")[:2]]
    gen = torch.Generator().manual_seed(0)
    samples = [Sample(p, torch.randint(3, 200, (n,), generator=gen).tolist(), [0.0] * n) for p in prompts for n in (5, 1, 9)]
    batch = sequence_batch(samples, tok.pad_token_id)
    layout = row_layout(family.cfg.rl, model)
    assert layout == ("shared" if shared_prompt.attention_window(model.config) is None else "padded")
    with torch.no_grad():
        shared, padded = (token_log_probs(model, batch, 1.0, layout=lay) * batch["action_mask"] for lay in (layout, "padded"))
    assert torch.allclose(shared, padded, atol=1e-4)


def test_rl_with_a_reward_func(family):
    """The hybrid layout's one policy rank, in this process (`run_in_process`): what is checked is the family's model
    through the RL driver; the same driver on Ray actors: tests/stage/test_rl_stage.py."""
    logged = []
    inputs = {"sft_model": family.data["base_model"], "prompts": family.data["prompts"], "eval_data": family.data["eval_data"]}
    result = run_stage(family, SimpleNamespace(run=rl_stage.run_in_process), "rl", inputs, logged=logged)
    assert type(AutoModelForCausalLM.from_pretrained(result.outputs["rl_model"])) is type(AutoModelForCausalLM.from_pretrained(family.model))
    assert {"train/reward", "actor/policy_loss"} <= logged_keys(logged)
    assert ("actor/aux_loss" in logged_keys(logged)) == (family.name in MOE)


@pytest.fixture(scope="module")
def lora_sft(family):
    """SFT with LoRA adapters, then the lora_merge stage."""
    adapter = run_stage(family, sft, "sft_lora", {"base_model": family.data["base_model"], "sft_data": family.data["sft_data"]},
                        ["sft.lora.rank=4", "sft.lora.alpha=8"]).outputs["sft_model"]
    return run_stage(family, lora_merge, "lora_merge", {"sft_model": adapter})


def test_lora_and_merge(lora_sft):
    assert lora_sft.metrics["merge/max_logit_diff"] < 1e-4
    assert AutoModelForCausalLM.from_pretrained(lora_sft.outputs["merged_models"] / "sft_model") is not None


def test_eval(family, lora_sft):
    inputs = {"base_model": family.data["base_model"], "sft_model": lora_sft.outputs["merged_models"] / "sft_model",
              "sft_data": family.data["sft_data"], "eval_data": family.data["eval_data"]}
    result = run_stage(family, evaluate, "eval", inputs)
    assert {"base/accuracy", "sft/accuracy", "sft/perplexity"} <= set(result.metrics)
