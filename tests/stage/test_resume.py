"""A killed training stage, rerun in its folder, resumes from its last checkpoint and ends as the uninterrupted
run ends: the same output weights bit for bit, and the same metrics at every step it logged again (timings
aside). Killed from its metric callback at a step that is not a checkpoint step (so the resume redoes steps),
or in a training forward between two micro-batches of an optimizer step. Both runs in this process: one BLAS,
so exact equality holds. The model has attention dropout, so training draws from torch's RNG, which a resume
must restore. (RL: tests/stage/test_rl_resume.py.)"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from configs import load_config
from stages.csft import stage as csft
from stages.dpo import stage as dpo
from stages.kd import stage as kd
from stages.prm import stage as prm
from stages.rm import stage as rm
from stages.rs import stage as rs
from stages.sft import stage as sft
from tests.stage.conftest import FAST, Recorder, make_ctx
from tests.stage.resume_runs import assert_same_histories, assert_same_weights, dropout_model, killed_between_micro_batches, latest
from tests.tiny_checkpoint import save_random_rm

pytestmark = pytest.mark.slow

# 6 optimizer steps of 2 micro-batches; checkpoints at 2 and 4, evals at 3 and 6, train metrics at 6 (their
# window: every step since the last log, across a resume)
STEPS = ["max_steps=6", "save_every=2", "eval_every=3", "grad_accum_steps=2", "micro_batch_size=4"]
# case -> (its stage, settings, the output it writes, the inputs it reads: prepared's names, "model": the dropout model)
CASES = {
    "sft": ("sft", [], "sft_model", {"base_model": "model", "sft_data": "sft_data"}),
    "rm": ("rm", [], "reward_model", {"sft_model": "model", "pref_data": "pref_data"}),
    "prm": ("prm", [], "prm", {"sft_model": "model", "prm_data": "prm_data"}),
    "dpo": ("dpo", ["dpo.lr=2e-3"], "dpo_model", {"sft_model": "model", "pref_data": "pref_data"}),
    # two rounds of 3 steps: round 1 sampled before step 4, from step 3's weights
    "iterative_dpo": ("dpo", ["dpo.lr=2e-3", "dpo.iterative.rounds=2", "dpo.iterative.prompts_per_round=8",
                              "dpo.iterative.samples_per_prompt=4", "dpo.iterative.max_new_tokens=12"],
                      "dpo_model", {"sft_model": "model", "pref_data": "pref_data", "prompts": "prompts"}),
    # two rounds of 4 steps, each a fresh engine: steps 1-4 and 5-8 of the stage's series
    "rs": ("rs", ["rs.enabled=true", "rs.rounds=2", "rs.max_steps=4", "rs.prompts_per_round=8", "rs.samples_per_prompt=4",
                  "rs.max_new_tokens=12"], "rs_model", {"sft_model": "model", "sft_data": "sft_data", "prompts": "prompts"}),
    "kd": ("kd", ["kd.enabled=true", "kd.teacher=dpo", "kd.student=sft"], "kd_model",
           {"sft_model": "model", "sft_data": "sft_data", "dpo_model": "base_model"}),
    "csft": ("csft", ["csft.enabled=true"], "csft_model", {"sft_model": "model", "sft_data": "sft_data"}),
}
MODULES = {"sft": sft, "rm": rm, "prm": prm, "dpo": dpo, "kd": kd, "csft": csft, "rs": rs}
ONE_ROUND = [case for case in CASES if case not in ("iterative_dpo", "rs")]


@pytest.fixture(scope="module")
def sources(prepared, length_reward, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_models")
    return {**prepared, "model": dropout_model(prepared["base_model"], root / "dropout"),
            "rm": save_random_rm(prepared["base_model"], root / "rm"), "reward_func": length_reward}


def run_case(case: str, sources, root, recorder=None):
    stage, settings, _, names = CASES[case]
    extra = {"csft": [f"reward.rm_paths=[{sources['rm']}]"], "iterative_dpo": [f"reward.func_path={sources['reward_func']}"],
             "rs": [f"reward.func_path={sources['reward_func']}"]}.get(case, [])
    cfg = load_config(None, [*FAST, *(f"{stage}.{s}" for s in STEPS), *settings, *extra])
    return MODULES[stage].run(make_ctx(stage, cfg, root, recorder), {k: sources[v] for k, v in names.items()})


@pytest.fixture(scope="module", params=list(CASES))
def uninterrupted(request, sources, tmp_path_factory):
    case = request.param
    rec = Recorder()
    result = run_case(case, sources, tmp_path_factory.mktemp(f"{case}_whole"), rec)
    return case, result, rec.rows


def check_resumed(case, uninterrupted, sources, root, resumed_from: int):
    """The rerun in `root` resumes (from `resumed_from`, a step of the stage's metric series) and ends as `uninterrupted`."""
    _, whole, rows = uninterrupted
    rec = Recorder()
    result = run_case(case, sources, root, rec)
    assert result.metrics.get("resumed_from_step", resumed_from) == resumed_from  # rs: each round its own
    output = CASES[case][2]
    assert_same_weights(whole.outputs[output], result.outputs[output])
    assert_same_histories(rows, rec.rows, resumed_from)
    assert {k: v for k, v in result.metrics.items() if k != "resumed_from_step"} == whole.metrics


@pytest.mark.parametrize("uninterrupted", [*ONE_ROUND, "iterative_dpo"], indirect=True)
def test_killed_at_a_logged_step_resumes_to_the_uninterrupted_runs_weights_and_metrics(uninterrupted, sources, tmp_path):
    """Killed logging step 3's eval (after its update; the last checkpoint is step 2's; iterative DPO: in its first
    round). A kill while step 4's checkpoint was being written is emulated too: a `step4` folder with a cut file,
    `latest` still naming step 2 (DeepSpeed writes it last); the rerun loads step 2 and writes step 4 over it."""
    case = uninterrupted[0]
    with pytest.raises(KeyboardInterrupt):
        run_case(case, sources, tmp_path, Recorder(fail_at=3))
    ckpts = tmp_path / "work" / "checkpoints"
    assert latest(ckpts) == "step2"
    (ckpts / "step4").mkdir()
    states = next((ckpts / "step2").glob("*model_states.pt"))
    (ckpts / "step4" / states.name).write_bytes(states.read_bytes()[:1000])
    check_resumed(case, uninterrupted, sources, tmp_path, resumed_from=2)


@pytest.mark.parametrize("uninterrupted", ["sft", "dpo", "iterative_dpo"], indirect=True)  # LM loss, pair loss, rounds
def test_killed_between_micro_batches_resumes_to_the_uninterrupted_runs_weights(uninterrupted, sources, tmp_path):
    """Killed in step 5's second micro-batch (the first one's gradients accumulated): the rerun redoes step 5
    from step 4's checkpoint (iterative DPO: in its second round, whose pairs it reloads)."""
    case = uninterrupted[0]
    with killed_between_micro_batches(5), pytest.raises(KeyboardInterrupt):
        run_case(case, sources, tmp_path, Recorder())
    assert latest(tmp_path / "work" / "checkpoints") == "step4"
    check_resumed(case, uninterrupted, sources, tmp_path, resumed_from=4)


@pytest.mark.parametrize("uninterrupted", ["rs"], indirect=True)
@pytest.mark.parametrize(("kill", "resumed_from"), [("log", 6), ("micro", 4)])
def test_killed_rs_resumes_mid_round_or_at_a_rounds_start_to_the_uninterrupted_run(uninterrupted, sources, tmp_path, kill,
                                                                                   resumed_from):
    """Killed logging step 7 (round 2's third step; its checkpoint: its step 2, the series' 6), or in round 2's
    first step (its fresh engine's, between two micro-batches): round 1 finished, round 2 has no checkpoint, and
    the rerun starts its training afresh, from the round's own seed as the uninterrupted run did."""
    with killed_between_micro_batches(1, occurrence=2) if kill == "micro" else nullcontext(), pytest.raises(KeyboardInterrupt):
        run_case("rs", sources, tmp_path, Recorder(fail_at=7 if kill == "log" else None))
    assert (tmp_path / "work" / "round0" / "policy" / "config.json").is_file()
    check_resumed("rs", uninterrupted, sources, tmp_path, resumed_from=resumed_from)


@pytest.mark.parametrize("uninterrupted", ["sft"], indirect=True)
def test_a_resume_without_the_rng_state_would_train_other_weights(uninterrupted, sources, tmp_path):
    """The check above can fail: resumed from step 2 with torch's generator not restored (seeded afresh),
    the dropout masks differ and so do the weights."""
    from stages.common import deepspeed_engine

    with pytest.raises(KeyboardInterrupt):
        run_case("sft", sources, tmp_path / "a", Recorder(fail_at=3))
    whole = uninterrupted[1]
    restore = deepspeed_engine.set_rng_state
    try:
        deepspeed_engine.set_rng_state = lambda state: torch.manual_seed(0)
        resumed = run_case("sft", sources, tmp_path / "a")
    finally:
        deepspeed_engine.set_rng_state = restore
    with pytest.raises(AssertionError, match="tensors differ"):
        assert_same_weights(whole.outputs["sft_model"], resumed.outputs["sft_model"])
