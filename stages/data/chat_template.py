"""`data.tokenizer_chat_template`: a Jinja chat template that replaces the tokenizer's for every dataset
(OpenRLHF's --tokenizer_chat_template). Data prep saves it with the base model's tokenizer, so every
later stage, and every checkpoint they export, renders prompts with it.

The value is the template itself, or a file holding one: text with `{{` or `{%` is a template, anything
else a path. Nothing here imports transformers: the flow's driver checks the template before any work.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from configs.errors import ConfigError
from configs.schema import FILE_DATASETS, PipelineConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


KEY = "data.tokenizer_chat_template"
TEMPLATE_MARKS = ("{{", "{%")
# the datasets whose prompts a chat template renders (a PRM row is read as written)
PROMPTED_SECTIONS = tuple(section for section in FILE_DATASETS if section != "prm")


def is_template(value: str) -> bool:
    return any(mark in value for mark in TEMPLATE_MARKS)


def names_a_file(cfg: PipelineConfig) -> bool:
    """The key names a file (its content then counts in data prep's fingerprint)."""
    value = cfg.data.tokenizer_chat_template
    return value is not None and not is_template(value)


def template_text(value: str) -> str:
    """The template `value` is or names; a ConfigError names the key when there is none."""
    if is_template(value):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"{KEY}={value}: no such file, and not a Jinja template (a template holds {{{{ or {{%)")
    text = path.read_text(encoding="utf-8")
    if not is_template(text):
        raise ConfigError(f"{KEY}={value}: the file holds no Jinja template (no {{{{ or {{%)")
    return text


def check(cfg: PipelineConfig) -> None:
    """The template is found and parses as Jinja (transformers renders it in a sandboxed Jinja environment)."""
    value = cfg.data.tokenizer_chat_template
    if value is None:
        return
    import jinja2

    try:
        jinja2.Environment().parse(template_text(value))
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{KEY}: not a valid Jinja template (line {exc.lineno}: {exc.message})") from None


def apply(tokenizer: PreTrainedTokenizerBase, cfg: PipelineConfig) -> bool:
    """Replace `tokenizer`'s chat template with the configured one; True when it did."""
    value = cfg.data.tokenizer_chat_template
    if value is None:
        return False
    check(cfg)
    tokenizer.chat_template = template_text(value)
    try:  # a template that parses can still fail on a plain conversation (an undefined variable, a raise)
        tokenizer.apply_chat_template([{"role": "user", "content": "1+1"}], tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja2 raises many types, and templates raise their own
        raise ConfigError(f"{KEY}: cannot render a one-turn conversation ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return True


def warnings(cfg: PipelineConfig) -> list[str]:
    """One line per dataset whose `input_template` the configured chat template overrides: OpenRLHF applies
    an input template only with apply_chat_template off, so the chat template wins (not an error: a
    converted script often carries both)."""
    if cfg.data.tokenizer_chat_template is None:
        return []
    lines = []
    for name in PROMPTED_SECTIONS:
        section = getattr(cfg.data, name)
        if section is None or not section.input_template or not section.apply_chat_template:
            continue
        if name == "sft" and cfg.sft.pretrain_mode:
            continue  # plain text: neither template is used
        lines.append(f"warning: data.{name}.input_template is not used: {KEY} renders the prompts of data.{name} "
                     f"(apply_chat_template is on); set data.{name}.apply_chat_template=false to use the input template")
    return lines
