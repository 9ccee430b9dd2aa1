"""artifacts/fingerprint.py: config subsets, flattening, code versions (artifacts/code_graph.py), local
sources by content (artifacts/file_hashes.py) and stage fingerprints."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import time
import uuid

import pytest

from artifacts import code_graph, file_hashes
from artifacts import fingerprint as fp
from artifacts.fingerprint import code_version, config_subset, fingerprint
from configs.loader import flatten, load_config
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
    """The first 20 hex digits of the SHA-256 of the sorted-key JSON of BASE, written out by hand and hashed by
    coreutils (`printf '%s' '{"code": ...}' | sha256sum`), not by the code under test."""
    # {"code": "0123456789abcdef", "config": {"infra.zero_stage": 2, "seed": 42, "sft": {"epochs": 1, "lr": 0.001}},
    #  "inputs": {"base_model": "run-a/base_model", "sft_data": "run-a/sft_data"}, "stage": "sft"}
    assert fingerprint(**BASE) == "44544efc7a4e90653d62"


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
    "lr_scheduler": "cosine_with_min_lr",
    "min_lr_ratio": 0.1,
    "warmup_ratio": 0.05,
    "adam_betas": [0.9, 0.95],
    "weight_decay": 0.0,
    "epochs": 1,
    "max_steps": None,
    "micro_batch_size": 32,
    "grad_accum_steps": 1,
    "grad_clip": 1.0,
    "gradient_checkpointing": False,
    "eval_every": 50,
    "save_every": 50,
    "max_checkpoints": 1,
    "aux_loss_coef": 0.0,
    "lora": {"rank": 0, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear", "load_in_4bit": False},
    "packing": False,
    "pretrain_mode": False,
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
    cfg = load_config("tiny", ["sft.lr=3e-4", "infra.zero_stage=3", "rl.rollout.engine=hf"])
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
        "two_turn_share": 0.0,
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
    assert (flat["eval.answer_pattern"], flat["eval.metric"]) == (None, "reward")
    assert not any(isinstance(v, dict) for v in flat.values())


# --- code_version: the modules a module imports, transitively ------------------------------

FAKE_TREE = {
    "__init__.py": "",
    "entry.py": (
        "import json\n"
        "from os import path\n"
        "from PKG import helper  # a submodule, from its package\n"
        "from .sub import deep  # relative\n"
        "import PKG.sub.plain as plain  # dotted: runs PKG.sub too\n"
        "\n"
        "def late():\n"
        "    from PKG.lazy import THING  # inside a function, as stages import torch-heavy parts\n"
        "    import importlib\n"
        "    return importlib.import_module('PKG.dynamic')\n"
    ),
    "helper.py": "from . import shared\n",
    "shared.py": "S = 1\n",
    "lazy.py": "THING = 1\n",
    "dynamic.py": "D = 1\n",
    "unrelated.py": "import PKG.shared\n",
    "sub/__init__.py": "",
    "sub/deep.py": "from ..shared import S\n",
    "sub/plain.py": "P = 1\n",
    "sub/untouched.py": "U = 1\n",
    "notes.txt": "not code\n",
}
IMPORTED = {"": "__init__.py", ".entry": "entry.py", ".helper": "helper.py", ".shared": "shared.py", ".lazy": "lazy.py",
            ".dynamic": "dynamic.py", ".sub": "sub/__init__.py", ".sub.deep": "sub/deep.py", ".sub.plain": "sub/plain.py"}
NOT_IMPORTED = ("unrelated.py", "sub/untouched.py", "notes.txt")


def write_tree(root, name):
    for rel, text in FAKE_TREE.items():
        (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / name / rel).write_text(text.replace("PKG", name))


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A package `fp_pkg_<random>` under tmp_path/a, on sys.path, never imported."""
    name = f"fp_pkg_{uuid.uuid4().hex[:8]}"
    write_tree(tmp_path / "a", name)
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    importlib.invalidate_caches()
    return name, tmp_path / "a" / name


