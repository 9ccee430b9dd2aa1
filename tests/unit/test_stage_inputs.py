"""How a stage's inputs are resolved from upstream outcomes, and what its fingerprint covers."""

import os

import pytest

from artifacts import fingerprint as fp
from artifacts.store import ArtifactRef
from configs import ConfigError, PipelineError, load_config
from configs.schema import PipelineConfig
from flows.stage_task import (
    NothingToDo,
    StageOutcome,
    resolve_inputs,
    stage_fingerprint,
)
from stages.dag import declaration as dag

DATA_PREP_OUTPUTS = ("base_model", "sft_data", "prompts", "eval_data")


def data_prep_outcome(outputs=DATA_PREP_OUTPUTS, status="ran"):
    return StageOutcome("data_prep", status, 1.0, "r1", "f1", outputs={n: ArtifactRef(n, "r1") for n in outputs})


def test_inputs_come_from_the_upstream_outputs():
    sft = StageOutcome("sft", "ran", 1.0, "r2", "f2", outputs={"sft_model": ArtifactRef("sft_model", "r2")})
    got = resolve_inputs(dag.BY_NAME["rm"], {"sft": sft, "data_prep": data_prep_outcome((*DATA_PREP_OUTPUTS, "pref_data"))}, PipelineConfig())
    assert got == {"sft_model": ArtifactRef("sft_model", "r2"), "pref_data": ArtifactRef("pref_data", "r1")}


def test_a_missing_optional_output_skips_the_consumer():
    sft = StageOutcome("sft", "ran", 1.0, "r2", "f2", outputs={"sft_model": ArtifactRef("sft_model", "r2")})
    with pytest.raises(NothingToDo, match="prm_data"):
        resolve_inputs(dag.BY_NAME["prm"], {"sft": sft, "data_prep": data_prep_outcome()}, PipelineConfig())


def test_an_optional_input_is_used_when_upstream_made_it_and_dropped_otherwise():
    def outcome(stage, name):
        return StageOutcome(stage, "ran", 1.0, stage, "f", outputs={name: ArtifactRef(name, stage)})

    upstream = {"data_prep": data_prep_outcome(), "sft": outcome("sft", "sft_model"), "rl": outcome("rl", "rl_model")}
    got = resolve_inputs(dag.BY_NAME["eval"], upstream, PipelineConfig())
    assert "dpo_model" not in got and {"base_model", "sft_model", "rl_model", "eval_data"} <= set(got)
    upstream["dpo"] = outcome("dpo", "dpo_model")
    assert resolve_inputs(dag.BY_NAME["eval"], upstream, PipelineConfig())["dpo_model"] == ArtifactRef("dpo_model", "dpo")


def test_a_missing_required_output_is_an_error():
    with pytest.raises(PipelineError, match=r"stage sft needs base_model \(from data_prep\)"):
        resolve_inputs(dag.BY_NAME["sft"], {"data_prep": data_prep_outcome(("sft_data",))}, PipelineConfig())


def test_config_subset_of_an_unset_section_is_none():
    assert fp.config_subset(load_config(), ("data.sft.paths",)) == {"data.sft.paths": None}


def test_data_prep_fingerprint_follows_the_content_of_local_files(tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text('{"q": "1", "a": "2"}\n')
    cfg = load_config(None, ["data.source=files", f"data.sft.paths=[{data}]", f"data.prompts.paths=[{data}]",
                             f"model.name_or_path={tmp_path}"])
    before = stage_fingerprint(dag.BY_NAME["data_prep"], cfg, {})
    assert stage_fingerprint(dag.BY_NAME["data_prep"], cfg, {}) == before
    data.write_text('{"q": "1", "a": "3"}\n')
    os.utime(data, ns=(1, 10**18))  # a different mtime even on coarse clocks
    assert stage_fingerprint(dag.BY_NAME["data_prep"], cfg, {}) != before


def test_a_pinned_input_replaces_the_upstream_output_and_its_producer_is_not_needed():
    from stages.dag.declaration import check_pins, needed_by, pinned_away

    cfg = PipelineConfig.model_validate({"inputs": {"sft_model": "runs:/abc/dpo_model"}})
    pinned = ArtifactRef("dpo_model", "abc")
    got = resolve_inputs(dag.BY_NAME["rm"], {"data_prep": data_prep_outcome((*DATA_PREP_OUTPUTS, "pref_data"))}, cfg,
                         {"sft_model": pinned})
    assert got["sft_model"] == pinned
    assert needed_by({"rm"}, cfg) == {"data_prep"} and pinned_away(dag.BY_NAME["sft"], cfg)
    assert not pinned_away(dag.BY_NAME["data_prep"], cfg)
    with pytest.raises(ConfigError, match=r"inputs.sft_modell: no stage produces 'sft_modell'"):
        check_pins(PipelineConfig.model_validate({"inputs": {"sft_modell": "runs:/abc/x"}}))
