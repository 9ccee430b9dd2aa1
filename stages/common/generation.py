"""Batched sampling from a causal LM with left-padded prompts.

`decode` is the loop HF `generate` runs for sampling and greedy search (the prompt's pass, then one token
at a time from a `DynamicCache`), with HF's own warpers and the same softmax and `torch.multinomial`
draws in the same order, so it returns the tokens `generate` returns for the same seed (tested on the
CPU). What it adds: a row that has ended is dropped from the batch and the KV cache (`COMPACT_AT`), where
`generate` computes every row until the last one ends; and each token's log-prob comes out of the loop
rather than from a list of every step's logits (docs/benchmarks.md#measurements-behind-the-code)."""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from transformers import DynamicCache, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper


def sampling_config(tokenizer: PreTrainedTokenizerBase, max_new_tokens: int, temperature: float | None,
                    top_p: float = 1.0, **options) -> GenerationConfig:
    """What is sampled: greedy when `temperature` is None, else the whole temperature-scaled (top-p)
    distribution (top_k=0, not HF's default top 50), which is what a trainer's log-probs describe."""
    sampling = {"do_sample": False} if temperature is None else \
        {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    return GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, **sampling, **options)


def warpers(config: GenerationConfig) -> LogitsProcessorList:
    """The logits warpers `generate` applies for this config (temperature, then top-p), HF's own classes."""
    found = LogitsProcessorList()
    if config.do_sample and config.temperature != 1.0:
        found.append(TemperatureLogitsWarper(config.temperature))
    if config.do_sample and config.top_p < 1.0:
        found.append(TopPLogitsWarper(config.top_p))
    return found


def all_ranks_done(done: bool, device: torch.device) -> bool:
    """Under ZeRO-3 every rank's forward gathers the weights with the others: a rank whose rows have all
    ended keeps stepping until every rank's have."""
    flag = torch.tensor(0.0 if done else 1.0, device=device)
    dist.all_reduce(flag)
    return flag.item() == 0.0


# Rows that have ended are dropped from the batch (and the KV cache) once no more than this share of the
# batch is still running: a step's cost follows the rows it computes, and dropping them at every ended
# row copies the cache more often than it pays.
COMPACT_AT = 0.75


@torch.no_grad()
def decode(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig,
           *, log_probs: bool = False, lockstep: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Samples (or, with `config.do_sample` off, picks greedily) up to `config.max_new_tokens` tokens after
    each left-padded prompt. Returns the new tokens [batch, steps] (a row's tokens after its EOS are the pad
    token) and, with `log_probs`, each token's log-probability under the raw logits divided by the
    temperature (1 for greedy), which is the distribution a trainer's log-probs describe (top-p aside;
    0 after a row's EOS). `lockstep`: the ranks of a process group step together until all of them are
    done (ZeRO-3).

    The draws are `generate`'s: `torch.multinomial` takes one row of noise per batch row whatever the
    probabilities, so the ended rows, no longer computed, get a stand-in distribution and keep the
    running rows' noise where `generate` has it."""
    eos, pad, temperature = config.eos_token_id, config.pad_token_id, (config.temperature if config.do_sample else 1.0)
    warp = warpers(config)
    batch, device = input_ids.shape[0], input_ids.device
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    cache = DynamicCache(config=model.config)
    # only the last position's logits, where the model takes the argument (`generate` checks the same; a
    # PEFT model passes it on to the model it wraps)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(inner.forward).parameters else {}
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, past_key_values=cache,
                use_cache=True, **last_only)
    position = positions[:, -1:]
    rows = torch.arange(batch, device=device)  # the batch row of each row in the cache
    running = torch.ones(batch, dtype=torch.bool, device=device)  # of the rows in the cache
    tokens, token_log_probs = [], []
    for _ in range(config.max_new_tokens):
        logits = out.logits[:, -1].float()
        scores = warp(input_ids, logits)
        step = torch.full((batch,), pad, dtype=torch.long, device=device)
        if config.do_sample:
            probs = torch.zeros(batch, scores.shape[-1], device=device)
            probs[:, pad] = 1.0  # ended rows: their draw is discarded
            probs[rows] = torch.softmax(scores, dim=-1)
            chosen = torch.multinomial(probs, num_samples=1).squeeze(1)[rows]
        else:
            chosen = torch.argmax(scores, dim=-1)
        chosen = chosen.masked_fill(~running, pad)
        step[rows] = chosen
        tokens.append(step)
        if log_probs:
            lp = torch.zeros(batch, device=device)
            drawn = torch.log_softmax(logits / temperature, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
            lp[rows] = drawn.masked_fill(~running, 0.0)
            token_log_probs.append(lp)
        running = running & (chosen != eos)
        done = not bool(running.any())
        if (all_ranks_done(done, device) if lockstep else done) or len(tokens) == config.max_new_tokens:
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(rows), 1)], dim=-1)
        position = position + 1
        if not done and int(running.sum()) <= COMPACT_AT * len(rows):
            keep = running.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, running, chosen = rows[keep], running[keep], chosen[keep]
            attention_mask, position = attention_mask[keep], position[keep]
        out = model(input_ids=chosen[:, None], attention_mask=attention_mask, position_ids=position,
                    past_key_values=cache, use_cache=True, **last_only)
    new = torch.stack(tokens, dim=1)
    return new, (torch.stack(token_log_probs, dim=1) if log_probs else None)


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id prompts as one left-padded batch: (input_ids, attention_mask)."""
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return input_ids, attention_mask


def until_eos(row: list[int], eos: int, pad: int) -> list[int]:
    """A generated row up to and including its EOS; without one, the row less any padding."""
    return row[: row.index(eos) + 1] if eos in row else [t for t in row if t != pad]


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
    lockstep: bool = False,
) -> list[list[int]]:
    """The generated token ids per prompt, stopped at (and including) EOS, without padding.
    `lockstep`: the ranks of a process group step together (ZeRO-3)."""
    model.eval()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = sampling_config(tokenizer, max_new_tokens, temperature if do_sample else None, top_p)
    outputs: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        ids = tokenizer(prompts[i : i + batch_size], add_special_tokens=False)["input_ids"]
        input_ids, attention_mask = left_padded(ids, pad)
        new, _ = decode(model, input_ids.to(model.device), attention_mask.to(model.device), config, lockstep=lockstep)
        outputs.extend(until_eos(row, eos, pad) for row in new.tolist())
    return outputs
