"""stages/dag/plan.py: which stages a request runs and why each other does not, read from the config alone.
Expected plans are worked out by hand from the DAG's inputs and each section's switches."""

from __future__ import annotations

from configs import load_config
from stages.dag.plan import plan


def statuses(cfg, only=()) -> dict[str, str]:
    return {name: step.line() for name, step in plan(cfg, only).items()}


def test_the_tiny_preset_runs_every_stage_its_config_turns_on():
    assert statuses(load_config("tiny", [])) == {
        "data_prep": "runs", "sft": "runs", "rm": "runs", "prm": "runs", "rl": "runs", "dpo": "runs",
        "rs": "off: rs.enabled is false", "kd": "off: kd.enabled is false", "csft": "off: csft.enabled is false",
        "lora_merge": "off: no stage trains a LoRA adapter", "eval": "runs"}


def test_only_runs_the_named_stages_and_reuses_what_they_need():
    """RL on the tiny preset reads the SFT model and data prep's prompts; its reward is a function, so no RM."""
    planned = plan(load_config("tiny", []), ["rl"])
    assert {n: s.status for n, s in planned.items()} == {
        "data_prep": "reused", "sft": "reused", "rm": "unrequested", "prm": "unrequested", "rl": "runs",
        "dpo": "unrequested", "rs": "unrequested", "kd": "unrequested", "csft": "unrequested",
        "lora_merge": "unrequested", "eval": "unrequested"}
    assert {n for n, s in planned.items() if s.scheduled} == {"data_prep", "sft", "rl"}


def test_a_pinned_output_stands_in_for_its_stage():
    cfg = load_config("tiny", ["inputs.sft_model=/models/sft"])
    planned = plan(cfg)
    assert planned["sft"].line() == "off: inputs.sft_model stands in for its output"
    assert (planned["sft"].status, planned["sft"].scheduled, planned["rl"].runs) == ("pinned", False, True)


def test_a_stage_the_config_turns_off_still_gets_a_task_but_is_not_checked():
    """The flow records it as skipped; the pre-run checks of a stage off by config are its own to skip."""
    step = plan(load_config("tiny", []))["rs"]
    assert (step.status, step.scheduled, step.in_request, step.runs) == ("off", True, True, False)


def test_a_stage_without_its_dataset_is_off_and_so_are_its_consumers():
    """A config of files with SFT rows only: no preference pairs (no RM, DPO) and no PRM rows (no PRM)."""
    cfg = load_config("tiny", ["data.source=files", "data.sft.paths=[sft.jsonl]", "data.prompts.paths=[prompts.jsonl]"])
    planned = statuses(cfg)
    assert planned["rm"] == "off: no preference data (data.preference)"
    assert planned["prm"] == "off: no PRM data (data.prm)"
    assert planned["dpo"] == "off: no preference data (data.preference)"
    assert (planned["sft"], planned["rl"], planned["eval"]) == ("runs", "runs", "runs")


def test_kto_rows_leave_the_reward_model_off():
    cfg = load_config("tiny", ["data.source=files", "data.sft.paths=[sft.jsonl]", "data.prompts.paths=[prompts.jsonl]",
                               "data.preference.paths=[kto.jsonl]", "data.preference.unpaired=true", "dpo.loss=kto"])
    assert statuses(cfg)["rm"] == "off: data.preference.unpaired: KTO's rows, no pairs"
