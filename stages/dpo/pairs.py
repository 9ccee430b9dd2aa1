"""The sequences DPO's and KTO's objectives index, as views of their pairs or examples: a row is read when
a micro-batch or the reference pass asks for it, so a million stored pairs are not held as lists per rank.

A sequence is (prompt ids, response ids). A stored pair set is data prep's memory-mapped split with
`prompt_ids`, `chosen_ids` and `rejected_ids` (unpaired: `response_ids` and `desirable`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import datasets
import numpy as np

from stages.data import prepared as prepared_data
from stages.data.prepared import Indexed, MappedRows, ids_column

Seq = tuple[list[int], list[int]]
Pair = tuple[Seq, Seq]
PROMPT, CHOSEN, REJECTED, RESPONSE = (ids_column(f) for f in ("prompt", "chosen", "rejected", "response"))
DESIRABLE = "desirable"  # the column of an unpaired (KTO) row: whether its response is desirable


def is_unpaired(columns: Iterable[str]) -> bool:
    """A row's fields or a split's columns: `pref_data` written from `data.preference.unpaired`, one response
    each, desirable or not."""
    return DESIRABLE in columns


class View(Indexed[Seq]):
    """`n` sequences, each made from the pairs or examples when indexed."""

    n: int

    def __len__(self) -> int:
        return self.n


class PairSides(View):
    """The chosen sequence of every pair, then the rejected one of every pair (2n sequences)."""

    def __init__(self, pairs: Sequence[Pair]):
        self.pairs, self.n = pairs, 2 * len(pairs)

    def item(self, i: int) -> Seq:
        half = len(self.pairs)
        return self.pairs[i][0] if i < half else self.pairs[i - half][1]


class SplitPairs(View):
    """Pair i as examples 2i (chosen) and 2i + 1 (rejected)."""

    def __init__(self, pairs: Sequence[Pair]):
        self.pairs, self.n = pairs, 2 * len(pairs)

    def item(self, i: int) -> Seq:
        return self.pairs[i // 2][i % 2]


def mismatched(examples: Sequence[Seq], j: int, start: int) -> int:
    """The example whose completion goes with example j's prompt in its KL sequence: the first from j + start
    on, in order, that answers another prompt (OpenRLHF takes the next one in its micro-batch)."""
    m = len(examples)
    for step in range(start, start + m):
        if examples[(j + step) % m][0] != examples[j][0]:
            return (j + step) % m
    return (j + start) % m  # every example answers one prompt: no mismatched completion exists


class WithKLSequences(View):
    """The m examples, then example j's KL sequence at m + j: its prompt with the completion of the
    `mismatched` example."""

    def __init__(self, examples: Sequence[Seq], start: int):
        self.examples, self.start, self.n = examples, start, 2 * len(examples)

    def item(self, i: int) -> Seq:
        m = len(self.examples)
        if i < m:
            return self.examples[i]
        j = i - m
        return self.examples[j][0], self.examples[mismatched(self.examples, j, self.start)][1]


@dataclass(frozen=True)
class PairShape:
    """What decides whether a pair set can run its pairs as shared-prompt rows (PairObjective)."""

    shares_prompts: bool  # each pair's two sequences have one prompt, and neither response is empty
    longest: int  # the most tokens of a prompt and its response

    @staticmethod
    def of(pairs: Sequence[Pair]) -> PairShape:
        """By reading every pair: for pairs made in memory (iterative DPO's, a test's)."""
        return PairShape(all(c[0] == r[0] and c[1] and r[1] for c, r in pairs),
                         max((len(p) + len(r) for pair in pairs for p, r in pair), default=0))


def pair_of(row: dict) -> Pair:
    return (row[PROMPT], row[CHOSEN]), (row[PROMPT], row[REJECTED])


def stored_pairs(ds: datasets.Dataset, where: str) -> tuple[MappedRows[Pair], PairShape]:
    """A prepared preference split's pairs, each read as it is indexed, and their shape from the stored
    ids' lengths (one prompt column: the two sequences of a pair always share it)."""
    pairs = MappedRows(ds, (PROMPT, CHOSEN, REJECTED), pair_of, where)
    prompt, chosen, rejected = (prepared_data.list_lengths(ds, c) for c in (PROMPT, CHOSEN, REJECTED))
    if not len(ds):
        return pairs, PairShape(True, 0)
    return pairs, PairShape(bool((chosen > 0).all() and (rejected > 0).all()),
                            int((prompt + np.maximum(chosen, rejected)).max()))


def example_of(row: dict) -> Seq:
    return row[PROMPT], row[RESPONSE]


def stored_examples(ds: datasets.Dataset, where: str) -> tuple[MappedRows[Seq], np.ndarray]:
    """A prepared split of unpaired rows: its examples, each read as it is indexed, and whether each is
    desirable."""
    examples = MappedRows(ds, (PROMPT, RESPONSE), example_of, where)
    return examples, prepared_data.column(ds, DESIRABLE).to_numpy().astype(bool)
