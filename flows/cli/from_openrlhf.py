"""`rlhf from-openrlhf SCRIPT`: an OpenRLHF launch script as a commented config of this project.

The script's trainer call is read (configs/from_openrlhf/script.py), its flags mapped by the table
(configs/from_openrlhf/flags.py, configs/from_openrlhf/convert.py); a loop recipe's batch_inference steps
and loop become its stage's keys (configs/from_openrlhf/loops.py, configs/from_openrlhf/recipes.py);
`--set KEY=VALUE` applied as `rlhf run` applies overrides, and the result loaded as `rlhf run --config`
would load it before it is printed or written: a config that does not load is one `error:` line, not a file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from configs.errors import ConfigError
from configs.from_openrlhf.convert import Conversion, convert, listed, set_comment
from configs.from_openrlhf.loops import read_recipe
from configs.from_openrlhf.recipes import convert_recipe
from configs.from_openrlhf.script import MAX_SCRIPT_CHARS, read_call
from configs.loader import load_config, parse_override, set_dotted
from configs.schema import PipelineConfig, section_type
from stages.dag import declaration as dag
from stages.dag.plan import plan

COMMENT_COLUMN = 56  # trailing comments line up here, or after the longest line up to it


def read_script(script: str) -> tuple[str, str]:
    """The script's text and the name errors give it (`-`: standard input)."""
    if script == "-":
        return sys.stdin.read(MAX_SCRIPT_CHARS + 1), "<stdin>"  # one more: read_call names the excess
    path = Path(script)
    if not path.is_file():
        raise ConfigError(f"{script}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(MAX_SCRIPT_CHARS + 1), script
    except UnicodeDecodeError:
        raise ConfigError(f"{script}: not a text file") from None


def converted(text: str, origin: str, sets: Sequence[str] = (), out_name: str = "my.yaml") -> tuple[str, Conversion]:
    """The config text for the script `text` (checked by loading it) and the conversion it renders."""
    parsed = [(*parse_override(text), text) for text in sets]
    recipe = read_recipe(text, origin)
    conversion = convert_recipe(recipe, origin, parsed) if recipe else convert(read_call(text, origin), origin, parsed)
    tree: dict[str, Any] = {}
    comments: dict[str, str] = dict(conversion.notes)
    for key, setting in conversion.settings.items():
        set_dotted(tree, key, setting.value, PipelineConfig, key)
        if setting.source:
            comments[key] = setting.source
    for key, _, override in parsed:
        applied = conversion.settings.get(key)
        if applied is None or applied.kind != "set":  # not applied already, before the datasets were derived
            apply_set(tree, comments, override)
    body = [*parked(conversion), *render(tree, comments)]
    cfg = load("\n".join(body) + "\n", origin)
    final = "\n".join([*header(conversion, cfg, out_name), "", *body, "", *footer(conversion)]) + "\n"
    load(final, origin)
    return final, conversion


def apply_set(tree: dict[str, Any], comments: dict[str, str], text: str) -> None:
    """`--set KEY=VALUE`, parsed and checked as `rlhf run`'s overrides; its comment says so."""
    key, value = parse_override(text)
    set_dotted(tree, key, value, PipelineConfig, f"--set {text!r}")
    earlier = comments.get(key, "")
    for path in [p for p in comments if p.startswith(key + ".")]:
        del comments[path]
    comments[key] = set_comment(text, earlier)


def load(text: str, origin: str) -> PipelineConfig:
    """`text` as `rlhf run --config` loads it; a failure names the script."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        return load_config(f.name, [])
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(f.name, f"{origin} (converted)")) from None
    finally:
        os.unlink(f.name)


def scalar(value: object) -> str:
    """A value as one line of YAML."""
    if isinstance(value, str) and any(c in value for c in "\n\t\r"):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a YAML double-quoted one
    if isinstance(value, tuple):
        value = list(value)
    return yaml.safe_dump([value], default_flow_style=True, width=10**6, allow_unicode=True).strip()[1:-1]


def ordered(tree: dict[str, Any], schema: type[BaseModel] | None) -> list[str]:
    """The keys in the schema's order (the config reference's), others (pinned inputs) as they came."""
    fields = list(schema.model_fields) if schema is not None else []
    return sorted(tree, key=lambda k: fields.index(k) if k in fields else len(fields))


def render(tree: dict[str, Any], comments: dict[str, str]) -> list[str]:
    """Block YAML of `tree`, each key's comment beside it, sections in the schema's order."""
    out: list[tuple[str, str]] = []

    def walk(node: dict[str, Any], schema: type[BaseModel] | None, prefix: str, depth: int) -> None:
        for key in ordered(node, schema):
            value, path = node[key], prefix + key
            indent = "  " * depth
            if isinstance(value, dict) and value:
                out.append((f"{indent}{key}:", comments.get(path, "")))
                sub = section_type(schema.model_fields[key].annotation) if schema and key in schema.model_fields else None
                walk(value, sub, path + ".", depth + 1)
            else:
                out.append((f"{indent}{key}: {scalar(value)}", comments.get(path, "")))
            if depth == 0:
                out.append(("", ""))

    walk(tree, PipelineConfig, "", 0)
    column = min(COMMENT_COLUMN, max((len(t) for t, c in out if c), default=0) + 2)
    lines = [f"{t.ljust(column - 1)} # {c}".replace("\n", "\\n") if c else t for t, c in out]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def parked(c: Conversion) -> list[str]:
    """Pins the schema does not take yet, commented out where `inputs:` would be."""
    if not c.parked:
        return []
    return ["# inputs:", *(f"#   {key.removeprefix('inputs.')}: {scalar(s.value)}   # {s.source}" for key, s in c.parked.items()), ""]


def launcher(words: list[str]) -> str:
    """`ray job submit ... -- python3 -m`: the programs that launch the trainer, their options elided."""
    if not words:
        return ""
    head = [Path(words[0]).name]
    for word in words[1:3]:  # subcommands: `ray job submit`
        if word.startswith("-"):
            break
        head.append(word)
    if "--" in words:
        return f"{' '.join(head)} ... -- {' '.join(words[len(words) - words[::-1].index('--'):])}"
    rest = words[len(head):]
    if not rest:
        return " ".join(head)
    return " ".join(head) + (" ... " if len(rest) > 1 else " ") + rest[-1]


def header(c: Conversion, cfg: PipelineConfig, out_name: str) -> list[str]:
    launched = launcher(c.call.launcher)
    mapped = sum(1 for s in c.settings.values() if s.kind == "flag")
    called = f"{c.recipe}" if c.recipe else f"{c.trainer.name} (line {c.call.line}"
    lines = [
        f"# Converted by `rlhf from-openrlhf` from {c.origin}: OpenRLHF's {called}"
        + ("" if c.recipe else (f", launched by `{launched}`" if launched else "") + ")") + ",",
        f"# {c.generation}.",
        f"# Beside each key, the flag it came from ({plural(mapped, 'key')} from flags); at the end, "
        f"{plural(len(c.skipped), 'flag')} not mapped and why.",
        "#",
        f"# Stages of `rlhf run --config {out_name}`:",
    ]
    planned = plan(cfg)
    width = max(len(name) for name in planned) + 2
    for name, step in planned.items():
        mine = f" (the script's {c.source_name})" if name == c.trainer.stage else ""
        lines.append(f"#   {name.ljust(width)}{step.line()}{mine}")
    alone = dag.needed_by({c.trainer.stage}, cfg) | {c.trainer.stage}
    script = "-" if c.origin == "<stdin>" else c.origin
    only = ",".join(spec.name for spec in dag.STAGES if spec.name in alone)
    lines.append(f"# The script's stage alone: rlhf run --config {out_name} --only {only}")
    models = [key for key in ("model.name_or_path", "inputs.sft_model", "inputs.reward_model") if key in c.settings]
    if models:
        lines.append(f"# Local copies of its models, smaller sizes: rlhf from-openrlhf {script} "
                     + " ".join(f"--set {key}=DIR" for key in models) + " --set KEY=VALUE ...")
    return lines


def footer(c: Conversion) -> list[str]:
    if not c.skipped:
        return ["# Not mapped: none"]
    return [f"# Not mapped ({len(c.skipped)}):", *(f"#   {listed(s)}" for s in sorted(c.skipped, key=lambda s: s.flag.line))]


def run(script: str, out: str | None, sets: list[str]) -> str:
    """Convert `script`; write the config to `out` (None: return it for stdout). Returns a one-line summary."""
    text, origin = read_script(script)
    config, conversion = converted(text, origin, sets, out or "my.yaml")
    if out is None:
        sys.stdout.write(config)
    else:
        Path(out).write_text(config)
    mapped = sum(1 for s in conversion.settings.values() if s.kind == "flag")
    return (f"{origin}: OpenRLHF's {conversion.source_name} -> {out or 'stdout'}: {plural(mapped, 'key')} from its flags, "
            f"{plural(len(conversion.skipped), 'flag')} not mapped (listed at the end)")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
