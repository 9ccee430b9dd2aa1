"""The stage contract's timing stamp: what the pipeline reports as a stage's own compute time."""

import time

from configs.schema import PipelineConfig
from stages.dag.contract import StageContext, StageResult, run_timed


def test_run_timed_stamps_the_span_of_the_stage_function(tmp_path):
    seen: dict[str, float] = {}

    def stage(ctx, inputs):
        seen["entered"] = time.time()
        seen["started_then"] = ctx.started  # set before the stage function runs
        seen["left"] = time.time()
        return StageResult(outputs={}, metrics={"x": 1.0})

    ctx = StageContext("sft", PipelineConfig(), tmp_path / "out", tmp_path / "work")
    before = time.time()
    result = run_timed(stage, ctx, {})
    after = time.time()
    start, end = result.compute_span
    assert ctx.started == start == seen["started_then"]  # where the trainer's time/first_step_s counts from
    # Unix seconds, stamped just before the stage function entered and just after it returned: the order of
    # these events, not how long any of them took
    assert before <= start <= seen["entered"] <= seen["left"] <= end <= after
    assert result.metrics == {"x": 1.0}
