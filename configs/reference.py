"""The config reference (docs/config-reference.md), generated from the schema so it cannot drift:

    python -m configs.reference > docs/config-reference.md

One table per section: each key with its type, its default and the field's description. Defaults are
those of a config that states nothing (`PipelineConfig()`), so a section whose default differs by
where it sits (`rl.actor.lr` and `rl.critic.lr`) shows each. Sections that are the same wherever they
sit (every `lora`) are shown once, under all their paths.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass, field

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from configs.registry import Registry
from configs.schema import PipelineConfig, section_type

COMMAND = "python -m configs.reference > docs/config-reference.md"

INTRO = f"""\
# Config reference

<!-- Generated from configs/schema.py by `{COMMAND}`; edit the schema, not this file. -->

A config is YAML validated by one typed schema (`configs/schema.py`, pydantic); an unknown key or a
value of the wrong type is a one-line error before any work. A config file may start with `base: tiny`
(a preset name, or a `.yaml` path beside it) and state only what differs; sections merge key by key.
`rlhf run KEY=VALUE ...` overrides single keys (`sft.lr=3e-4`, `infra.stage_retries='{{rl: 4}}'`).

The defaults below are the schema's, meant for a pretrained model (the learning rates of OpenRLHF's
example scripts); the presets in `configs/` (`tiny.yaml`, the GPU presets) state their own. "empty"
is YAML's `null`, or leaving the key out.
"""


@dataclass
class Section:
    cls: type[BaseModel]
    value: BaseModel | None  # the default instance; None for an optional section that is unset by default
    paths: list[str] = field(default_factory=list)


def type_name(annotation) -> str:
    """A field's type as a reader says it: `int`, `str or empty`, `one of: k1, k2, k3`, `list of str`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "empty"
    if origin is typing.Annotated:
        return type_name(args[0]) + constraints(args[1:])
    if origin is typing.Literal:
        return one_of(args)
    if origin in (typing.Union, types.UnionType):
        named = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or empty" if type(None) in args else "")
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is tuple:
        return "(" + ", ".join(type_name(a) for a in args) + ")"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    return getattr(annotation, "__name__", str(annotation))


def one_of(values) -> str:
    """A Literal's values, or a registry's names (`Annotated[str, ESTIMATORS]`)."""
    return "one of: " + ", ".join(str(v) for v in values)


def constraints(metadata) -> str:
    """`gt=0, le=1` as ` > 0, ≤ 1`."""
    bounds = {annotated_types.Gt: ("gt", ">"), annotated_types.Ge: ("ge", "≥"), annotated_types.Lt: ("lt", "<"),
              annotated_types.Le: ("le", "≤")}
    parts = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            parts.append(constraints(item.metadata).strip())
        elif type(item) in bounds:
            attr, sign = bounds[type(item)]
            parts.append(f"{sign} {getattr(item, attr)}")
        elif isinstance(item, annotated_types.MinLen):
            parts.append(f"at least {item.min_length}")
    parts = [p for p in parts if p]
    return " " + ", ".join(parts) if parts else ""


def default_text(info: FieldInfo, value, section_unset: bool) -> str:
    if section_unset:
        if info.is_required():
            return "required"
        value = info.get_default(call_default_factory=True)
    if value is None:
        return "empty"
    dumped = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    return "`" + json.dumps(dumped, ensure_ascii=False) + "`"


def description(cls: type[BaseModel], name: str) -> str:
    """The field's description, or that of the field it overrides (`SFTConfig.lr` restates `OptimConfig.lr`'s
    default, not its meaning)."""
    for klass in cls.__mro__:
        info = getattr(klass, "model_fields", {}).get(name)
        if info is not None and info.description:
            return info.description
    return ""


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def collect(cls: type[BaseModel], value: BaseModel | None, path: str, sections: dict[str, Section]) -> None:
    """Every section under `cls` (at `path`), depth first, the same class and defaults merged."""
    key = f"{cls.__qualname__}:{json.dumps(value.model_dump(mode='json'), sort_keys=True) if value is not None else None}"
    if key in sections:
        sections[key].paths.append(path)
        return
    sections[key] = Section(cls, value, [path])
    for name, info in cls.model_fields.items():
        sub = section_type(info.annotation)
        if sub is not None:
            collect(sub, getattr(value, name) if value is not None else None, f"{path}.{name}".lstrip("."), sections)


def section_table(section: Section) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    unset = section.value is None
    for name, info in section.cls.model_fields.items():
        sub = section_type(info.annotation)
        if sub is not None:
            prefix = section.paths[0] + "." if section.paths[0] else ""
            default = "empty" if getattr(section.value, name, None) is None else ""
            about = description(section.cls, name)
            rows.append(f"| `{name}` | section | {default} | {cell(about) + '; ' if about else ''}see `{prefix}{name}` |")
            continue
        value = None if unset else getattr(section.value, name)
        kind = next((one_of(m) for m in info.metadata if isinstance(m, Registry)), None) or type_name(info.annotation)
        optional = kind.endswith(" or empty")
        kind = kind.removesuffix(" or empty") + constraints(info.metadata) + (" or empty" if optional else "")
        rows.append(f"| `{name}` | {cell(kind)} | {cell(default_text(info, value, unset))} | "
                    f"{cell(description(section.cls, name))} |")
    return rows


def reference() -> str:
    sections: dict[str, Section] = {}
    collect(PipelineConfig, PipelineConfig(), "", sections)
    lines = [INTRO]
    for section in sections.values():
        title = ", ".join(f"`{p}`" for p in section.paths) if section.paths[0] else "Top level"
        lines += [f"## {title}", ""]
        if section.cls.__doc__:
            lines += [" ".join(section.cls.__doc__.split()), ""]
        lines += [*section_table(section), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference(), end="")
