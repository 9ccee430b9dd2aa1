"""Batched generation with HF `generate` (left-padded prompts)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
    outputs: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(model.device) for k, v in enc.items()}
        # top_k=0: sample from the whole (temperature-scaled, top-p) distribution, not HF's default top 50
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if do_sample else {"do_sample": False}
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos, **sampling, **generate_kwargs
        )
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            outputs.append(row[: row.index(eos) + 1] if eos in row else [t for t in row if t != tokenizer.pad_token_id])
    return outputs