def test_module_closure_follows_every_kind_of_import(fake_package):
    name, root = fake_package
    found = code_graph.module_closure(f"{name}.entry", (name,))
    assert list(found) == sorted(name + suffix for suffix in IMPORTED)
    assert found == {name + suffix: root / rel for suffix, rel in IMPORTED.items()}
    assert name not in sys.modules  # read, not imported


@pytest.mark.parametrize("suffix", IMPORTED)
def test_editing_an_imported_module_changes_the_code_version(fake_package, suffix):
    name, root = fake_package
    before = code_version(f"{name}.entry", (name,))
    with open(root / IMPORTED[suffix], "a") as f:
        f.write("# edited\n")
    assert code_version(f"{name}.entry", (name,)) != before


@pytest.mark.parametrize("rel", NOT_IMPORTED)
def test_editing_a_module_not_imported_keeps_the_code_version(fake_package, rel):
    name, root = fake_package
    before = code_version(f"{name}.entry", (name,))
    with open(root / rel, "a") as f:
        f.write("# edited\n")
    (root / "added.py").write_text("A = 1\n")
    assert code_version(f"{name}.entry", (name,)) == before


def test_a_new_import_brings_its_module_into_the_code_version(fake_package):
    name, root = fake_package
    before = code_version(f"{name}.entry", (name,))
    with open(root / "entry.py", "a") as f:
        f.write(f"from {name} import unrelated\n")
    assert f"{name}.unrelated" in code_graph.module_closure(f"{name}.entry", (name,))
    edited = code_version(f"{name}.entry", (name,))
    (root / "unrelated.py").write_text("import json\n")
    assert len({before, edited, code_version(f"{name}.entry", (name,))}) == 3


def test_the_code_version_is_the_same_from_another_checkout(fake_package, tmp_path):
    name, _root = fake_package
    write_tree(tmp_path / "b", name)
    here = code_version(f"{name}.entry", (name,))
    assert code_version(f"{name}.entry", (name,), search=[tmp_path / "b"]) == here
    (tmp_path / "b" / name / "lazy.py").write_text("THING = 2\n")
    assert code_version(f"{name}.entry", (name,), search=[tmp_path / "b"]) != here


def test_code_version_exact_value(fake_package):
    name, _root = fake_package
    source = b"S = 1\n"
    expected = hashlib.sha256(f"{name}:0:".encode() + f"{name}.shared:{len(source)}:".encode() + source)
    assert code_version(f"{name}.shared", (name,)) == expected.hexdigest()[:16]


def test_code_version_of_a_missing_module_raises(fake_package):
    name, _ = fake_package
    with pytest.raises(ValueError, match=f"cannot find module {name}.nope"):
        code_version(f"{name}.nope", (name,))
    with pytest.raises(ValueError, match="cannot find module json"):
        code_version("json")  # not a project module


# --- local_sources: by content, named by config key ---------------------------------------


