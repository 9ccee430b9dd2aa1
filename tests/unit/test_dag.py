"""stages/dag/declaration.py: the declared DAG is well formed and its helpers compute the right closures."""

from __future__ import annotations

import modulefinder
import shutil
from pathlib import Path

import pytest

import stages
from artifacts import code_graph
from artifacts.fingerprint import code_version, config_subset
from configs.schema import PipelineConfig
from stages.dag import declaration as dag
from stages.dag.declaration import BY_NAME, STAGES, check_order, producer, upstream


def test_stage_names_and_order():
    names = ["data_prep", "sft", "rm", "prm", "rl", "dpo", "rs", "kd", "csft", "lora_merge", "eval"]
    assert [s.name for s in STAGES] == names and list(BY_NAME) == names
    assert all(BY_NAME[s.name] is s for s in STAGES)


def test_check_order_passes():
    check_order()


def test_check_order_detects_misordering(monkeypatch):
    monkeypatch.setattr(dag, "STAGES", (BY_NAME["sft"], BY_NAME["data_prep"], BY_NAME["eval"]))
    with pytest.raises(AssertionError, match=r"sft is declared before its upstream \['data_prep'\]"):
        dag.check_order()


def test_every_input_has_a_producer_declared_earlier():
    for i, spec in enumerate(STAGES):
        for artifact in spec.inputs:
            prod = producer(artifact)
            assert artifact in prod.outputs
            assert STAGES.index(prod) < i


def test_outputs_are_unique_and_optional_or_registered_outputs_are_outputs():
    all_outputs = [a for s in STAGES for a in s.outputs]
    assert len(all_outputs) == len(set(all_outputs))
    for spec in STAGES:
        assert set(spec.optional_outputs) <= set(spec.outputs)
        assert set(spec.requested_outputs) <= set(spec.optional_outputs)
        assert set(spec.register) <= set(spec.outputs)


def test_producer():
    assert producer("base_model").name == "data_prep"
    assert producer("eval_data").name == "data_prep"
    assert producer("sft_model").name == "sft"
    assert producer("eval_report").name == "eval"
    with pytest.raises(KeyError, match="no stage produces 'nope'"):
        producer("nope")


def test_upstream():
    assert upstream(BY_NAME["data_prep"]) == []
    assert upstream(BY_NAME["sft"]) == ["data_prep"]
    assert upstream(BY_NAME["rl"]) == ["data_prep", "sft", "rm", "prm"]
    assert upstream(BY_NAME["dpo"]) == ["data_prep", "sft", "rm", "prm"]
    assert upstream(BY_NAME["rs"]) == ["data_prep", "sft", "rm", "prm"]
    assert upstream(BY_NAME["kd"]) == ["data_prep", "sft", "rl", "dpo"]
    assert upstream(BY_NAME["csft"]) == ["data_prep", "sft", "rm"]
    assert upstream(BY_NAME["eval"]) == ["data_prep", "sft", "rm", "prm", "rl", "dpo", "rs", "kd", "csft"]
    assert upstream(BY_NAME["lora_merge"]) == ["sft", "rm", "prm", "rl", "dpo"]


def test_rl_consumes_the_pipelines_reward_models_only_when_the_reward_config_asks():
    rl = BY_NAME["rl"]
    base = ("sft_model", "prompts", "eval_data")
    assert rl.wanted_inputs(PipelineConfig()) == base  # reward.source: func
    rm = PipelineConfig.model_validate({"reward": {"source": "rm"}})
    assert rl.wanted_inputs(rm) == (*base, "reward_model")
    assert rl.wanted_inputs(PipelineConfig.model_validate({"reward": {"source": "rm", "rm_paths": ["/x"]}})) == base
    assert rl.wanted_inputs(PipelineConfig.model_validate({"reward": {"source": "prm"}})) == (*base, "prm")
    assert BY_NAME["sft"].wanted_inputs(rm) == BY_NAME["sft"].inputs


