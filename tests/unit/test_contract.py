"""The stage contract's timing stamp: what the pipeline reports as a stage's own compute time."""

import time

from configs.schema import PipelineConfig
from stages.dag.contract import StageContext, StageResult, run_timed


def test_run_timed_stamps_the_span_of_the_stage_function(tmp_path):
    def stage(ctx, inputs):
        time.sleep(0.05)
        return StageResult(outputs={}, metrics={"x": 1.0})

    before = time.time()
    ctx = StageContext("sft", PipelineConfig(), tmp_path / "out", tmp_path / "work")
    result = run_timed(stage, ctx, {})
    start, end = result.compute_span
    assert ctx.started == start  # where the trainer's time/first_step_s counts from
    assert before <= start and end - start >= 0.05 and end <= time.time()
    assert result.metrics == {"x": 1.0}
