"""configs/reference.py: docs/config-reference.md is what the schema generates now, with every key and its default."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel

from configs.reference import COMMAND, reference
from configs.schema import PipelineConfig, section_type

DOC = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"


def test_the_docs_page_is_what_the_schema_generates():
    assert DOC.read_text() == reference(), f"docs/config-reference.md is stale: run `{COMMAND}`"


def leaves(cls: type[BaseModel], value, prefix: str = "") -> dict[str, object]:
    """Every key of the schema as `{"rl.actor.lr": default}`; keys of an unset section map to `unset`."""
    found = {}
    for name, info in cls.model_fields.items():
        path = prefix + name
        sub = section_type(info.annotation)
        if sub is not None:
            found |= leaves(sub, None if value is None else getattr(value, name), path + ".")
        else:
            found[path] = "unset" if value is None else getattr(value, name)
    return found


def documented(text: str) -> dict[str, str]:
    """`{"rl.actor.lr": "`5e-07`"}`: each row's key under each path its section's heading names."""
    rows, paths = {}, [""]
    for line in text.splitlines():
        if line.startswith("## "):
            paths = re.findall(r"`([^`]+)`", line) or [""]
        elif (m := re.match(r"\| `(\w+)` \| ((?:[^|\\]|\\.)+) \| ((?:[^|\\]|\\.)*) \|", line)) and m[2].strip() != "section":
            rows |= {f"{p}.{m[1]}".lstrip("."): m[3].strip().replace("\\|", "|") for p in paths}
    return rows


def test_every_key_is_documented_with_the_default_it_has_where_it_sits():
    schema = leaves(PipelineConfig, PipelineConfig())
    rows = documented(reference())
    assert sorted(rows) == sorted(schema)
    for path, value in schema.items():
        if value != "unset":
            plain = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            assert rows[path] == ("empty" if value is None else f"`{json.dumps(plain, ensure_ascii=False)}`"), path
    # a default that depends on where the section sits is shown at each place
    assert (rows["rl.actor.lr"], rows["rl.critic.lr"]) == ("`5e-07`", "`9e-06`")
    assert rows["data.sft.paths"] == "required"
