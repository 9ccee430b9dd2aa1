"""Data prep stage: the base model and tokenizer, and every dataset later stages train or evaluate on.

Outputs (each a directory; a dataset holds a `train` and/or `eval` split as Arrow, see stages/data/prepared.py;
every row is rendered and measured here, once, and an SFT row tokenized):
  base_model  HF checkpoint with tokenizer and chat template (the tiny preset builds one), or a
              pointer to `model.name_or_path` (a full copy where its tokenizer changes: the PRM
              placeholder added, data.tokenizer_chat_template set)
  sft_data    rows {"texts": [...], "train": [...]}: rendered segments, `train` marks the loss
              (sft.pretrain_mode: one plain-text segment, all trained)
  pref_data   rows {"prompt", "chosen", "rejected", "margin"}: prompt rendered, responses end with EOS;
              with data.preference.unpaired rows {"prompt", "response", "desirable"} (KTO's)
  prm_data    rows {"prompt", "response", "labels"}: a step placeholder ends each step, one label each
              (read from files: the prompt is empty, the response the whole text, as OpenRLHF reads it)
  prompts     rows {"prompt", "label"}: RL prompts, rendered, with their reference answers
  eval_data   rows {"prompt", "label"}: held-out prompts for the eval stage
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from configs.errors import DataError
from configs.schema import DatasetConfig, PipelineConfig
from stages.common import checkpoint, checkpoint_paths, determinism
from stages.common.answers import extract_answer
from stages.dag.contract import StageContext, StageResult
from stages.data import chat_template, prm_rows
from stages.data import files as data_files
from stages.data import prepared as prepared_data
from stages.data import values as data_values
from stages.data.tokenization import segments_with_mask
from stages.data_prep import synthetic_task, tiny_model

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


def sft_row(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict], response: str | None, cfg: DatasetConfig | None) -> dict:
    """One SFT row; `response=None` means `prompt` is a whole conversation (multi-turn)."""
    if response is None:
        if not isinstance(prompt, list):
            raise DataError("multiturn rows need a list of {role, content} messages")
        texts, train = conversation_segments(tokenizer, prompt)
        return {"texts": texts, "train": train}
    if (cfg is None or cfg.apply_chat_template) and tokenizer.chat_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        texts, train = conversation_segments(tokenizer, [*messages, {"role": "assistant", "content": response}])
        return {"texts": texts, "train": train}
    return {"texts": [render_prompt(tokenizer, prompt, cfg), response + tokenizer.eos_token], "train": [False, True]}


def prm_response(steps: list[str], placeholder: str) -> str:
    return "".join(f"{step}{placeholder}\n" for step in steps)


def add_placeholder_token(tokenizer: PreTrainedTokenizerBase, token: str) -> bool:
    """PRM data ends each step with `prm.placeholder_token`, where the PRM reads its reward: a tokenizer
    that splits it (or reads it as its unknown token) gets it as one special token. True when it was
    added (the embeddings must grow)."""
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) == 1 and ids[0] != tokenizer.unk_token_id:
        return False
    tokenizer.add_special_tokens({"extra_special_tokens": [token]}, replace_extra_special_tokens=False)
    return True


def resize_base_model(cfg: PipelineConfig, tokenizer: PreTrainedTokenizerBase, base_dir: Path, why: str) -> None:
    """The base model with embeddings for every token of `tokenizer`, saved in full, with `tokenizer`, to
    `base_dir` (replacing a pointer to the original checkpoint); `why` says what changed in the tokenizer."""
    model = checkpoint.load_causal_lm(cfg.model.name_or_path or base_dir, cfg.model, kernels=False)  # copied, not run
    embeddings = cast("torch.nn.Embedding", model.get_input_embeddings())  # transformers types it as any nn.Module
    if len(tokenizer) > embeddings.num_embeddings:  # a padded vocabulary (Qwen2) may hold it already
        model.resize_token_embeddings(len(tokenizer))
    (base_dir / checkpoint_paths.POINTER_FILE).unlink(missing_ok=True)
    checkpoint.save(model, tokenizer, base_dir)
    print(f"[data_prep] {why} ({len(tokenizer)} tokens); base_model is a full copy", flush=True)


def has_prm_rows(cfg: PipelineConfig) -> bool:
    """The data has step-labelled PRM rows: the synthetic task's, or `data.prm`'s files."""
    return cfg.data.source == "synthetic" or cfg.data.prm is not None


def add_prm_placeholder(tokenizer: PreTrainedTokenizerBase, cfg: PipelineConfig) -> bool:
    """`prm.placeholder_token` in the tokenizer where the data has PRM rows; True when it was added. In
    rows read from files it must be a special token even where the tokenizer has it as a word: a word
    merges with what stands before it (Math-Shepherd's ` ки` is another token than `ки` in a byte-level
    BPE), a special token never does."""
    if not has_prm_rows(cfg):
        return False
    token = cfg.prm.placeholder_token
    if cfg.data.source == "files" and token not in tokenizer.get_added_vocab():
        tokenizer.add_special_tokens({"extra_special_tokens": [token]}, replace_extra_special_tokens=False)
        return True
    return add_placeholder_token(tokenizer, token)


CHAR_SLACK = 4  # how far a row's characters may exceed max_len x the longest token before it surely cannot fit
PARALLEL_MIN_ROWS = 10_000  # below it, starting worker processes costs more than they save
SOURCE_PREFIX = "source."  # a source column's name while its rows are made
WRITER_BATCH = 1000  # rows `datasets` renders and writes at a time: what data prep holds of a set


def num_proc(cfg: PipelineConfig, n_rows: int) -> int:
    """Processes for `n_rows` rows: `data.num_proc`, else the cores this worker has (Ray sets
    OMP_NUM_THREADS to them)."""
    if n_rows < PARALLEL_MIN_ROWS:
        return 1
    return cfg.data.num_proc or int(os.environ.get("OMP_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))


def char_limit(tokenizer: PreTrainedTokenizerBase, max_len: int) -> int:
    """Characters beyond which a text cannot be `max_len` tokens or fewer: no token spells more characters
    than its vocabulary entry has (a byte-level entry has one per byte), with `CHAR_SLACK` for what a
    normalizer or template changes."""
    return max_len * max(map(len, tokenizer.get_vocab())) * CHAR_SLACK


def n_chars(value) -> int:
    """Characters of a text column's value (a conversation's contents included)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(map(n_chars, value))
    if isinstance(value, dict):
        return sum(map(n_chars, value.values()))
    return 0


