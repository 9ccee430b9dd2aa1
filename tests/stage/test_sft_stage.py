import pytest
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from stages.dag.contract import run_timed
from stages.sft import stage as sft
from tests.stage.conftest import Recorder, make_ctx
from tests.stage.resume_runs import assert_same_weights

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)


@pytest.fixture(scope="module")
def trained(fast_config, prepared, tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    rec = Recorder()
    result = run_timed(sft.run, make_ctx("sft", fast_config, root, rec), {k: prepared[k] for k in ("base_model", "sft_data")})
    return result, rec


def test_the_time_to_the_first_step_is_logged_once_within_the_stage_span(trained):
    result, rec = trained
    first = [(s, m["time/first_step_s"]) for s, m in rec.rows if "time/first_step_s" in m]
    assert result.compute_span is not None and len(first) == 1 and first[0][0] == 1
    assert 0 < first[0][1] < result.compute_span[1] - result.compute_span[0]


def test_loss_falls_and_metrics_are_logged_per_step(trained):
    result, rec = trained
    losses = [(s, m["train/loss"]) for s, m in rec.rows if "train/loss" in m]
    assert [s for s, _ in losses] == [10, 20, 30]
    assert losses[-1][1] < losses[0][1] - 1.0  # from ~3.4 to ~2.0 in 30 steps
    assert [s for s, m in rec.rows if "eval/loss" in m] == [10, 20, 30]
    assert result.metrics["eval/loss"] < 2.0


def test_checkpoint_loads_with_plain_transformers_and_generates(trained):
    result, _ = trained
    path = result.outputs["sft_model"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = tok(tok.apply_chat_template([{"role": "user", "content": "Compute 3+4"}], tokenize=False,
                                      add_generation_prompt=True), return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids["input_ids"].shape[1]


def test_prompt_tokens_carry_no_loss(fast_config, prepared):
    """Loss only on the response: labels are -100 over each row's prompt segment."""
    from stages.common.checkpoint import load_tokenizer
    from stages.data.prepared import read_split
    from stages.data.tokenization import encode_segments

    tok = load_tokenizer(prepared["base_model"])
    row = read_split(prepared["sft_data"], "train")[0]
    ids, labels = encode_segments(tok, row["texts"], row["train"])
    n_prompt = len(tok(row["texts"][0], add_special_tokens=False)["input_ids"])
    assert labels[:n_prompt] == [-100] * n_prompt and labels[n_prompt:] == ids[n_prompt:]


def test_killed_run_resumes_from_last_checkpoint_and_matches_uninterrupted(fast_config, prepared, trained, tmp_path, capsys):
    inputs = {k: prepared[k] for k in ("base_model", "sft_data")}
    ctx = make_ctx("sft", fast_config, tmp_path, Recorder(fail_at=20))  # checkpoints at 10 and 20; dies logging 20
    with pytest.raises(KeyboardInterrupt):
        sft.run(ctx, inputs)
    assert (tmp_path / "work" / "checkpoints" / "latest").read_text().strip() == "step10"

    ctx.log_metrics = Recorder()
    resumed = sft.run(ctx, inputs)
    assert "[sft] resumed from step 10/30" in capsys.readouterr().out
    assert resumed.metrics["resumed_from_step"] == 10
    assert [s for s, m in ctx.log_metrics.rows if "train/loss" in m] == [20, 30]

    assert_same_weights(trained[0].outputs["sft_model"], resumed.outputs["sft_model"])  # bit for bit


def test_max_checkpoints_keeps_the_newest_resumable_checkpoints(fast_config, prepared, trained, tmp_path):
    """sft.max_checkpoints (OpenRLHF's --ckpt.max_num) 2 of the checkpoints at steps 5, 10 and 15 of 20: the newest
    two stay; the default keeps one (the module's run: step 20 of 30)."""
    cfg = fast_config.model_copy(update={"sft": fast_config.sft.model_copy(update={"max_steps": 20, "save_every": 5,
                                                                                   "max_checkpoints": 2})})
    sft.run(make_ctx("sft", cfg, tmp_path, Recorder()), {k: prepared[k] for k in ("base_model", "sft_data")})
    assert {p.name for p in (tmp_path / "work" / "checkpoints").iterdir() if p.is_dir()} == {"step10", "step15"}
    kept = trained[0].outputs["sft_model"].parent.parent / "work" / "checkpoints"
    assert {p.name for p in kept.iterdir() if p.is_dir()} == {"step20"}


def test_packed_batches_train_as_padded_ones(fast_config, prepared, trained, tmp_path):
    """`sft.packing`: the same micro-batches as one padding-free row each give the padded run's losses
    and weights (only the float summation order differs)."""
    from configs import load_config
    from tests.stage.conftest import FAST

    rec = Recorder()
    packed = sft.run(make_ctx("sft", load_config(None, [*FAST, "sft.packing=true"]), tmp_path, rec),
                     {k: prepared[k] for k in ("base_model", "sft_data")})
    padded_losses = [m["train/loss"] for _, m in trained[1].rows if "train/loss" in m]
    packed_losses = [m["train/loss"] for _, m in rec.rows if "train/loss" in m]
    assert packed_losses == pytest.approx(padded_losses, abs=1e-4)
    full = load_file(trained[0].outputs["sft_model"] / "model.safetensors")
    again = load_file(packed.outputs["sft_model"] / "model.safetensors")
    assert max(float((full[k] - again[k]).abs().max()) for k in full) < 1e-4



def test_a_finished_stage_leaves_no_engine_once_released(prepared, tmp_path):
    """DeepSpeed's hooks keep an engine, its model and optimizer state reachable after the stage returns;
    `release_engines`, which a pooled worker calls between stages, frees them (on a GPU: the memory the
    next stage in the process needs)."""
    import gc
    import weakref

    from configs import load_config
    from stages.common import deepspeed_engine
    from tests.stage.conftest import FAST

    def engines() -> list:
        gc.collect()
        return [o for o in gc.get_objects() if type(o).__name__ == "DeepSpeedEngine"]

    deepspeed_engine.release_engines()
    # Earlier tests in this process may have left ZeRO-3 engines that no release frees; count only ours.
    earlier = {id(engine) for engine in engines()}
    cfg = load_config(None, [*FAST, "sft.max_steps=2", "sft.eval_every=2", "sft.save_every=100", "infra.zero_stage=2"])
    sft.run(make_ctx("sft", cfg, tmp_path), {k: prepared[k] for k in ("base_model", "sft_data")})
    ours = [engine for engine in engines() if id(engine) not in earlier]
    assert len(ours) == 1  # the stage returned, its ZeRO engine is still reachable
    engine = weakref.ref(ours[0])
    weight = weakref.ref(next(ours[0].module.parameters()))
    del ours
    assert deepspeed_engine.release_engines() == 0  # none left reachable
    gc.collect()
    assert engine() is None and weight() is None