def test_local_sources_name_the_key_and_hash_the_content(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("row\n")
    (tmp_path / "model" / "sub").mkdir(parents=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "sub" / "w.bin").write_bytes(b"\0\1")
    found = fp.local_sources({"data.sft.paths": ["openai/gsm8k", str(data)], "model.name_or_path": str(tmp_path / "model"),
                              "reward.func_path": str(data), "reward.prm_path": None})
    assert found == {
        "source:data.sft.paths[1]": f"4:{hashlib.sha256(b'row' + bytes([10])).hexdigest()}",
        "source:model.name_or_path/config.json": f"2:{hashlib.sha256(b'{}').hexdigest()}",
        "source:model.name_or_path/sub/w.bin": f"2:{hashlib.sha256(bytes([0, 1])).hexdigest()}",
        "source:reward.func_path": f"4:{hashlib.sha256(b'row' + bytes([10])).hexdigest()}",
    }


def test_local_sources_fall_back_to_a_folder_for_relative_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg" / "rewards").mkdir(parents=True)
    (tmp_path / "pkg" / "rewards" / "r.py").write_text("x = 1\n")
    assert fp.local_sources({"reward.func_path": "rewards/r.py"}) == {}
    found = fp.local_sources({"reward.func_path": "rewards/r.py"}, fallback_dir=tmp_path / "pkg")
    assert list(found) == ["source:reward.func_path"]


def test_a_copy_of_the_same_files_elsewhere_has_the_same_sources(tmp_path):
    """Two checkouts: the reward file resolves under each one's configs/, with its own path and mtime."""
    for checkout, mtime in (("a", 10**18), ("b", 2 * 10**18)):
        (tmp_path / checkout / "rewards").mkdir(parents=True)
        (tmp_path / checkout / "rewards" / "r.py").write_text("x = 1\n")
        os.utime(tmp_path / checkout / "rewards" / "r.py", ns=(mtime, mtime))
    a = fp.local_sources({"reward.func_path": "rewards/r.py"}, tmp_path / "a", tmp_path / "hashes.json")
    assert a == fp.local_sources({"reward.func_path": "rewards/r.py"}, tmp_path / "b", tmp_path / "hashes.json")
    (tmp_path / "b" / "rewards" / "r.py").write_text("x = 2\n")
    assert fp.local_sources({"reward.func_path": "rewards/r.py"}, tmp_path / "b", tmp_path / "hashes.json") != a


def test_a_touched_file_is_not_new_data(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("row\n")
    before = fp.local_sources({"k": str(data)}, hash_cache=tmp_path / "hashes.json")
    os.utime(data, ns=(10**18, 10**18))
    assert fp.local_sources({"k": str(data)}, hash_cache=tmp_path / "hashes.json") == before


def test_an_edit_with_the_same_size_and_a_restored_mtime_is_new_data(tmp_path, monkeypatch):
    monkeypatch.setattr(file_hashes, "RACY_S", 0.0)  # keep the hash of a file written just now
    data = tmp_path / "d.jsonl"
    data.write_text("row 1\n")
    stat = data.stat()
    cache = tmp_path / "hashes.json"
    before = fp.local_sources({"k": str(data)}, hash_cache=cache)
    assert str(data.resolve()) in json.loads(cache.read_text())  # kept: this is the cached path
    time.sleep(0.05)  # past the file system's clock tick, so that the edit's ctime differs
    data.write_text("row 2\n")
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert data.stat().st_size == stat.st_size and data.stat().st_mtime_ns == stat.st_mtime_ns
    assert fp.local_sources({"k": str(data)}, hash_cache=cache) != before


def test_a_kept_hash_is_served_while_the_file_is_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr(file_hashes, "RACY_S", 0.0)
    data = tmp_path / "big.bin"
    data.write_bytes(b"weights")
    cache = tmp_path / "hashes.json"
    hashes = file_hashes.FileHashes(cache)
    assert hashes.digest(data) == f"7:{hashlib.sha256(b'weights').hexdigest()}"
    hashes.save()
    monkeypatch.setattr(file_hashes, "sha256", lambda path: pytest.fail(f"{path} read again"))
    assert file_hashes.FileHashes(cache).digest(data) == f"7:{hashlib.sha256(b'weights').hexdigest()}"


def test_a_file_changed_within_the_clock_tick_is_not_kept(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("row\n")  # ctime now: an edit in the same tick could leave every stamp as it is
    hashes = file_hashes.FileHashes(tmp_path / "hashes.json")
    hashes.digest(data)
    hashes.save()
    assert hashes.known == {} and not (tmp_path / "hashes.json").exists()


def test_an_unreadable_hash_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setattr(file_hashes, "RACY_S", 0.0)
    (tmp_path / "hashes.json").write_text("{not json")
    data = tmp_path / "d.jsonl"
    data.write_text("row\n")
    assert fp.local_sources({"k": str(data)}, hash_cache=tmp_path / "hashes.json")["source:k"].startswith("4:")
    assert str(data.resolve()) in json.loads((tmp_path / "hashes.json").read_text())