@dataclass
class RowPreparer:
    """`datasets.map`'s function for one split: each row made (`make`; None for rows already rendered),
    its text fields checked, its tokens counted, an SFT row given its `input_ids` and `loss_mask`; a row over
    `max_len` tokens is an error with `strict`; any other row gets each text field's ids (`<field>_ids`). An
    error names the row by `where(row, index)`."""

    tokenizer: PreTrainedTokenizerBase
    text_fields: tuple[str, ...]
    may_be_empty: tuple[str, ...]
    max_len: int
    strict: bool
    where: Callable[[dict, int], str]
    make: Callable[[dict], dict] | None = None

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        made = []
        names = [name.removeprefix(SOURCE_PREFIX) for name in batch]
        for index, values in zip(indices, zip(*batch.values(), strict=True), strict=True):
            source = dict(zip(names, values, strict=True))
            try:
                row = self.make(source) if self.make is not None else source
                self.check_filled(row)
            except DataError as exc:
                raise DataError(f"{self.where(source, index)}: {exc}") from exc
            made.append((source, index, {k: v for k, v in row.items() if k not in data_files.ORIGIN_COLUMNS}))
        texts = [text for _, _, row in made for text in self.texts_of(row)]
        tokenized = iter(self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])  # the batch at once
        out: dict[str, list] = {}
        for source, index, row in made:
            segments = [next(tokenized) for _ in self.texts_of(row)]
            if "texts" in row:
                ids, mask = segments_with_mask(segments, row["train"])
                row["input_ids"], row["loss_mask"] = np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.int8)
            else:  # each text field's ids, tokenized apart as the policy sees a prompt and produces a response
                row.update({prepared_data.ids_column(f): np.asarray(seg, dtype=np.int32)
                            for f, seg in zip(self.text_fields, segments, strict=True)})
            row["n_tokens"] = n = sum(map(len, segments))
            if self.strict and n > self.max_len:
                raise DataError(f"{self.where(source, index)}: {n} tokens, longer than data.max_len={self.max_len} "
                                "(data.strict_lengths)")
            for key, value in row.items():
                out.setdefault(key, []).append(value)
        return out

    def texts_of(self, row: dict) -> list[str]:
        return list(row["texts"]) if "texts" in row else [row[f] for f in self.text_fields]

    def check_filled(self, row: dict) -> None:
        for field in (f for f in self.text_fields if f not in self.may_be_empty):
            value = row[field]
            if value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
                raise DataError(f"empty {field!r}")