def test_eval_scores_with_the_pipelines_reward_models_only_when_the_reward_config_asks():
    ev = BY_NAME["eval"]
    base = ("base_model", "sft_model", "rl_model", "dpo_model", "sft_data", "eval_data")
    assert ev.wanted_inputs(PipelineConfig()) == base  # reward.source: func
    assert ev.wanted_inputs(PipelineConfig.model_validate({"reward": {"source": "rm"}})) == (*base, "reward_model")
    assert ev.wanted_inputs(PipelineConfig.model_validate({"reward": {"source": "prm", "prm_path": "/x"}})) == base
    # the reward's settings and files count in eval's fingerprint, as in RL's
    assert "reward" in ev.config_keys and ev.local_sources == dag.REWARD_FILES
    assert dag.needed_by({"eval"}, PipelineConfig.model_validate({"reward": {"source": "prm"}})) == \
        {"data_prep", "sft", "prm", "rl", "dpo"}


def test_the_champions_metric_reruns_eval_but_not_rl():
    rl, ev = BY_NAME["rl"], BY_NAME["eval"]
    base = PipelineConfig()
    by_pass = PipelineConfig.model_validate({"eval": {"metric": "pass_at_k"}})
    assert config_subset(by_pass, rl.config_keys) == config_subset(base, rl.config_keys)
    assert config_subset(by_pass, ev.config_keys) != config_subset(base, ev.config_keys)
    # what RL's periodic evals read does count
    more = PipelineConfig.model_validate({"eval": {"samples_per_prompt": 8}})
    assert config_subset(more, rl.config_keys) != config_subset(base, rl.config_keys)


def test_dpo_consumes_prompts_and_rewards_and_fingerprints_the_reward_only_when_iterative():
    dpo = BY_NAME["dpo"]
    offline = PipelineConfig.model_validate({"reward": {"source": "rm"}})
    assert dpo.wanted_inputs(offline) == ("sft_model", "pref_data")
    assert "reward" not in dpo.wanted_config(dpo.config_keys, offline) and not dpo.wanted_config(dpo.local_sources, offline)
    online = PipelineConfig.model_validate({"reward": {"source": "rm"}, "dpo": {"max_steps": 4, "iterative": {"rounds": 2}}})
    assert dpo.wanted_inputs(online) == ("sft_model", "pref_data", "prompts", "reward_model")
    assert {"reward", "prm.step_separator"} <= set(dpo.wanted_config(dpo.config_keys, online))
    assert dpo.wanted_config(dpo.local_sources, online) == dag.REWARD_FILES
    assert BY_NAME["rl"].wanted_config(BY_NAME["rl"].config_keys, offline) == BY_NAME["rl"].config_keys


@pytest.mark.parametrize("spec", STAGES, ids=lambda s: s.name)
def test_entrypoint_loads_a_callable(spec):
    module, func = spec.entrypoint.split(":")
    fn = spec.load()
    assert callable(fn)
    assert fn.__name__ == func
    assert fn.__module__ == module


@pytest.mark.parametrize("spec", STAGES, ids=lambda s: s.name)
def test_config_keys_resolve_in_default_config(spec):
    cfg = PipelineConfig()
    subset = config_subset(cfg, spec.config_keys)
    assert list(subset) == list(spec.config_keys)
    assert "seed" in spec.config_keys and subset["seed"] == 42


def test_sft_config_keys_values():
    subset = config_subset(PipelineConfig(), BY_NAME["sft"].config_keys)
    assert subset["model.attn_implementation"] == "auto"
    assert subset["infra.zero_stage"] == 2
    assert subset["infra.precision"] == "auto"
    assert subset["infra.num_workers"] == 1
    assert subset["sft"]["lr"] == 5e-6


# --- code versions: a stage's code is what its entrypoint imports -------------------------

ROOT = Path(stages.__file__).parent.parent


@pytest.mark.parametrize("spec", STAGES, ids=lambda s: s.name)
def test_a_stage_code_is_the_project_modules_its_entrypoint_imports(spec):
    """Read by the standard library's modulefinder (bytecode, nested functions included) as a second opinion."""
    finder = modulefinder.ModuleFinder(path=[str(ROOT)])  # only the checkout: libraries are not followed
    finder.import_hook(spec.module)
    expected = {name for name in finder.modules if name.split(".")[0] in code_graph.PROJECT_PACKAGES}
    assert set(code_graph.module_closure(spec.module)) == expected


