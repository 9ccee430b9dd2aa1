"""configs/loader.py + configs/schema.py: presets, dotted overrides, and errors that name the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from configs.errors import ConfigError, PipelineError
from configs.loader import PRESET_DIR, load_config, parse_override, preset_path
from configs.schema import DatasetConfig, PipelineConfig, SyntheticTaskConfig

# --- the packaged preset -------------------------------------------------------------------


def test_tiny_preset_loads_with_its_values():
    cfg = load_config("tiny")
    assert isinstance(cfg, PipelineConfig)
    assert cfg.seed == 42
    assert cfg.model.name_or_path is None
    assert cfg.model.tiny.hidden_size == 128
    assert cfg.model.tiny.vocab_size == 96
    assert cfg.data.source == "synthetic"
    assert cfg.data.synthetic.num_train == 4000
    assert cfg.data.synthetic.min_terms == 2
    assert cfg.data.synthetic.max_terms == 3
    assert cfg.data.synthetic.flawed_share == 0.25
    assert cfg.data.max_len == 96
    assert cfg.infra.num_cpus == 2
    assert cfg.infra.zero_stage == 0
    assert cfg.sft.lr == 0.002
    assert cfg.sft.max_steps == 1200
    assert cfg.sft.eval_every == 100
    assert cfg.eval.batch_size == 100
    assert cfg.eval.max_new_tokens == 40
    assert cfg.eval.answer_pattern == r"Answer:\s*(-?\d+)"  # checkable answers: accuracy beside the reward
    # keys the preset leaves out keep the schema defaults
    assert cfg.sft.min_lr_ratio == 0.1
    assert cfg.eval.metric == "reward"


def test_default_preset_is_tiny():
    assert preset_path(None) == PRESET_DIR / "tiny.yaml"
    assert load_config() == load_config("tiny")


@pytest.mark.parametrize("path", sorted(PRESET_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_packaged_yaml_loads(path: Path):
    by_path = load_config(str(path))
    by_name = load_config(path.stem)
    assert isinstance(by_path, PipelineConfig)
    assert by_path == by_name


def test_there_is_at_least_one_packaged_yaml():
    assert (PRESET_DIR / "tiny.yaml").is_file()


# --- overrides -----------------------------------------------------------------------------


def test_overrides_apply_with_yaml_typing():
    cfg = load_config("tiny", ["sft.lr=3e-4", "seed=7"])
    assert cfg.sft.lr == 0.0003
    assert isinstance(cfg.sft.lr, float)
    assert cfg.seed == 7
    assert isinstance(cfg.seed, int)
    # untouched keys stay as in the preset
    assert cfg.sft.max_steps == 1200


def test_override_null_bool_list_and_nested_section():
    cfg = load_config(
        "tiny",
        [
            "sft.max_steps=null",
            "sft.gradient_checkpointing=true",
            "infra.precision=bf16",
            "model.tiny.hidden_size=64",
            "infra.ray_address=",  # empty value -> None
        ],
    )
    assert cfg.sft.max_steps is None
    assert cfg.sft.gradient_checkpointing is True
    assert cfg.infra.precision == "bf16"
    assert cfg.model.tiny.hidden_size == 64
    assert cfg.model.tiny.num_hidden_layers == 4
    assert cfg.infra.ray_address is None


def test_later_override_wins():
    assert load_config("tiny", ["seed=1", "seed=2"]).seed == 2


def test_override_creates_optional_section():
    cfg = load_config(
        "tiny",
        ["data.source=files", "data.sft.paths=[a.jsonl]", "data.prompts.paths=[b.jsonl, c.jsonl]"],
    )
    assert cfg.data.source == "files"
    assert cfg.data.sft is not None and cfg.data.sft.paths == ["a.jsonl"]
    assert cfg.data.prompts is not None and cfg.data.prompts.paths == ["b.jsonl", "c.jsonl"]
    assert cfg.data.preference is None


def test_parse_override():
    # PyYAML follows YAML 1.1: a float needs a dot, so `3e-4` stays a string here and the schema
    # coerces it to a float (see test_overrides_apply_with_yaml_typing); `3.0e-4` is a float already.
    assert parse_override("sft.lr=3e-4") == ("sft.lr", "3e-4")
    assert parse_override("sft.lr=3.0e-4") == ("sft.lr", 0.0003)
    assert parse_override("seed=7") == ("seed", 7)
    assert parse_override(" seed =7") == ("seed", 7)
    assert parse_override("x=a=b") == ("x", "a=b")
    assert parse_override("x=") == ("x", None)
    assert parse_override("x=[1, 2]") == ("x", [1, 2])


@pytest.mark.parametrize("text", ["sft.lr", "=3", ""])
def test_parse_override_without_key_value_fails(text):
    with pytest.raises(ConfigError) as exc:
        parse_override(text)
    assert "expected KEY=VALUE" in str(exc.value)
    assert repr(text) in str(exc.value)


def test_override_with_invalid_yaml_value_fails():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["sft.lr=[1, 2"])
    assert "override 'sft.lr=[1, 2'" in str(exc.value)
    assert "not valid YAML" in str(exc.value)


# --- unknown keys --------------------------------------------------------------------------


def test_unknown_key_in_override_names_override_and_key():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["sft.lrr=1"])
    msg = str(exc.value)
    assert msg.startswith("override 'sft.lrr=1': unknown key 'sft.lrr'")
    assert "lr, lr_scheduler, min_lr_ratio" in msg  # lists what the section does have


def test_unknown_top_level_section_in_override():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["sftt.lr=1"])
    assert str(exc.value).startswith("override 'sftt.lr=1': unknown key 'sftt'")


def test_unknown_deep_key_in_override_names_the_full_prefix():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["model.tiny.hiden_size=3"])
    assert str(exc.value).startswith("override 'model.tiny.hiden_size=3': unknown key 'model.tiny.hiden_size'")


def test_unknown_key_in_optional_section_override():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["data.sft.pathz=[a]"])
    assert str(exc.value).startswith("override 'data.sft.pathz=[a]': unknown key 'data.sft.pathz'")


def test_unknown_key_in_yaml_file_names_file_and_key(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("seed: 1\nsft:\n  lr: 0.01\n  warmup_ratoi: 0.1\n")
    with pytest.raises(ConfigError) as exc:
        load_config(str(path))
    msg = str(exc.value)
    assert msg.startswith(f"{path}: unknown key 'sft.warmup_ratoi'")
    assert "warmup_ratio" in msg  # listed among the expected keys


def test_unknown_top_level_key_in_yaml_file(tmp_path):
    path = tmp_path / "top.yaml"
    path.write_text("sed: 1\n")
    with pytest.raises(ConfigError) as exc:
        load_config(str(path))
    assert str(exc.value).startswith(f"{path}: unknown key 'sed'")
    assert "seed" in str(exc.value)


def test_yaml_file_error_blames_file_even_with_overrides(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("infra:\n  zero_stage: 7\n")
    with pytest.raises(ConfigError) as exc:
        load_config(str(path), ["seed=3"])
    msg = str(exc.value)
    assert msg.startswith(f"{path}: infra.zero_stage:")
    assert "(got 7)" in msg


def test_user_yaml_file_loads_with_defaults(tmp_path):
    path = tmp_path / "mine.yml"
    path.write_text("seed: 5\nsft:\n  lr: 1.0e-4\n")
    cfg = load_config(str(path), ["sft.epochs=3"])
    assert cfg.seed == 5
    assert cfg.sft.lr == 0.0001
    assert cfg.sft.epochs == 3
    assert cfg.sft.max_steps is None  # schema default, not the tiny preset's 600
    assert cfg.infra == PipelineConfig().infra


def test_empty_yaml_file_gives_schema_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(str(path)) == PipelineConfig()


def test_non_mapping_yaml_file_fails(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError) as exc:
        load_config(str(path))
    assert str(exc.value) == f"{path}: expected a mapping of sections at the top level"


def test_invalid_yaml_file_fails(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("sft: [1, 2\n")
    with pytest.raises(ConfigError) as exc:
        load_config(str(path))
    assert str(exc.value).startswith(f"{path}: not valid YAML")


# --- wrong types / values ------------------------------------------------------------------


def test_wrong_type_float_names_override_and_key():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["sft.lr=abc"])
    msg = str(exc.value)
    assert msg.startswith("override 'sft.lr=abc': sft.lr: ")
    assert msg.endswith("(got 'abc')")


def test_wrong_literal_names_override_and_key():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["infra.zero_stage=5"])
    msg = str(exc.value)
    assert msg.startswith("override 'infra.zero_stage=5': infra.zero_stage: ")
    assert msg.endswith("(got 5)")


def test_out_of_range_value_names_key():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["sft.lr=0"])
    assert str(exc.value).startswith("override 'sft.lr=0': sft.lr: ")


def test_wrong_type_blames_the_right_override_among_several():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["seed=3", "sft.epochs=two", "infra.num_workers=2"])
    assert str(exc.value).startswith("override 'sft.epochs=two': sft.epochs: ")


def test_config_error_is_a_pipeline_error():
    assert issubclass(ConfigError, PipelineError)


# --- missing presets / files ---------------------------------------------------------------


def test_missing_preset_fails():
    with pytest.raises(ConfigError) as exc:
        load_config("no_such_preset")
    msg = str(exc.value)
    assert msg.startswith("no_such_preset: no such preset")
    assert "tiny" in msg  # lists the known presets


def test_missing_yaml_file_fails(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as exc:
        load_config(str(path))
    assert str(exc.value) == f"{path}: config file not found"


# --- cross-field validators ----------------------------------------------------------------


def test_eval_metric_defaults_to_reward_for_a_free_form_task(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("model:\n  name_or_path: Qwen/Qwen2.5-0.5B-Instruct\n")
    cfg = load_config(str(mine))
    assert (cfg.eval.metric, cfg.eval.answer_pattern) == ("reward", None)
    assert load_config("tiny", ["eval.metric=sampled_accuracy"]).eval.metric == "sampled_accuracy"


@pytest.mark.parametrize(("metric", "why"), [("perplexity", "lower is better"), ("response_length", "longer is not better")])
def test_eval_metric_refuses_what_ranks_no_model(metric, why):
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", [f"eval.metric={metric}"])
    assert str(exc.value) == (f"override 'eval.metric={metric}': eval.metric: Value error, {metric} is reported but "
                              f"ranks no model ({why}): pick one of reward, sampled_reward, pass_at_k, accuracy, "
                              f"sampled_accuracy (got '{metric}')")


def test_eval_metric_must_be_one_the_stage_reports():
    with pytest.raises(ConfigError, match=r"eval.metric: Input should be 'reward', 'sampled_reward'"):
        load_config("tiny", ["eval.metric=bleu"])
    with pytest.raises(ConfigError, match=r"^override 'eval.answer_pattern=null': eval: Value error, metric=accuracy "
                                          r"checks answers with answer_pattern, which is empty"):
        load_config("tiny", ["eval.metric=accuracy", "eval.answer_pattern=null"])
    for metric in ("sampled_reward", "pass_at_k", "sampled_accuracy"):
        with pytest.raises(ConfigError, match=rf"metric={metric} needs sampled responses: samples_per_prompt must be > 0"):
            load_config("tiny", [f"eval.metric={metric}", "eval.samples_per_prompt=0"])
    assert load_config("tiny", ["eval.samples_per_prompt=0"]).eval.metric == "reward"


def test_min_terms_above_max_terms_fails():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["data.synthetic.min_terms=4"])
    msg = str(exc.value)
    assert msg.startswith("override 'data.synthetic.min_terms=4': data.synthetic: ")
    assert "min_terms (4) must not exceed max_terms (3)" in msg


def test_min_terms_equal_max_terms_is_fine():
    cfg = load_config("tiny", ["data.synthetic.min_terms=3"])
    assert cfg.data.synthetic.min_terms == cfg.data.synthetic.max_terms == 3


def test_synthetic_schema_rejects_min_above_max():
    with pytest.raises(ValidationError, match=r"min_terms \(5\) must not exceed max_terms \(4\)"):
        SyntheticTaskConfig(min_terms=5, max_terms=4)


def test_dataset_probs_length_mismatch_fails():
    with pytest.raises(ValidationError, match="probs has 1 entries for 2 paths"):
        DatasetConfig(paths=["a.jsonl", "b.jsonl"], probs=[1.0])
    ok = DatasetConfig(paths=["a.jsonl", "b.jsonl"], probs=[0.3, 0.7])
    assert ok.probs == [0.3, 0.7]


def test_dataset_probs_mismatch_via_override_fails():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["data.sft.paths=[a.jsonl, b.jsonl]", "data.sft.probs=[1.0]"])
    assert "probs has 1 entries for 2 paths" in str(exc.value)
    assert "data.sft" in str(exc.value)


def test_dataset_nonpositive_probs_fail():
    with pytest.raises(ValidationError, match="probs must all be positive"):
        DatasetConfig(paths=["a", "b"], probs=[1.0, 0.0])


def test_dataset_needs_paths_and_template_placeholder():
    with pytest.raises(ValidationError):
        DatasetConfig(paths=[])
    with pytest.raises(ValidationError, match=r"input_template must contain \{\}"):
        DatasetConfig(paths=["a"], input_template="User: no placeholder")
    assert DatasetConfig(paths=["a"], input_template="User: {}\nAssistant: ").input_template == "User: {}\nAssistant: "


def test_files_source_without_prompts_fails():
    with pytest.raises(ConfigError) as exc:
        load_config("tiny", ["data.source=files"])
    msg = str(exc.value)
    assert msg.startswith("override 'data.source=files': data: ")
    assert "source: files needs at least data.prompts (and data.sft, unless inputs.sft_model is pinned)" in msg


def test_without_sft_rows_no_stage_that_trains_on_them_runs(tmp_path):
    """data.sft may be left out where inputs.sft_model is pinned; a stage that would train on SFT rows is then a
    one-line error before the run, and eval runs without them (no perplexity)."""
    from stages.dag import declaration as dag
    from stages.dag import preflight

    rows = tmp_path / "p.jsonl"
    rows.write_text("".join(f'{{"input": "{a}+1", "label": "{a + 1}"}}\n' for a in range(10)))
    files = ["data.source=files", f"data.prompts.paths=[{rows}]", "reward.source=func", "reward.func_path=rewards/arithmetic.py"]
    cfg = load_config(None, files)
    with pytest.raises(ConfigError, match=r"^data.sft is empty and the sft stage trains on it: name SFT rows in data.sft, "
                                          r"or pin inputs.sft_model to a checkpoint"):
        preflight.check_sft_rows(cfg)
    preflight.check_sft_rows(cfg, only=["data_prep", "rl"])  # --only leaves sft out
    pinned = load_config(None, [*files, f"inputs.sft_model={tmp_path}"])
    preflight.check_sft_rows(pinned)
    assert "sft_data" in dag.BY_NAME["eval"].optional_inputs
    with pytest.raises(ConfigError, match=r"^data.sft is empty and the kd stage trains on its rows: name SFT rows in "
                                          r"data.sft, or set kd.enabled=false$"):
        preflight.check_sft_rows(load_config(None, [*files, f"inputs.sft_model={tmp_path}", "kd.enabled=true",
                                                    "kd.teacher=rl"]))


def test_files_source_with_sft_but_no_prompts_fails():
    with pytest.raises(ConfigError, match=r"needs at least data.prompts"):
        load_config("tiny", ["data.source=files", "data.sft.paths=[a.jsonl]"])


def test_schema_forbids_unknown_keys_and_validates_assignment():
    with pytest.raises(ValidationError):
        PipelineConfig.model_validate({"sft": {"nope": 1}})
    cfg = PipelineConfig()
    with pytest.raises(ValidationError):
        cfg.sft.lr = -1.0


def test_qlora_without_adapters_is_refused():
    with pytest.raises(ConfigError, match=r"sft.lora.*load_in_4bit.*rank > 0"):
        load_config(None, ["sft.lora.load_in_4bit=true"])
    assert load_config(None, ["rm.lora.rank=8", "rm.lora.load_in_4bit=true"]).rm.lora.load_in_4bit


def test_a_config_states_only_what_differs_from_its_base(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: tiny\nsft:\n  max_steps: 7\nrl:\n  actor:\n    lr: 3.0e-5\n")
    cfg, tiny = load_config(str(mine)), load_config("tiny")
    assert (cfg.sft.max_steps, cfg.rl.actor.lr) == (7, 3.0e-5)
    assert cfg.sft.lr == tiny.sft.lr and cfg.rl.rollout.engine == tiny.rl.rollout.engine == "hybrid"  # siblings kept
    assert cfg.model_dump(exclude={"sft", "rl"}) == tiny.model_dump(exclude={"sft", "rl"})


def test_a_base_can_be_a_file_beside_the_config_and_a_chain_of_bases(tmp_path):
    (tmp_path / "team.yaml").write_text("base: tiny\nseed: 7\n")
    (tmp_path / "mine.yaml").write_text("base: team.yaml\ndpo:\n  beta: 0.5\n")
    cfg = load_config(str(tmp_path / "mine.yaml"))
    assert (cfg.seed, cfg.dpo.beta, cfg.dpo.lr) == (7, 0.5, load_config("tiny").dpo.lr)


def test_base_errors_name_the_file(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match=r"a.yaml: base: leads back to itself .*b.yaml -> .*a.yaml"):
        load_config(str(tmp_path / "a.yaml"))
    (tmp_path / "c.yaml").write_text("base: tiny\nsft:\n  learning_rate: 1\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown key 'sft.learning_rate'"):
        load_config(str(tmp_path / "c.yaml"))
    (tmp_path / "d.yaml").write_text("base: huge\n")
    with pytest.raises(ConfigError, match=r"huge: no such preset"):
        load_config(str(tmp_path / "d.yaml"))


def test_without_a_base_the_defaults_are_for_pretrained_models(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("model:\n  name_or_path: Qwen/Qwen2.5-0.5B-Instruct\n")
    cfg = load_config(str(mine))
    # OpenRLHF's example scripts' learning rates; the tiny preset states its own
    assert (cfg.sft.lr, cfg.rm.lr, cfg.prm.lr, cfg.dpo.lr) == (5e-6, 9e-6, 1e-6, 5e-7)
    assert (cfg.rl.actor.lr, cfg.rl.critic.lr) == (5e-7, 9e-6)
    assert load_config("tiny").dpo.lr == 5e-5


def test_the_sections_with_a_router_loss_are_read_from_the_schema():
    from configs.schema import sections_with
    from stages.dag.preflight import AUX_LOSS_SECTIONS

    # every training stage and the RL policy and critic (the critic's is refused when set)
    assert set(AUX_LOSS_SECTIONS) == {"sft", "rm", "prm", "dpo", "rs", "kd", "csft", "rl.actor", "rl.critic"}
    assert sections_with("no_such_key") == ()


MISSING_MODEL = ("model.name_or_path: missing: a config of data files names the model to train (a hub id or a local HF "
                 "checkpoint); only a config with base: tiny builds the tiny model")
FILES = "data:\n  source: files\n  sft: {paths: [sft.jsonl]}\n  prompts: {paths: [prompts.jsonl]}\n"


def test_a_config_of_files_without_a_model_is_refused_naming_the_key(tmp_path):
    (tmp_path / "mine.yaml").write_text(FILES)
    with pytest.raises(ConfigError) as refused:
        load_config(str(tmp_path / "mine.yaml"))
    assert str(refused.value) == f"{tmp_path / 'mine.yaml'}: {MISSING_MODEL}"
    (tmp_path / "named.yaml").write_text(FILES + "model: {name_or_path: /models/m}\n")
    assert load_config(str(tmp_path / "named.yaml")).model.name_or_path == "/models/m"


def test_only_a_config_based_on_the_tiny_preset_builds_the_tiny_model_for_files(tmp_path):
    (tmp_path / "on_tiny.yaml").write_text("base: tiny\n" + FILES)
    assert load_config(str(tmp_path / "on_tiny.yaml")).model.name_or_path is None
    (tmp_path / "middle.yaml").write_text("base: tiny\nseed: 3\n")
    (tmp_path / "top.yaml").write_text("base: middle.yaml\n" + FILES)  # tiny two bases down
    assert load_config(str(tmp_path / "top.yaml")).seed == 3


def test_an_override_that_empties_the_model_is_named():
    with pytest.raises(ConfigError, match=r"^override 'model.name_or_path=null': model.name_or_path: missing"):
        load_config("files-example", ["model.name_or_path=null"])


@pytest.mark.parametrize("command", ["check", "run"])
def test_run_and_check_refuse_a_files_config_without_a_model_in_one_line(command, tmp_path, monkeypatch, capsys):
    from flows.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text(FILES)
    assert main([command, "--config", "mine.yaml"]) == 2
    assert capsys.readouterr().err == f"error: mine.yaml: {MISSING_MODEL}\n"
    assert not (tmp_path / ".rlhf").exists()  # refused before any state was made