def pass_options(name: str, source: datasets.Dataset, procs: int, scratch: Path | None) -> dict:
    """How `datasets` runs one pass of data prep (`map`, `filter`) over `source`, the rows of `name`: its Arrow
    file under `scratch` (None: in memory), `procs` processes, and a fingerprint of the pass's name and its
    source's (`datasets` need not hash its function, tokenizer included; the pass writes a fresh file and is
    never looked up, and the same rows give the same bytes, the saved split's state.json included)."""
    where = {"cache_file_name": str(scratch / f"{name.replace('/', '-')}.arrow")} if scratch else {"keep_in_memory": True}
    fingerprint = hashlib.sha256(f"{source._fingerprint}/{name}".encode()).hexdigest()[:16]
    return {**where, "num_proc": procs if procs > 1 else None, "new_fingerprint": fingerprint}


def prepare(name: str, ds: datasets.Dataset, preparer: RowPreparer, procs: int, scratch: Path | None) -> tuple[datasets.Dataset, int]:
    """The split's rows as the stages read them, and how many were dropped for `max_len`: rendered and
    tokenized by `procs` processes into Arrow files under `scratch` (None: in memory), never held whole."""
    if not len(ds):
        raise DataError(f"{name}: dataset is empty")
    # renamed, so that a made column of a source column's name gets its own type (`datasets` keeps the source's)
    source = ds.rename_columns({c: SOURCE_PREFIX + c for c in ds.column_names})
    started = time.monotonic()
    with data_files.quiet():
        made = source.map(preparer, batched=True, batch_size=WRITER_BATCH, writer_batch_size=WRITER_BATCH, with_indices=True,
                          remove_columns=source.column_names, **pass_options(name, source, procs, scratch))
    if len(ds) >= PARALLEL_MIN_ROWS:
        print(f"[data_prep] {name}: {len(ds)} rows rendered and measured in {time.monotonic() - started:.1f} s "
              f"({procs} process{'es' if procs > 1 else ''})", flush=True)
    lengths = np.asarray(made.select_columns("n_tokens").with_format("numpy")[:]["n_tokens"])
    kept = np.flatnonzero(lengths <= preparer.max_len)
    if not len(kept):
        raise DataError(f"{name}: every row is longer than data.max_len={preparer.max_len}; raise data.max_len")
    if len(kept) < len(made):
        made = made.select(kept)
    return made.remove_columns("n_tokens"), len(ds) - len(kept)


def drop_unfit(name: str, ds: datasets.Dataset, text_columns: list[str], limit: int, strict: bool,
               locate: Callable[[dict], str], procs: int, scratch: Path | None) -> datasets.Dataset:
    """`ds` without the rows whose text columns hold over `limit` characters (they cannot fit, and one of
    500 MB must not be tokenized to find that out); with `strict` the first is an error naming it."""
    def fits(batch: dict[str, list]) -> list[bool]:
        return [sum(n_chars(batch[c][i]) for c in text_columns) <= limit for i in range(len(batch[text_columns[0]]))]

    with data_files.quiet():
        fitting = ds.filter(fits, batched=True, batch_size=WRITER_BATCH, **pass_options(f"{name}-fits", ds, procs, scratch))
    if strict and len(fitting) < len(ds):
        first = next(i for i in range(len(ds)) if not fits({c: [ds[i][c]] for c in text_columns})[0])
        raise DataError(f"{locate(ds[first])}: over {limit} characters, more than data.max_len tokens can hold "
                        "(data.strict_lengths)")
    return fitting


# --- the two sources -----------------------------------------------------------------------------


def synthetic_datasets(cfg: PipelineConfig, tokenizer: PreTrainedTokenizerBase) -> dict[str, dict[str, list[dict]]]:
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
    """The label column's value (a conversation's: its last message), or with `label_pattern` the answer it names
    (GSM8K: `... #### 72` -> `72`)."""
    if isinstance(label, list):
        label = label[-1]["content"]
    if cfg.label_pattern is None:
        return str(label)
    answer = extract_answer(str(label), cfg.label_pattern)
    if answer is None:
        raise DataError(f"{cfg.label_key!r} {str(label)[-60:]!r} has no match for data.prompts.label_pattern {cfg.label_pattern!r}")
    return answer


