"""Batched generation with HF `generate` (left-padded prompts)."""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase


class Generates(Protocol):
    """A causal LM (or peft's wrapper of one): PreTrainedModel alone does not declare `generate`, its
    GenerationMixin does."""

    def generate(self, *args: Any, **kwargs: Any) -> torch.Tensor: ...


def sampling_config(tokenizer: PreTrainedTokenizerBase, max_new_tokens: int, temperature: float | None,
                    top_p: float = 1.0, **options) -> GenerationConfig:
    """What `generate` samples with: greedy when `temperature` is None, else the whole temperature-scaled
    (top-p) distribution (top_k=0, not HF's default top 50), which is what a trainer's log-probs describe.
    Passed to `generate` whole: without one, every call rebuilds the model's config to check it for
    legacy generation settings (a sizeable share of a small model's rollout time)."""
    sampling = {"do_sample": False} if temperature is None else \
        {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    return GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, **sampling, **options)


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    batch_size: int,
    max_new_tokens: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    **generate_kwargs,
) -> list[list[int]]:
    """The generated token ids per prompt, stopped at (and including) EOS, without padding.
    `generate_kwargs` go to `model.generate` (e.g. `synced_gpus` under ZeRO-3)."""
    model.eval()
    tokenizer.padding_side = "left"
    eos = tokenizer.eos_token_id
    config = sampling_config(tokenizer, max_new_tokens, temperature if do_sample else None, top_p)
    outputs: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(model.device) for k, v in enc.items()}
        out = cast(Generates, model).generate(**enc, generation_config=config, **generate_kwargs)
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            outputs.append(row[: row.index(eos) + 1] if eos in row else [t for t in row if t != tokenizer.pad_token_id])
    return outputs
