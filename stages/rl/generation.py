"""The driver's side of sampling: a batch of prompts spread over the rollout engines (or the hybrid
policy ranks), launched and collected."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from stages.rl.backend import Backend, Ref, Sampler
from stages.rl.experience import Sample


class Sampling(Protocol):
    """What sampling needs of the driver's workers (stages.rl.stage.Actors)."""

    @property
    def backend(self) -> Backend: ...

    @property
    def samplers(self) -> Sequence[Sampler]: ...


def launch_generation(actors: Sampling, prompt_ids: list[list[int]], seed: int, temperature: float | None,
                      max_new_tokens: int, top_p: float = 1.0, stop: tuple[str, ...] = ()) -> list[Ref[list[Sample]]]:
    """Spread the prompts over the samplers (contiguous chunks, so groups stay together); the pending results."""
    samplers, b = actors.samplers, actors.backend
    k = math.ceil(len(prompt_ids) / len(samplers))
    chunks = [prompt_ids[i * k : (i + 1) * k] for i in range(len(samplers))]
    return [b.call(e.generate, c, seed + i, temperature, max_new_tokens, top_p, stop)
            for i, (e, c) in enumerate(zip(samplers, chunks)) if c]


def collect_generation(actors: Sampling, pending: list[Ref[list[Sample]]]) -> list[Sample]:
    return [s for r in actors.backend.get(pending) for s in r]


def generate(actors: Sampling, prompt_ids: list[list[int]], seed: int, temperature: float | None, max_new_tokens: int,
             top_p: float = 1.0, stop: tuple[str, ...] = ()) -> list[Sample]:
    return collect_generation(actors, launch_generation(actors, prompt_ids, seed, temperature, max_new_tokens, top_p, stop))
