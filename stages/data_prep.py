"""Data prep stage: the base model and tokenizer, and every dataset later stages train or evaluate on.

Outputs (each a directory; datasets hold `train.jsonl` and/or `eval.jsonl`):
  base_model  HF checkpoint with tokenizer and chat template (the tiny preset builds one), or a
              pointer to `model.name_or_path`
  sft_data    rows {"texts": [...], "train": [...]}: rendered segments, `train` marks the loss
  pref_data   rows {"prompt", "chosen", "rejected", "margin"}: prompt rendered, responses end with EOS
  prm_data    rows {"prompt", "response", "labels"}: a step placeholder ends each step, one label each
  prompts     rows {"prompt", "label"}: RL prompts, rendered, with their reference answers
  eval_data   rows {"prompt", "label"}: held-out prompts for the eval stage
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, cast

from transformers import PreTrainedTokenizerBase, set_seed

from configs.errors import DataError
from configs.schema import DatasetConfig, PipelineConfig
from stages import data_files, synthetic_task, tiny_model
from stages.common import checkpoint, checkpoint_paths
from stages.common.answers import extract_answer
from stages.common.tokenization import encode_segments
from stages.contract import StageContext, StageResult

if TYPE_CHECKING:
    import torch

DATASET_OUTPUTS = ("sft_data", "pref_data", "prm_data", "prompts", "eval_data")


# --- rendering: plain prompts/responses -> the text the model sees -------------------------------


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict], cfg: DatasetConfig | None) -> str:
    """A user prompt (or a conversation so far) as the text generation continues from."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    use_template = cfg is None or cfg.apply_chat_template
    if use_template and tokenizer.chat_template:
        # with tokenize=False the template renders text (transformers types every return form at once)
        return cast(str, tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    text = "\n".join(m["content"] for m in messages)
    return cfg.input_template.format(text) if cfg is not None and cfg.input_template else text


def conversation_segments(tokenizer: PreTrainedTokenizerBase, messages: list[dict], section: str = "sft") -> tuple[list[str], list[bool]]:
    """Segments of a chat-templated conversation; every assistant turn is a trained segment.

    Each assistant turn's text is what the template adds between the generation prompt before it
    and the conversation including it, so the trained text is exactly what the model must generate.
    A template that renders the prompt otherwise once the response follows (so no split of the text
    is both what the model is prompted with and what it is trained on) is a DataError naming
    `data.<section>`'s way out.
    """
    texts: list[str] = []
    train: list[bool] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        # with tokenize=False the template renders text (transformers types every return form at once)
        prefix = cast(str, tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True))
        full = cast(str, tokenizer.apply_chat_template(messages[: i + 1], tokenize=False))
        if not prefix.startswith(done) or not full.startswith(prefix):
            raise DataError(f"the chat template of {tokenizer.name_or_path} renders the prompt differently with and "
                            "without the response (the prompt with add_generation_prompt is not the start of the "
                            f"conversation); fix its chat_template, or set data.{section}.apply_chat_template=false "
                            f"and a data.{section}.input_template")
        texts += [prefix[len(done) :], full[len(prefix) :]]
        train += [False, True]
        done = full
    return texts, train


def sft_row(tokenizer, prompt: str | list[dict], response: str | None, cfg: DatasetConfig | None) -> dict:
    """One SFT row; `response=None` means `prompt` is a whole conversation (multi-turn)."""
    if response is None:
        if not isinstance(prompt, list):
            raise DataError("multiturn rows need a list of {role, content} messages")
        texts, train = conversation_segments(tokenizer, prompt)
        return {"texts": texts, "train": train}
    if (cfg is None or cfg.apply_chat_template) and tokenizer.chat_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        texts, train = conversation_segments(tokenizer, messages + [{"role": "assistant", "content": response}])
        return {"texts": texts, "train": train}
    return {"texts": [render_prompt(tokenizer, prompt, cfg), response + tokenizer.eos_token], "train": [False, True]}


def prm_response(steps: list[str], placeholder: str) -> str:
    return "".join(f"{step}{placeholder}\n" for step in steps)


