"""The tiny preset's own tokenizer (trained with `tokenizers`) and Llama-style base model."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from configs.schema import TinyArchitecture

PAD, UNK, BOS, EOS = "<|pad|>", "<|unk|>", "<|bos|>", "<|end|>"
USER, ASSISTANT, SYSTEM = "<|user|>", "<|assistant|>", "<|system|>"
STEP = "<|step|>"  # the PRM's step placeholder
SPECIAL_TOKENS = [PAD, UNK, BOS, EOS, USER, ASSISTANT, SYSTEM, STEP]

# One turn per block; an assistant turn ends with EOS so SFT teaches the model to stop.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ '<|end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A small BPE whose digits stay single tokens (so arithmetic is learnable) and whose decode is lossless."""
    tok = Tokenizer(models.BPE(unk_token=UNK))
    # Split into single digits, runs of whitespace, and runs of everything else; BPE merges within them.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d|\s+|[^\d\s]+"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        additional_special_tokens=[USER, ASSISTANT, SYSTEM, STEP],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"  # generation pads on the left; training collators pad explicitly
    return fast


def build_model(cfg: TinyArchitecture, tokenizer: PreTrainedTokenizerBase, seed: int) -> LlamaForCausalLM:
    """A randomly initialised Llama; `seed` makes the init reproducible."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
