"""`rlhf data preview`: each dataset as the model will see it, before any training.

Per dataset and split: a few rows rendered with the chat template, every token shown with the
loss-carrying ones marked (green, or inside ⟦ ⟧ without colour), each row's token count, and the
length percentiles against `data.max_len`. A wrong `input_key` or template shows in seconds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from configs.schema import PipelineConfig
from stages.data.tokenization import IGNORE_INDEX, decoded, encode_segments

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


LOSS_STYLE = "bold green"


def loss_segments(name: str, row: dict, placeholder: str) -> tuple[list[str], list[bool]] | list[tuple[list[str], list[bool]]]:
    """The texts of a row and which of them a stage trains on (pairs: one sequence per response)."""
    if name == "sft_data":
        return row["texts"], row["train"]
    if name == "pref_data" and "response" in row:  # KTO's unpaired rows: one response each
        return [row["prompt"], row["response"]], [False, True]
    if name == "pref_data":
        return [([row["prompt"], row[key]], [False, True]) for key in ("chosen", "rejected")]
    if name == "prm_data":  # the PRM's loss sits on each step's placeholder
        pieces = row["response"].split(placeholder)
        texts, train = [row["prompt"]], [False]
        for i, piece in enumerate(pieces):
            texts.append(piece)
            train.append(False)
            if i < len(pieces) - 1:
                texts.append(placeholder)
                train.append(True)
        return texts, train
    return [row["prompt"]], [False]  # prompts: RL and eval generate after them


def tokens_with_loss(tokenizer: PreTrainedTokenizerBase, texts: list[str], train: list[bool]) -> list[tuple[str, bool]]:
    ids, labels = encode_segments(tokenizer, texts, train)
    return [(decoded(tokenizer, [i]), label != IGNORE_INDEX) for i, label in zip(ids, labels)]


def render(tokens: list[tuple[str, bool]], colour: bool) -> Text:
    """The row's text, each run of loss-carrying tokens styled (or bracketed) as one span."""
    text = Text()
    runs: list[tuple[str, bool]] = []
    for piece, trained in tokens:
        if runs and runs[-1][1] == trained:
            runs[-1] = (runs[-1][0] + piece, trained)
        else:
            runs.append((piece, trained))
    for piece, trained in runs:
        if colour:
            text.append(piece, style=LOSS_STYLE if trained else None)
        else:
            text.append(f"⟦{piece}⟧" if trained else piece)
    return text


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of an ascending list."""
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def length_line(lengths: list[int], max_len: int) -> str:
    ordered = sorted(lengths)
    over = sum(n > max_len for n in ordered)
    stats = ", ".join(f"p{q} {percentile(ordered, q)}" for q in (50, 90, 99))
    return f"tokens: {stats}, max {ordered[-1]} (data.max_len {max_len}: {over} row{'s' * (over != 1)} over)"


def row_sequences(name: str, row: dict, placeholder: str) -> list[tuple[list[str], list[bool]]]:
    segments = loss_segments(name, row, placeholder)
    return segments if isinstance(segments, list) else [segments]


SEQUENCE_NAMES = {"pref_data": ("chosen", "rejected")}


def preview(cfg: PipelineConfig, n: int, console: Console) -> None:
    from stages.data import prepared as prepared_data
    from stages.data_prep.stage import build_datasets, tokenizer_for

    tokenizer = tokenizer_for(cfg)
    placeholder = cfg.prm.placeholder_token
    from stages.data_prep.stage import add_prm_placeholder

    add_prm_placeholder(tokenizer, cfg)
    colour = console.is_terminal and not console.no_color
    legend = "green" if colour else "inside ⟦ ⟧"
    console.print(f"tokenizer: {tokenizer.name_or_path or 'the tiny model'} ({len(tokenizer)} tokens, chat template: "
                  f"{'yes' if tokenizer.chat_template else 'no'}); tokens that carry loss are {legend}")
    for name, splits in build_datasets(cfg, tokenizer).items():
        for split, ds in splits.items():
            if not len(ds):
                continue
            rows = prepared_data.rows(ds)
            lengths = [max(len(encode_segments(tokenizer, *seq)[0]) for seq in row_sequences(name, row, placeholder))
                       for row in rows]
            console.print(Text(f"\n== {name}/{split}: {len(rows)} rows; {length_line(lengths, cfg.data.max_len)}",
                               style="bold"))
            for i, row in enumerate(rows[:n]):
                for j, seq in enumerate(row_sequences(name, row, placeholder)):
                    tokens = tokens_with_loss(tokenizer, *seq)
                    trained = sum(t for _, t in tokens)
                    which = f" ({SEQUENCE_NAMES[name][j]})" if name in SEQUENCE_NAMES and "response" not in row else ""
                    console.print(Text(f"-- row {i}{which}: {len(tokens)} tokens, {trained} with loss", style="dim"))
                    console.print(render(tokens, colour))
                if "label" in row:
                    console.print(Text(f"   label: {row['label']!r}", style="dim"))
                if "desirable" in row:
                    console.print(Text(f"   desirable: {str(row['desirable']).lower()}", style="dim"))