def add_placeholder_token(tokenizer, token: str) -> bool:
    """PRM data ends each step with `prm.placeholder_token`, where the PRM reads its reward: a tokenizer
    that splits it gets it as one special token. True when it was added (the embeddings must grow)."""
    if len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1:
        return False
    tokenizer.add_special_tokens({"extra_special_tokens": [token]}, replace_extra_special_tokens=False)
    return True


def resize_base_model(cfg: PipelineConfig, tokenizer, base_dir: Path) -> None:
    """The base model with embeddings for every token of `tokenizer`, saved in full to `base_dir`
    (replacing a pointer to the original checkpoint)."""
    model = checkpoint.load_causal_lm(cfg.model.name_or_path or base_dir, cfg.model)
    embeddings = cast("torch.nn.Embedding", model.get_input_embeddings())  # transformers types it as any nn.Module
    if len(tokenizer) > embeddings.num_embeddings:  # a padded vocabulary (Qwen2) may hold it already
        model.resize_token_embeddings(len(tokenizer))
    (base_dir / checkpoint_paths.POINTER_FILE).unlink(missing_ok=True)
    checkpoint.save(model, tokenizer, base_dir)
    print(f"[data_prep] prm.placeholder_token {cfg.prm.placeholder_token!r} added to the tokenizer "
          f"({len(tokenizer)} tokens) and the embeddings resized; base_model is a full copy", flush=True)


def n_tokens(tokenizer, row: dict, text_fields: tuple[str, ...]) -> int:
    if "texts" in row:
        return len(encode_segments(tokenizer, row["texts"], row["train"])[0])
    return sum(len(tokenizer(row[f], add_special_tokens=False)["input_ids"]) for f in text_fields)


def check_rows(name: str, rows: list[dict], tokenizer, max_len: int | None, text_fields: tuple[str, ...]) -> None:
    """Every row non-empty and (unless `max_len` is None) within `data.max_len` tokens; the error
    names the dataset and row."""
    if not rows:
        raise DataError(f"{name}: dataset is empty")
    for i, row in enumerate(rows):
        for field in text_fields:
            value = row[field]
            if value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
                raise DataError(f"{name} row {i}: empty {field!r}")
        if max_len is not None and (n := n_tokens(tokenizer, row, text_fields)) > max_len:
            raise DataError(f"{name} row {i}: {n} tokens, longer than data.max_len={max_len}")