def test_eval_code_covers_what_it_reads_data_and_names_results_with():
    assert {"stages.eval.stage", "stages.data.prepared", "stages.eval.results"} <= set(code_graph.module_closure("stages.eval.stage"))


@pytest.fixture
def checkout(tmp_path):
    """A copy of the project's packages, as in a second checkout of the same commit."""
    for package in code_graph.PROJECT_PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def versions(search=None) -> dict[str, str]:
    return {spec.name: code_version(spec.module, search=search) for spec in STAGES}


def test_code_versions_are_the_same_in_another_checkout(checkout):
    here = versions()
    assert versions([checkout]) == here and len(set(here.values())) == len(STAGES)


EDITS = {
    "stages.dpo.losses": {"dpo"},
    "stages.eval.results": {"eval"},
    "stages.eval.metrics": {"rl", "eval"},  # RL's periodic evals share eval's metrics
    "stages.rm.stage": {"rm", "lora_merge"},  # lora_merge saves merged reward models with it
    "stages.rewards.remote": {"rl", "dpo", "rs", "csft", "eval"},  # the reward sources iterative DPO, rs and eval score with too
    "stages.data.prepared": set(BY_NAME),  # every stage reads its data with it (data prep writes it)
    "stages.data_prep.stage": {"data_prep"},  # the stages read what it wrote, not its code
    "stages.common.generation": {"rl", "dpo", "rs", "eval"},
    "stages.sft.stage": {"sft", "rs", "csft"},  # rs and csft train with SFT's loss
    "stages.common.conditioning": {"csft", "eval"},  # eval prompts a csft policy as it was trained
    "stages.kd.losses": {"kd"},
    "stages.dag.preflight": set(),  # the flow's checks: no stage imports them
    "flows.summary": set(),
}


@pytest.mark.parametrize("module", EDITS)
def test_editing_a_module_changes_the_code_version_of_the_stages_that_import_it(checkout, module):
    before = versions([checkout])
    with open(checkout / (module.replace(".", "/") + ".py"), "a") as f:
        f.write("# edited\n")
    after = versions([checkout])
    assert {name for name in before if after[name] != before[name]} == EDITS[module]


def test_distributed_and_metrics():
    assert [s.name for s in STAGES if s.distributed] == ["sft", "rm", "prm", "dpo", "rs", "kd", "csft"]
    assert BY_NAME["dpo"].register == ("dpo_model",) and BY_NAME["dpo"].key_metric == "eval/reward_accuracy"
    assert BY_NAME["sft"].register == ("sft_model",)
    assert BY_NAME["rm"].register == ("reward_model",) and BY_NAME["prm"].register == ("prm",)
    assert BY_NAME["rm"].key_metric == "eval/accuracy" and BY_NAME["prm"].key_metric == "eval/step_accuracy"
    assert BY_NAME["data_prep"].key_metric == "rows/sft_data/train"
    assert BY_NAME["sft"].key_metric == "eval/loss"
    assert BY_NAME["eval"].key_metric == "score"  # the last model's eval.metric
    assert [s.name for s in STAGES if s.driver] == ["rl"]
    assert BY_NAME["rl"].register == ("rl_model", "critic_model") and BY_NAME["rl"].key_metric == "eval/reward"
    assert BY_NAME["lora_merge"].register == ("merged_models",) and BY_NAME["lora_merge"].key_metric == "merge/max_logit_diff"


def test_lora_merge_runs_only_when_a_stage_trains_an_adapter():
    merge = BY_NAME["lora_merge"]
    assert merge.takes_adapters and not any(s.takes_adapters for s in STAGES if s is not merge)
    assert not merge.run_when(PipelineConfig())
    for section in dag.LORA_SECTIONS:
        nested = {"lora": {"rank": 4}}
        for part in reversed(section.split(".")):
            nested = {part: nested}
        assert merge.run_when(PipelineConfig.model_validate(nested)) == (section != "rl.critic")
    assert set(merge.optional_inputs) == set(merge.inputs)


