"""Load a YAML preset, apply dotted command-line overrides, validate against the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from configs.errors import ConfigError
from configs.schema import PipelineConfig, moved_key, section_type

PRESET_DIR = Path(__file__).parent
DEFAULT_PRESET = "tiny"


def preset_path(name_or_path: str | None) -> Path:
    """A preset name (`tiny`) or a path to a YAML file."""
    name = name_or_path or DEFAULT_PRESET
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        return path
    packaged = PRESET_DIR / f"{name}.yaml"
    if not packaged.is_file():
        known = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
        raise ConfigError(f"{name}: no such preset (known: {', '.join(known)}) and not a .yaml path")
    return packaged


def set_dotted(tree: dict, dotted: str, value: Any, model: type[BaseModel], origin: str) -> None:
    """Set `a.b.c=value` in a nested dict, refusing keys the schema does not have."""
    keys = dotted.split(".")
    node = tree
    schema: type[BaseModel] | None = model  # None below a field that is not a section: keys unchecked there
    for i, key in enumerate(keys):
        fields = schema.model_fields if schema is not None else {}
        if schema is not None and key not in fields:
            moved = moved_key(".".join(keys[: i + 1]))
            if moved:
                raise ConfigError(f"{origin}: {'.'.join(keys[: i + 1])} is now {moved}{'.'.join(['', *keys[i + 1:]])}")
            raise ConfigError(f"{origin}: unknown key {'.'.join(keys[: i + 1])!r} (expected one of: {', '.join(fields)})")
        if i == len(keys) - 1:
            node[key] = value
            return
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
        schema = section_type(fields[key].annotation) if schema is not None else None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> `{"a.b": value}`: a config's leaves by their dotted keys (MLflow params, override checks)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def get_dotted(tree: Any, key: str) -> Any:
    """The value at `a.b.c` of a nested dict; None where a part is missing."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def parse_override(text: str) -> tuple[str, Any]:
    """`sft.lr=3e-4` -> ("sft.lr", "3e-4" parsed as YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. sft.lr=3e-4")
    try:
        value = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc.problem})") from None
    return key.strip(), value


def read_preset(path: str | None, seen: tuple[Path, ...] = ()) -> tuple[dict, Path, tuple[Path, ...]]:
    """A preset's mapping with its `base:` (a preset name or a YAML path beside it) merged underneath:
    the file states only what differs from its base. Each file's keys are checked, naming that file. Also
    the file and its bases, resolved, the file first."""
    file = preset_path(path)
    if file.resolve() in seen:
        raise ConfigError(f"{file}: base: leads back to itself ({' -> '.join(str(p) for p in (*seen, file))})")
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: expected a mapping of sections at the top level")
    base = raw.pop("base", None)
    chain: tuple[Path, ...] = (file.resolve(),)
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{file}: base: expected a preset name (e.g. tiny) or a .yaml path")
        beside = file.parent / base
        parent, _, bases = read_preset(str(beside) if beside.suffix in (".yaml", ".yml") and beside.is_file() else base,
                                       (*seen, file.resolve()))
        chain += bases
        raw = without_task_answers(merged(parent, raw), source(parent), "answer_pattern" in (raw.get("eval") or {}))
    try:
        PipelineConfig.model_validate(raw)  # the file's own keys first, so an error names it, not an override
    except ValidationError as exc:
        raise ConfigError(_describe(exc, str(file))) from None
    return raw, file, chain


# the synthetic task's answer format: a config that brings its own files does not inherit it
TASK_ANSWER_KEYS = ("answer_pattern",)


def source(raw: dict) -> str:
    return (raw.get("data") or {}).get("source", "synthetic")


def without_task_answers(raw: dict, before: str, stated: bool) -> dict:
    """`raw` whose data became `files` (it was `before`) without the synthetic task's eval answer pattern,
    unless the config `stated` one: the arithmetic regex would score every file's answers as wrong."""
    if before != "synthetic" or source(raw) != "files" or stated or not isinstance(raw.get("eval"), dict):
        return raw
    raw = dict(raw)
    raw["eval"] = {k: v for k, v in raw["eval"].items() if k not in TASK_ANSWER_KEYS}
    if raw["eval"].get("metric") in ("accuracy", "sampled_accuracy"):
        raw["eval"] = {k: v for k, v in raw["eval"].items() if k != "metric"}
    return raw


def merged(base: dict, override: dict) -> dict:
    """`override` over `base`, section by section (a list or value replaces the base's whole)."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> PipelineConfig:
    """Validate a preset (over its base) plus overrides; every error names the file or override and the key."""
    raw, file, chain = read_preset(path)

    origins: dict[str, str] = {}
    before = source(raw)
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(raw, key, value, PipelineConfig, f"override {text!r}")
        origins[key] = f"override {text!r}"
    raw = without_task_answers(raw, before, "eval.answer_pattern" in origins)
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        loc = ".".join(str(p) for p in exc.errors()[0]["loc"])
        # the newest override at, above or below the failing key (a section-level check fails at the section)
        related = [o for k, o in origins.items() if k == loc or k.startswith(loc + ".") or loc.startswith(k + ".")]
        origin = related[-1] if related else str(file)
        raise ConfigError(_describe(exc, origin)) from None
    require_model(cfg, chain, origins.get("model.name_or_path", origins.get("model", str(file))))
    return cfg


def require_model(cfg: PipelineConfig, chain: tuple[Path, ...], origin: str) -> None:
    """A config of data files names the model it trains: the tiny model is built only for a config based on the
    tiny preset (`base: tiny`), whose data it was made for; anywhere else an empty `model.name_or_path` is a
    model left out (a converted script whose model flag was not read, say), not a wish for the tiny one."""
    if cfg.data.source == "files" and cfg.model.name_or_path is None and preset_path(DEFAULT_PRESET).resolve() not in chain:
        raise ConfigError(f"{origin}: model.name_or_path: missing: a config of data files names the model to train "
                          "(a hub id or a local HF checkpoint); only a config with base: tiny builds the tiny model")


def _describe(exc: ValidationError, origin: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        schema: type[BaseModel] | None = PipelineConfig
        for part in err["loc"][:-1]:
            if schema is not None and isinstance(part, str) and part in schema.model_fields:
                schema = section_type(schema.model_fields[part].annotation)
        expected = f" (expected one of: {', '.join(schema.model_fields)})" if schema is not None else ""
        return f"{origin}: unknown key {loc!r}{expected}"
    got = err.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    where = f"{origin}: {loc}" if loc else origin  # a check across sections names its fields itself
    return f"{where}: {err['msg']}{shown}"