def _pref_row(tokenizer: PreTrainedTokenizerBase, row: dict, cfg: DatasetConfig) -> dict:
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


def _unpaired_row(tokenizer: PreTrainedTokenizerBase, row: dict, cfg: DatasetConfig) -> dict:
    """A KTO row: one response, rendered as a preference pair's are, and whether it is desirable."""
    response = row[cfg.output_key]
    prompt = row.get(cfg.input_key) or ""  # None where a mixed-in source lacks the prompt column
    if isinstance(response, list):  # a conversation: the prompt is all but the last turn, unless input_key gives it
        prompt = response[:-1] or prompt
        response = response[-1]["content"]
    if cfg.apply_chat_template and tokenizer.chat_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        response = templated_response(tokenizer, messages, response)
    else:
        response = response + tokenizer.eos_token
    desirable = data_values.as_boolean(row[cfg.label_key])
    assert desirable is not None  # checked with the file's values
    return {"prompt": render_prompt(tokenizer, prompt, cfg), "response": response, "desirable": desirable}


def _pretrain_row(tokenizer: PreTrainedTokenizerBase, text: str, max_len: int) -> dict:
    """sft.pretrain_mode: the text as it is, every token trained, cut to `max_len` tokens (OpenRLHF cuts
    them too: plain text has no end token a cut could teach to skip)."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    while len(encoded["input_ids"]) > max_len:  # the cut text can tokenize otherwise at its end: cut until it fits
        cut = encoded["offset_mapping"][max_len - 1][1]
        if not 0 < cut < len(text):
            break  # a token without a span of its own: left to the length check
        text = text[:cut]
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return {"texts": [text], "train": [True]}


def _prm_file_row(tokenizer: PreTrainedTokenizerBase, row: dict, cfg: DatasetConfig, placeholder: str, reward_tokens: tuple[str, str]) -> dict:
    """A Math-Shepherd row as the PRM stage reads it: the whole text, its placeholders one token each."""
    text = row[cfg.input_key]
    labels = prm_rows.step_labels(text, row[cfg.label_key], placeholder, reward_tokens, (cfg.input_key, cfg.label_key))
    placeholder_id = tokenizer(placeholder, add_special_tokens=False)["input_ids"][0]
    found = tokenizer(text, add_special_tokens=False)["input_ids"].count(placeholder_id)
    if found != len(labels):  # e.g. a placeholder merged with the text around it
        raise DataError(f"the tokenizer reads {found} of the {len(labels)} step placeholders {placeholder!r} in "
                        f"{cfg.input_key!r} as the placeholder token; put whitespace around them, or pick a "
                        "prm.placeholder_token the tokenizer keeps whole")
    return {"prompt": "", "response": text, "labels": labels}


def templated_response(tokenizer: PreTrainedTokenizerBase, messages: list[dict], response: str) -> str:
    """`response` as the chat template renders it after `messages` (Mistral's leading space, Llama-3's
    trimming), up to the EOS where generation stops: the text SFT trains and the policy samples."""
    texts, _ = conversation_segments(tokenizer, [*messages, {"role": "assistant", "content": response}], "preference")
    text, eos = texts[-1], tokenizer.eos_token
    return text[: text.index(eos) + len(eos)] if eos in text else text + eos


TEXT_KEYS = ("input_key", "output_key", "chosen_key", "rejected_key")  # the config fields of columns that hold text


def file_datasets(cfg: PipelineConfig, tokenizer: PreTrainedTokenizerBase, dropped: dict[str, int] | None = None,
                  scratch: Path | None = None) -> dict[str, dict[str, datasets.Dataset]]:
    """Every dataset a `data.source: files` config names, rendered and tokenized (`prepare`); rows are
    checked here, where their file and line are known. `dropped` gets each `<set>/<split>`'s count of rows
    over `data.max_len`: OpenRLHF's datasets drop or cut them (a cut response would teach stopping
    mid-answer with no end token, a cut pair compares cut texts); with `data.strict_lengths` the first
    is an error naming its file and line. `scratch`: where `datasets` writes while it works (None: memory)."""
    out: dict[str, dict[str, datasets.Dataset]] = {}
    data = cfg.data
    pretrain = cfg.sft.pretrain_mode
    limit = char_limit(tokenizer, data.max_len)
    for line in chat_template.warnings(cfg):
        print(f"[data_prep] {line}", flush=True)

    def rendered(section: str, name: str, make) -> dict[str, datasets.Dataset]:
        """The section's rows by split; one that holds nothing out has one split (eval_prompts: eval)."""
        plain = pretrain and section == "sft"
        ds_cfg = data_files.as_read(data, section)
        columns = data_files.file_columns(section, ds_cfg, plain)
        train, ev = data_files.load_mixed(ds_cfg, section, columns, cfg.seed, plain)
        if data_files.holds_out(data, section):
            parts = {"train": train, "eval": ev}
            data_files.require_eval(section, ds_cfg, len(train), len(ev))
        else:
            parts = {"eval" if section == "eval_prompts" else "train": train}
            if not len(train):
                raise DataError(f"data.{section}: no rows in split {ds_cfg.split!r} of {', '.join(ds_cfg.paths)}")
        fields = {**columns, **data_files.optional_columns(section, ds_cfg)}
        text_columns = list(dict.fromkeys(c for f, c in fields.items() if f in TEXT_KEYS and c in train.column_names))
        locate = functools.partial(data_files.locate, ds_cfg)
        preparer = RowPreparer(tokenizer, text_fields(name, cfg), MAY_BE_EMPTY.get(name, ()), data.max_len,
                               data.strict_lengths, where=lambda row, _: locate(row), make=make)
        splits = {}
        for split, ds in parts.items():
            procs = num_proc(cfg, len(ds))
            fitting = drop_unfit(f"{name}/{split}", ds, text_columns, limit, data.strict_lengths, locate, procs, scratch)
            if not len(fitting):
                raise DataError(f"{name}/{split}: every row is longer than data.max_len={data.max_len}; raise data.max_len")
            splits[split], over = prepare(f"{name}/{split}", fitting, preparer, procs, scratch)
            if dropped is not None:
                dropped[f"{name}/{split}"] = len(ds) - len(fitting) + over
        return splits

    if data.sft is not None:
        s = data.sft
        if pretrain:
            make_sft = lambda r: _pretrain_row(tokenizer, r[s.input_key], data.max_len)  # noqa: E731
        else:
            make_sft = lambda r: sft_row(tokenizer, r[s.input_key], None if s.multiturn else r[s.output_key], s)  # noqa: E731
        out["sft_data"] = rendered("sft", "sft_data", make_sft)
    if data.preference is not None:
        p = data.preference
        make_pref = _unpaired_row if p.unpaired else _pref_row
        out["pref_data"] = rendered("preference", "pref_data", lambda r: make_pref(tokenizer, r, p))
    if data.prm is not None:
        m, placeholder, reward_tokens = data.prm, cfg.prm.placeholder_token, cfg.prm.reward_tokens
        out["prm_data"] = rendered("prm", "prm_data", lambda r: _prm_file_row(tokenizer, r, m, placeholder, reward_tokens))
    def prompt_rows(ds_cfg: DatasetConfig):
        return lambda r: {"prompt": render_prompt(tokenizer, r[ds_cfg.input_key], ds_cfg),
                          "label": reference_answer(r[ds_cfg.label_key], ds_cfg)}

    if data.prompts is not None:
        prompts = rendered("prompts", "prompts", prompt_rows(data.prompts))
        out["prompts"] = {"train": prompts["train"]}
        # OpenRLHF's --eval.dataset: the held-out prompts from a dataset of their own
        held_out = prompts if data.eval_prompts is None else rendered("eval_prompts", "eval_data", prompt_rows(data.eval_prompts))
        out["eval_data"] = {"eval": held_out["eval"]}
    return out