def test_rejection_sampling_runs_only_when_enabled_and_eval_then_scores_its_policy():
    rs, ev = BY_NAME["rs"], BY_NAME["eval"]
    off, on = PipelineConfig(), PipelineConfig.model_validate({"rs": {"enabled": True}, "reward": {"source": "rm"}})
    assert not rs.run_when(off) and rs.run_when(on) and rs.register == ("rs_model",)
    assert rs.wanted_inputs(on) == ("sft_model", "sft_data", "prompts", "reward_model")
    assert "rs_model" not in ev.wanted_inputs(off) and "rs_model" in ev.wanted_inputs(on)
    assert "rs" not in dag.needed_by({"eval"}, off) and "rs" in dag.needed_by({"eval"}, on)
    assert "rs_model" in ev.optional_inputs  # a skipped rs does not skip eval


def test_distillation_runs_only_when_enabled_on_the_teacher_it_names():
    kd, ev = BY_NAME["kd"], BY_NAME["eval"]
    assert not kd.run_when(PipelineConfig()) and "kd_model" not in ev.wanted_inputs(PipelineConfig())
    by_teacher = {teacher: PipelineConfig.model_validate({"kd": {"enabled": True, "teacher": teacher, **extra}})
                  for teacher, extra in (("rl", {}), ("dpo", {}), ("path", {"teacher_path": "/x"}))}
    assert kd.wanted_inputs(by_teacher["rl"]) == ("sft_model", "sft_data", "rl_model")
    assert kd.wanted_inputs(by_teacher["dpo"]) == ("sft_model", "sft_data", "dpo_model")
    assert kd.wanted_inputs(by_teacher["path"]) == ("sft_model", "sft_data")
    assert dag.needed_by({"kd"}, by_teacher["path"]) == {"data_prep", "sft"}
    assert "kd_model" in ev.wanted_inputs(by_teacher["rl"]) and "kd_model" in ev.optional_inputs
    assert kd.local_sources == ("kd.teacher_path",)  # a local teacher counts by its content
    assert config_subset(by_teacher["rl"], kd.config_keys) != config_subset(by_teacher["dpo"], kd.config_keys)


def test_conditional_sft_runs_only_when_enabled_on_the_pipelines_rm_unless_the_reward_names_rms():
    csft, ev = BY_NAME["csft"], BY_NAME["eval"]
    assert not csft.run_when(PipelineConfig()) and "csft_model" not in ev.wanted_inputs(PipelineConfig())
    own = PipelineConfig.model_validate({"csft": {"enabled": True}})
    assert csft.wanted_inputs(own) == ("sft_model", "sft_data", "reward_model") and "csft_model" in ev.wanted_inputs(own)
    named = PipelineConfig.model_validate({"csft": {"enabled": True}, "reward": {"rm_paths": ["/rm"]}})
    assert csft.wanted_inputs(named) == ("sft_model", "sft_data") and dag.needed_by({"csft"}, named) == {"data_prep", "sft"}
    # what it scores with counts; the reward source RL and eval score with does not
    func = PipelineConfig.model_validate({"csft": {"enabled": True}, "reward": {"func_path": "other.py"}})
    assert config_subset(func, csft.config_keys) == config_subset(own, csft.config_keys)


def test_needed_by_follows_the_inputs_the_config_wants():
    cfg = PipelineConfig()
    assert dag.needed_by({"rm"}, cfg) == {"data_prep", "sft"}
    assert dag.needed_by({"eval"}, cfg) == {"data_prep", "sft", "rl", "dpo"}
    assert dag.needed_by({"rl"}, cfg) == {"data_prep", "sft"}  # the rule reward: no rm, no prm
    assert dag.needed_by({"rl"}, PipelineConfig.model_validate({"reward": {"source": "prm"}})) == {"data_prep", "sft", "prm"}
    assert dag.needed_by({"sft", "rm"}, cfg) == {"data_prep", "sft"}  # sft is asked for and needed
    assert dag.needed_by({"data_prep"}, cfg) == set()