def write_split(out_dir: Path, split: str, rows: list[dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"{split}.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def read_split(dataset_dir: Path, split: str) -> list[dict]:
    path = Path(dataset_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: missing (expected a dataset written by data prep)")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# --- the two sources -----------------------------------------------------------------------------


def synthetic_datasets(cfg: PipelineConfig, tokenizer) -> dict[str, dict[str, list[dict]]]:
    splits = synthetic_task.generate(cfg.data.synthetic, cfg.seed)

    def sft(rows):
        return [sft_row(tokenizer, r["messages"], None, None) if "messages" in r else
                sft_row(tokenizer, r["prompt"], r["response"], None) for r in rows]

    def pref(rows):
        eos = tokenizer.eos_token
        return [
            {"prompt": render_prompt(tokenizer, r["prompt"], None), "chosen": r["chosen"] + eos,
             "rejected": r["rejected"] + eos, "margin": 0.0}
            for r in rows
        ]

    def prm(rows):
        return [
            {"prompt": render_prompt(tokenizer, r["prompt"], None), "response": prm_response(r["steps"], cfg.prm.placeholder_token),
             "labels": r["labels"]}
            for r in rows
        ]

    def prompts(rows):
        return [{"prompt": render_prompt(tokenizer, r["prompt"], None), "label": r["label"]} for r in rows]

    return {
        "sft_data": {"train": sft(splits.sft_train), "eval": sft(splits.sft_eval)},
        "pref_data": {"train": pref(splits.preference_train), "eval": pref(splits.preference_eval)},
        "prm_data": {"train": prm(splits.prm_train), "eval": prm(splits.prm_eval)},
        "prompts": {"train": prompts(splits.prompts_train)},
        "eval_data": {"eval": prompts(splits.eval_prompts)},
    }


def reference_answer(label, cfg: DatasetConfig) -> str:
    """The label column's value, or with `label_pattern` the answer it names (GSM8K: `... #### 72` -> `72`)."""
    if cfg.label_pattern is None:
        return str(label)
    answer = extract_answer(str(label), cfg.label_pattern)
    if answer is None:
        raise DataError(f"{cfg.label_key!r} {str(label)[-60:]!r} has no match for data.prompts.label_pattern {cfg.label_pattern!r}")
    return answer


def _pref_row(tokenizer, row: dict, cfg: DatasetConfig) -> dict:
    chosen, rejected = row[cfg.chosen_key], row[cfg.rejected_key]
    if isinstance(chosen, list) != isinstance(rejected, list):
        raise DataError(f"{cfg.chosen_key!r} and {cfg.rejected_key!r} must both be text or both be conversations")
    prompt = row.get(cfg.input_key) or ""  # None where a mixed-in source lacks the prompt column
    if isinstance(chosen, list):  # conversations: the prompt is all but the last turn, unless input_key gives it
        prompt = chosen[:-1] or prompt
        chosen, rejected = chosen[-1]["content"], rejected[-1]["content"]
    if cfg.apply_chat_template and tokenizer.chat_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        chosen, rejected = (templated_response(tokenizer, messages, r) for r in (chosen, rejected))
    else:
        chosen, rejected = chosen + tokenizer.eos_token, rejected + tokenizer.eos_token
    return {
        "prompt": render_prompt(tokenizer, prompt, cfg),
        "chosen": chosen,
        "rejected": rejected,
        "margin": float(row[cfg.margin_key]) if cfg.margin_key else 0.0,
    }


def templated_response(tokenizer, messages: list[dict], response: str) -> str:
    """`response` as the chat template renders it after `messages` (Mistral's leading space, Llama-3's
    trimming), up to the EOS where generation stops: the text SFT trains and the policy samples."""
    texts, _ = conversation_segments(tokenizer, [*messages, {"role": "assistant", "content": response}], "preference")
    text, eos = texts[-1], tokenizer.eos_token
    return text[: text.index(eos) + len(eos)] if eos in text else text + eos


def _checked_rows(ds, cfg: DatasetConfig, make, tokenizer, max_len: int, text_fields: tuple[str, ...]) -> list[dict]:
    """`make(row)` for every row, each within `data.max_len` tokens; an error names the file and line
    the row came from (its values were checked when its file was read)."""
    out = []
    for row in ds:
        try:
            made = make(row)
            if (n := n_tokens(tokenizer, made, text_fields)) > max_len:
                raise DataError(f"{n} tokens, longer than data.max_len={max_len}")
        except DataError as exc:
            raise DataError(f"{data_files.locate(cfg, row)}: {exc}") from exc
        out.append(made)
    return out


def file_datasets(cfg: PipelineConfig, tokenizer) -> dict[str, dict[str, list[dict]]]:
    """Every dataset a `data.source: files` config names, rendered; rows are checked here, where
    their file and line are known."""
    out: dict[str, dict[str, list[dict]]] = {}
    data = cfg.data

    def rendered(section: str, ds_cfg: DatasetConfig, name: str, make) -> dict[str, list[dict]]:
        train, ev = data_files.load_mixed(ds_cfg, section, data_files.file_columns(section, ds_cfg), cfg.seed)
        data_files.require_eval(section, ds_cfg, train, ev)
        return {split: _checked_rows(ds, ds_cfg, make, tokenizer, data.max_len, TEXT_FIELDS[name])
                for split, ds in (("train", train), ("eval", ev))}

    if data.sft is not None:
        s = data.sft
        out["sft_data"] = rendered(
            "sft", s, "sft_data",
            lambda r: sft_row(tokenizer, r[s.input_key], None if s.multiturn else r[s.output_key], s),
        )
    if data.preference is not None:
        p = data.preference
        out["pref_data"] = rendered("preference", p, "pref_data", lambda r: _pref_row(tokenizer, r, p))
    if data.prompts is not None:
        q = data.prompts
        prompts = rendered(
            "prompts", q, "prompts",
            lambda r: {"prompt": render_prompt(tokenizer, r[q.input_key], q), "label": reference_answer(r[q.label_key], q)},
        )
        out["prompts"] = {"train": prompts["train"]}
        out["eval_data"] = {"eval": prompts["eval"]}
    return out


TEXT_FIELDS = {
    "sft_data": ("texts",),
    "pref_data": ("prompt", "chosen", "rejected"),
    "prm_data": ("prompt", "response"),
    "prompts": ("prompt",),
    "eval_data": ("prompt",),
}


# --- the stage -----------------------------------------------------------------------------------


def tokenizer_for(cfg: PipelineConfig):
    """The tokenizer every dataset is rendered with: the checkpoint's, or the tiny model's, trained on
    the synthetic task's text. With synthetic (PRM) data it holds `prm.placeholder_token`."""
    if cfg.model.name_or_path:
        checkpoint_paths.validate(cfg.model.name_or_path)
        checkpoint.require_causal_lm(cfg.model.name_or_path, cfg.model)
        tokenizer = checkpoint.load_tokenizer(cfg.model.name_or_path)
    elif cfg.data.source == "synthetic":
        splits = synthetic_task.generate(cfg.data.synthetic, cfg.seed)
        corpus = ["\n".join(m["content"] for m in r["messages"]) if "messages" in r else r["prompt"] + "\n" + r["response"]
                  for r in splits.sft_train]
        tokenizer = tiny_model.train_tokenizer(corpus, cfg.model.tiny.vocab_size)
    else:
        raise DataError("data.source=files needs model.name_or_path (the tiny model only knows the synthetic task)")
    return tokenizer


def build_datasets(cfg: PipelineConfig, tokenizer) -> dict[str, dict[str, list[dict]]]:
    """Every dataset's splits as the stages read them, rendered with `tokenizer`."""
    return synthetic_datasets(cfg, tokenizer) if cfg.data.source == "synthetic" else file_datasets(cfg, tokenizer)


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg = ctx.config
    set_seed(cfg.seed)
    base_dir = ctx.output_dir / "base_model"
    tokenizer = tokenizer_for(cfg)
    if cfg.model.name_or_path:
        checkpoint_paths.write_pointer(base_dir, cfg.model.name_or_path)
    else:
        model = tiny_model.build_model(cfg.model.tiny, tokenizer, cfg.seed)
        checkpoint.save(model, tokenizer, base_dir)
        print(f"[data_prep] built tokenizer ({len(tokenizer)} tokens) and model "
              f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params)", flush=True)
    if cfg.data.source == "synthetic" and add_placeholder_token(tokenizer, cfg.prm.placeholder_token):
        resize_base_model(cfg, tokenizer, base_dir)  # synthetic data has PRM rows
    datasets_by_name = build_datasets(cfg, tokenizer)

    outputs: dict[str, Path] = {"base_model": base_dir}
    metrics: dict[str, float] = {}
    # rows read from files were measured where their file and line are known
    max_len = cfg.data.max_len if cfg.data.source == "synthetic" else None
    for name, splits_of in datasets_by_name.items():
        for split, rows in splits_of.items():
            check_rows(f"{name}/{split}", rows, tokenizer, max_len, TEXT_FIELDS[name])
    for name, splits_of in datasets_by_name.items():  # written once every dataset is checked
        for split, rows in splits_of.items():
            write_split(ctx.output_dir / name, split, rows)
            metrics[f"rows/{name}/{split}"] = float(len(rows))
        outputs[name] = ctx.output_dir / name
    print("[data_prep] rows: " + ", ".join(f"{k.removeprefix('rows/')}={int(v)}" for k, v in metrics.items()), flush=True)
    ctx.log_metrics(metrics, 0)
    return StageResult(outputs=outputs, metrics=metrics)