TEXT_FIELDS = {
    "sft_data": ("texts",),
    "pref_data": ("prompt", "chosen", "rejected"),
    "prm_data": ("prompt", "response"),
    "prompts": ("prompt",),
    "eval_data": ("prompt",),
}
UNPAIRED_FIELDS = ("prompt", "response")
MAY_BE_EMPTY = {"prm_data": ("prompt",)}  # a PRM row read from a file is all response (OpenRLHF's one text)


def text_fields(name: str, cfg: PipelineConfig) -> tuple[str, ...]:
    """The text fields of a dataset's rows (KTO's unpaired rows have one response)."""
    preference = cfg.data.preference
    if name == "pref_data" and cfg.data.source == "files" and preference is not None and preference.unpaired:
        return UNPAIRED_FIELDS
    return TEXT_FIELDS[name]


# --- the stage -----------------------------------------------------------------------------------


def tokenizer_for(cfg: PipelineConfig):
    """The tokenizer every dataset is rendered with: the checkpoint's, or the tiny model's, trained on
    the synthetic task's text; its chat template replaced by `data.tokenizer_chat_template`'s. With PRM
    rows data prep adds `prm.placeholder_token` to it (`add_placeholder_token`)."""
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
    chat_template.apply(tokenizer, cfg)
    return tokenizer


