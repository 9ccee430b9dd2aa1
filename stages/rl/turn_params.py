"""How one agent turn is sampled: the rollout's settings unless the agent changed them for its next turn
(OpenRLHF's per-step `sampling_params`). Pure: values in, values or one-line errors out."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from configs.errors import RewardError
from stages.openrlhf_compat.sampling import SamplingParams


@dataclass(frozen=True)
class TurnParams:
    temperature: float | None  # None: greedy
    top_p: float
    max_new_tokens: int
    stop: tuple[str, ...] = ()

    def capped(self, cap: int) -> TurnParams:
        """With at most `cap` new tokens: the rollout's budget per turn (the lengths the trainer was sized for)."""
        return replace(self, max_new_tokens=min(self.max_new_tokens, cap))

    def as_sampling_params(self) -> SamplingParams:
        """What the agent's code is handed (vLLM's names: temperature 0 is greedy)."""
        return SamplingParams(temperature=self.temperature or 0.0, top_p=self.top_p, max_tokens=self.max_new_tokens,
                              stop=list(self.stop) or None)


def read_turn_params(given: Any, current: TurnParams, where: str) -> TurnParams:
    """`given` (a SamplingParams of this project's or vLLM's, or a dict with their field names) as the next
    turn's settings; a field it leaves unset keeps `current`'s."""
    if given is None:
        return current

    def field(name: str) -> Any:
        return given.get(name) if isinstance(given, dict) else getattr(given, name, None)

    temperature, top_p, max_tokens, stop = (field(n) for n in ("temperature", "top_p", "max_tokens", "stop"))
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not math.isfinite(temperature) or temperature < 0):
        raise RewardError(f"{where} returned sampling_params.temperature={temperature!r}; it must be a number >= 0 (0: greedy)")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise RewardError(f"{where} returned sampling_params.top_p={top_p!r}; it must be in (0, 1]")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RewardError(f"{where} returned sampling_params.max_tokens={max_tokens!r}; it must be an int >= 1")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop)):
        raise RewardError(f"{where} returned sampling_params.stop={stop!r}; it must be a string or a list of non-empty strings")
    return TurnParams(
        temperature=current.temperature if temperature is None else (float(temperature) or None),
        top_p=current.top_p if top_p is None else float(top_p),
        max_new_tokens=current.max_new_tokens if max_tokens is None else max_tokens,
        stop=current.stop if stop is None else tuple(stop))
