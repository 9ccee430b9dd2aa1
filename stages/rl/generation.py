"""The driver's side of sampling: a batch of prompts spread over the rollout engines (or the hybrid
policy ranks), launched and collected."""

from __future__ import annotations

import math

from stages.rl.experience import Sample


def launch_generation(actors, prompt_ids: list[list[int]], seed: int, temperature: float | None,
                      max_new_tokens: int, top_p: float = 1.0) -> list:
    """Spread the prompts over the engines (contiguous chunks, so groups stay together); the pending results."""
    engines, b = actors.engines, actors.backend
    k = math.ceil(len(prompt_ids) / len(engines))
    chunks = [prompt_ids[i * k : (i + 1) * k] for i in range(len(engines))]
    return [b.call(e, "generate", c, seed + i, temperature, max_new_tokens, top_p)
            for i, (e, c) in enumerate(zip(engines, chunks)) if c]


def collect_generation(actors, pending: list) -> list[Sample]:
    return [s for r in actors.backend.get(pending) for s in r]


def generate(actors, prompt_ids: list[list[int]], seed: int, temperature: float | None, max_new_tokens: int,
             top_p: float = 1.0) -> list[Sample]:
    return collect_generation(actors, launch_generation(actors, prompt_ids, seed, temperature, max_new_tokens, top_p))
