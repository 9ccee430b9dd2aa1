"""The DPO stage's objectives (`dpo.loss`), declared once: the loss each trains with and on what units.
The schema validates against this registry; `stages/dpo/stage.py` builds the objective it describes
(`stages/dpo/losses.py` holds the math each entry names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from configs.registry import Registry


@dataclass(frozen=True)
class DPOObjective:
    name: str
    pair_loss: str  # a key of stages.dpo.losses.PAIR_LOSSES: what a pair's terms are (for `examples`: in eval only)
    about: str = ""  # what it is, for the config reference
    # pairs: each (chosen, rejected) pair is one training row; examples: each pair gives a desirable and
    # an undesirable example, trained apart with KTO's loss
    pairing: Literal["pairs", "examples"] = "pairs"
    length_average: bool = False  # a response's log-prob is the mean over its tokens, not the sum (IPO)
    options: tuple[str, ...] = ()  # `dpo` keys only this objective reads: set under another loss, an error


DPO_OBJECTIVES = Registry("DPO objective", (
    DPOObjective("sigmoid", "sigmoid", "DPO (cDPO with label_smoothing)", options=("label_smoothing",)),
    DPOObjective("ipo", "ipo", length_average=True),
    DPOObjective("kto", "sigmoid", pairing="examples", options=("desirable_weight", "undesirable_weight")),
))
