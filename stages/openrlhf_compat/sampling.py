"""The sampling settings an OpenRLHF agent sees and may change for its next turn (`states["sampling_params"]`,
returned as `"sampling_params"` from `step`): the fields of vLLM's `SamplingParams` that every engine here
honours. A vLLM `SamplingParams` given back instead is read the same way (stages/rl/turn_params.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    max_tokens: int | None = None  # None: the rollout's budget for a turn
    stop: list[str] | None = None
    logprobs: int | None = 1  # the sampled token's log-prob is always returned