def row_number(shown: str, _: dict, index: int) -> str:
    return f"{shown} row {index}"


def build_datasets(cfg: PipelineConfig, tokenizer: PreTrainedTokenizerBase, dropped: dict[str, int] | None = None,
                   scratch: Path | None = None) -> dict[str, dict[str, datasets.Dataset]]:
    """Every dataset's splits as the stages read them, rendered and tokenized with `tokenizer` (`dropped`,
    `scratch`: see file_datasets)."""
    if cfg.data.source == "files":
        return file_datasets(cfg, tokenizer, dropped, scratch)
    out: dict[str, dict[str, datasets.Dataset]] = {}
    for name, splits in synthetic_datasets(cfg, tokenizer).items():
        out[name] = {}
        for split, rows in splits.items():
            shown = f"{name}/{split}"
            preparer = RowPreparer(tokenizer, text_fields(name, cfg), (), cfg.data.max_len, cfg.data.strict_lengths,
                                   where=functools.partial(row_number, shown))
            ds = datasets.Dataset.from_list(rows)
            out[name][split], over = prepare(shown, ds, preparer, num_proc(cfg, len(rows)), scratch)
            if dropped is not None:
                dropped[shown] = over
    return out


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    cfg = ctx.config
    determinism.seed_all(cfg.seed, cfg.infra.deterministic)
    base_dir = ctx.output_dir / "base_model"
    tokenizer = tokenizer_for(cfg)
    if cfg.model.name_or_path:
        checkpoint_paths.write_pointer(base_dir, cfg.model.name_or_path)
    else:
        model = tiny_model.build_model(cfg.model.tiny, tokenizer, cfg.seed)
        checkpoint.save(model, tokenizer, base_dir)
        print(f"[data_prep] built tokenizer ({len(tokenizer)} tokens) and model "
              f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params)", flush=True)
    changed = []  # what the saved tokenizer holds that the checkpoint's lacks
    if add_prm_placeholder(tokenizer, cfg):
        changed.append(f"prm.placeholder_token {cfg.prm.placeholder_token!r} added to the tokenizer, the embeddings resized")
    if cfg.model.name_or_path and cfg.data.tokenizer_chat_template is not None:
        changed.append("data.tokenizer_chat_template saved as the tokenizer's chat template")
    if changed:  # the base model saved with its tokenizer: later stages and exported checkpoints take both
        resize_base_model(cfg, tokenizer, base_dir, "; ".join(changed))
    scratch = ctx.work_dir / "rows"  # what `datasets` writes while it renders; gone once the splits are saved
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    dropped: dict[str, int] = {}
    datasets_by_name = build_datasets(cfg, tokenizer, dropped, scratch)  # every dataset checked before any is written

    outputs: dict[str, Path] = {"base_model": base_dir}
    metrics: dict[str, float] = {}
    for name, splits_of in datasets_by_name.items():
        folder = ctx.output_dir / name
        with data_files.quiet():
            entries = {split: prepared_data.save(ds, folder, split) for split, ds in splits_of.items()}
        prepared_data.write_manifest(folder, entries)
        for split, entry in entries.items():
            metrics[f"rows/{name}/{split}"] = float(entry["rows"])
            metrics[f"rows/{name}/{split}/dropped"] = float(dropped.get(f"{name}/{split}", 0))
        outputs[name] = folder
    shutil.rmtree(scratch, ignore_errors=True)
    print("[data_prep] rows: " + ", ".join(f"{k.removeprefix('rows/')}={int(v)}" for k, v in metrics.items()
                                           if not k.endswith("/dropped")), flush=True)
    if over := {k: n for k, n in dropped.items() if n}:
        print(f"[data_prep] dropped rows longer than data.max_len={cfg.data.max_len} (data.strict_lengths: true makes "
              "them an error): " + ", ".join(f"{k}={n}" for k, n in over.items()), flush=True)
    ctx.log_metrics(metrics, 0)
    return StageResult(outputs=outputs, metrics=metrics)
