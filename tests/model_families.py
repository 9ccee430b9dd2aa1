"""Small random-init checkpoints of the model families users bring, for tests and benchmarks: Llama-3
(GQA, untied embeddings, the template adds BOS, no pad token), Qwen2 (q/k/v bias, tied embeddings,
ChatML with a default system prompt, pad != eos, a vocabulary padded past the tokenizer's), Mistral
(sliding window, the system prompt folded into the first user turn, no pad token) and Mixtral (MoE).

Each gets a byte-level BPE tokenizer trained on `corpus` with its family's special tokens and the
shape of its real chat template. No hub: everything is built from config objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

MISTRAL_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported!') }}"
    "{%- endif %}"
    "{%- endfor %}"
)

SIZE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512}


@dataclass(frozen=True)
class Family:
    config_class: type
    model_class: type
    template: str
    special: dict[str, str]  # tokenizer attribute (bos_token, eos_token, ...) -> token
    extra_special: tuple[str, ...] = ()
    bos_post_processor: bool = False  # add_special_tokens=True prepends BOS (templates add it themselves)
    vocab_multiple: int = 1  # the model's vocabulary padded to a multiple of this (Qwen2 pads past the tokenizer)
    config: dict = field(default_factory=dict)


FAMILIES: dict[str, Family] = {
    "llama3": Family(
        LlamaConfig, LlamaForCausalLM, LLAMA3_TEMPLATE,
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ("<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"),
        bos_post_processor=True,
        config={"tie_word_embeddings": False, "rope_theta": 500000.0},
    ),
    "qwen2": Family(
        Qwen2Config, Qwen2ForCausalLM, CHATML_TEMPLATE,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        ("<|im_start|>",),
        vocab_multiple=64,
        config={"tie_word_embeddings": True, "use_sliding_window": False},
    ),
    "mistral": Family(
        MistralConfig, MistralForCausalLM, MISTRAL_TEMPLATE,
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        ("[INST]", "[/INST]"),
        bos_post_processor=True,
        config={"tie_word_embeddings": False, "sliding_window": 8},
    ),
    "mixtral": Family(
        MixtralConfig, MixtralForCausalLM, MISTRAL_TEMPLATE,
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        ("[INST]", "[/INST]"),
        bos_post_processor=True,
        config={"tie_word_embeddings": False, "sliding_window": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
                "router_aux_loss_coef": 0.02},
    ),
}


def train_tokenizer(family: Family, corpus: list[str], vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """Byte-level BPE (every byte a token, so any text encodes) with the family's special tokens."""
    specials = [*family.special.values(), *family.extra_special]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    if family.bos_post_processor:
        bos = family.special["bos_token"]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **family.special,
                                   additional_special_tokens=list(family.extra_special))
    fast.chat_template = family.template
    return fast


def save_family_checkpoint(family: str, out_dir: Path, corpus: list[str], seed: int = 0, size: dict | None = None,
                           vocab_size: int = 300) -> Path:
    """A random-init checkpoint of `family` (a key of FAMILIES) with its tokenizer, saved to `out_dir`;
    `size` overrides the test size (SIZE) for a model that should learn something."""
    spec = FAMILIES[family]
    tok = train_tokenizer(spec, corpus, vocab_size)
    vocab = -(-len(tok) // spec.vocab_multiple) * spec.vocab_multiple
    ids = {f"{name.removesuffix('_token')}_token_id": tok.convert_tokens_to_ids(token) for name, token in spec.special.items()
           if name in ("bos_token", "eos_token", "pad_token")}
    config = spec.config_class(vocab_size=vocab, **(SIZE | (size or {})), **ids, **spec.config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = spec.model_class(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir
