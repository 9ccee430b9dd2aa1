"""artifacts/fingerprint.py: config subsets, flattening, code versions and stage fingerprints."""

from __future__ import annotations

import hashlib
import json
import sys
import uuid

import pytest

from artifacts import fingerprint as fp
from artifacts.fingerprint import code_version, config_subset, fingerprint, flatten
from configs.loader import load_config
from configs.schema import PipelineConfig

BASE = dict(
    stage="sft",
    config={"seed": 42, "sft": {"lr": 0.001, "epochs": 1}, "infra.zero_stage": 2},
    inputs={"base_model": "run-a/base_model", "sft_data": "run-a/sft_data"},
    code="0123456789abcdef",
)


# --- fingerprint ---------------------------------------------------------------------------


def test_fingerprint_is_deterministic_and_short_hex():
    a = fingerprint(**BASE)
    assert a == fingerprint(**BASE)
    assert len(a) == 20
    assert re_hex(a)


def test_fingerprint_exact_value():
    payload = json.dumps(
        {"code": BASE["code"], "config": BASE["config"], "inputs": BASE["inputs"], "stage": "sft"}, sort_keys=True
    )
    assert fingerprint(**BASE) == hashlib.sha256(payload.encode()).hexdigest()[:20]


def test_fingerprint_ignores_dict_key_order():
    reordered = dict(
        stage="sft",
        config={"infra.zero_stage": 2, "sft": {"epochs": 1, "lr": 0.001}, "seed": 42},
        inputs={"sft_data": "run-a/sft_data", "base_model": "run-a/base_model"},
        code="0123456789abcdef",
    )
    assert list(reordered["config"]) != list(BASE["config"])
    assert fingerprint(**reordered) == fingerprint(**BASE)


@pytest.mark.parametrize(
    "change",
    [
        {"stage": "eval"},
        {"config": {"seed": 43, "sft": {"lr": 0.001, "epochs": 1}, "infra.zero_stage": 2}},
        {"config": {"seed": 42, "sft": {"lr": 0.002, "epochs": 1}, "infra.zero_stage": 2}},
        {"config": {"seed": 42, "sft": {"lr": 0.001, "epochs": 1}, "infra.zero_stage": 3}},
        {"config": {"seed": 42, "sft": {"lr": 0.001, "epochs": 1}}},
        {"inputs": {"base_model": "run-b/base_model", "sft_data": "run-a/sft_data"}},
        {"inputs": {"base_model": "run-a/base_model"}},
        {"code": "0123456789abcdee"},
    ],
    ids=["stage", "seed", "nested", "dotted", "dropped_key", "input_id", "dropped_input", "code"],
)
def test_fingerprint_changes_with_any_part(change):
    assert fingerprint(**{**BASE, **change}) != fingerprint(**BASE)


def test_fingerprint_distinguishes_value_types():
    a = fingerprint("s", {"x": 1}, {}, "c")
    assert fingerprint("s", {"x": "1"}, {}, "c") != a
    assert fingerprint("s", {"x": 1.5}, {}, "c") != a


def re_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


# --- config_subset -------------------------------------------------------------------------

SFT_DEFAULTS = {
    "lr": 5e-6,
    "min_lr_ratio": 0.1,
    "warmup_ratio": 0.05,
    "weight_decay": 0.0,
    "epochs": 1,
    "max_steps": None,
    "micro_batch_size": 32,
    "grad_accum_steps": 1,
    "grad_clip": 1.0,
    "gradient_checkpointing": False,
    "eval_every": 50,
    "save_every": 50,
    "aux_loss_coef": 0.0,
    "lora": {"rank": 0, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear", "load_in_4bit": False},
    "packing": False,
}


def test_config_subset_of_defaults():
    got = config_subset(PipelineConfig(), ("seed", "infra.zero_stage", "model.attn_implementation", "sft"))
    assert got == {
        "seed": 42,
        "infra.zero_stage": 2,
        "model.attn_implementation": "auto",
        "sft": SFT_DEFAULTS,
    }
    assert list(got) == ["seed", "infra.zero_stage", "model.attn_implementation", "sft"]


def test_config_subset_deep_key_and_none():
    cfg = PipelineConfig()
    assert config_subset(cfg, ("model.tiny.hidden_size", "model.name_or_path", "data.sft")) == {
        "model.tiny.hidden_size": 128,
        "model.name_or_path": None,
        "data.sft": None,
    }


def test_config_subset_follows_overrides_and_is_json():
    cfg = load_config("tiny", ["sft.lr=3e-4", "infra.zero_stage=3", "rl.engine=hf"])
    got = config_subset(cfg, ("sft.lr", "infra.zero_stage", "data.synthetic"))
    assert got["sft.lr"] == 0.0003
    assert got["infra.zero_stage"] == 3
    assert got["data.synthetic"] == {
        "num_train": 4000,
        "num_eval": 200,
        "num_prompts": 1000,
        "min_terms": 2,
        "max_terms": 3,
        "max_operand": 20,
        "flawed_share": 0.25,
        "min_slip": 5,
        "max_slip": 30,
    }
    json.dumps(got)  # plain JSON values only


def test_config_subset_unknown_key_raises():
    with pytest.raises(KeyError):
        config_subset(PipelineConfig(), ("sft.nope",))


def test_config_subset_empty():
    assert config_subset(PipelineConfig(), ()) == {}


# --- flatten -------------------------------------------------------------------------------


def test_flatten_nested():
    tree = {"a": {"b": 1, "c": {"d": 2, "e": [3, 4]}}, "f": None, "g": "x"}
    assert flatten(tree) == {"a.b": 1, "a.c.d": 2, "a.c.e": [3, 4], "f": None, "g": "x"}


def test_flatten_flat_and_prefix():
    assert flatten({"x": 1, "y": 2}) == {"x": 1, "y": 2}
    assert flatten({"x": {"y": 1}}, prefix="cfg.") == {"cfg.x.y": 1}
    assert flatten({}) == {}


def test_flatten_of_a_config_has_dotted_schema_keys():
    flat = flatten(PipelineConfig().model_dump(mode="json"))
    assert flat["seed"] == 42
    assert flat["sft.lr"] == 5e-6
    assert flat["model.tiny.vocab_size"] == 96
    assert flat["data.synthetic.max_operand"] == 20
    assert flat["eval.answer_pattern"] == r"Answer:\s*(-?\d+)"
    assert not any(isinstance(v, dict) for v in flat.values())


# --- code_version --------------------------------------------------------------------------


@pytest.fixture
def temp_package(tmp_path, monkeypatch):
    """A fresh package `fp_pkg_<random>` with a module and a subpackage, importable from tmp_path."""
    name = f"fp_pkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "mod.py").write_text("X = 1\n")
    (root / "other.py").write_text("Y = 2\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "deep.py").write_text("Z = 3\n")
    (root / "notes.txt").write_text("not code\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, root
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def test_code_version_is_stable_and_short(temp_package):
    name, _ = temp_package
    v = code_version((name,))
    assert v == code_version((name,))
    assert len(v) == 16 and re_hex(v)


def test_code_version_of_module_exact(temp_package):
    name, root = temp_package
    expected = hashlib.sha256(f"{name}.mod:mod.py".encode() + b"X = 1\n").hexdigest()[:16]
    assert code_version((f"{name}.mod",)) == expected


def test_code_version_changes_when_a_file_moves_between_subpackages(temp_package):
    name, root = temp_package
    (root / "a").mkdir()
    (root / "a" / "x.py").write_text("W = 1\n")
    before = code_version((name,))
    (root / "b").mkdir()
    (root / "a" / "x.py").rename(root / "b" / "x.py")
    assert code_version((name,)) != before


def test_code_version_changes_when_package_file_changes(temp_package):
    name, root = temp_package
    before = code_version((name,))
    (root / "mod.py").write_text("X = 2\n")
    after = code_version((name,))
    assert after != before
    (root / "mod.py").write_text("X = 1\n")
    assert code_version((name,)) == before


def test_code_version_covers_subpackages_and_new_files(temp_package):
    name, root = temp_package
    before = code_version((name,))
    (root / "sub" / "deep.py").write_text("Z = 4\n")
    changed = code_version((name,))
    assert changed != before
    (root / "added.py").write_text("")
    assert code_version((name,)) != changed


def test_code_version_ignores_non_python_files(temp_package):
    name, root = temp_package
    before = code_version((name,))
    (root / "notes.txt").write_text("edited\n")
    assert code_version((name,)) == before


def test_code_version_of_a_module_only_sees_that_module(temp_package):
    name, root = temp_package
    before = code_version((f"{name}.mod",))
    (root / "other.py").write_text("Y = 3\n")
    assert code_version((f"{name}.mod",)) == before
    (root / "mod.py").write_text("X = 5\n")
    assert code_version((f"{name}.mod",)) != before


def test_code_version_depends_on_module_list(temp_package):
    name, _ = temp_package
    a = code_version((f"{name}.mod",))
    b = code_version((f"{name}.other",))
    ab = code_version((f"{name}.mod", f"{name}.other"))
    assert len({a, b, ab}) == 3


def test_code_version_missing_module_raises():
    with pytest.raises(ValueError, match="cannot find module"):
        code_version((f"no_such_module_{uuid.uuid4().hex[:8]}",))


def test_code_version_of_project_packages():
    v = code_version(("stages.contract", "stages.common"))
    assert len(v) == 16 and v == code_version(("stages.contract", "stages.common"))


def test_local_sources_fall_back_to_a_folder_for_relative_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg" / "rewards").mkdir(parents=True)
    (tmp_path / "pkg" / "rewards" / "r.py").write_text("x = 1\n")
    assert fp.local_sources({"reward.func_path": "rewards/r.py"}) == {}
    found = fp.local_sources({"reward.func_path": "rewards/r.py"}, fallback_dir=tmp_path / "pkg")
    assert list(found) == [f"source:{(tmp_path / 'pkg' / 'rewards' / 'r.py').resolve()}"]
