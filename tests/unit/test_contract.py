"""The stage contract's timing stamp: what the pipeline reports as a stage's own compute time."""

import time

from stages.contract import StageResult, run_timed


def test_run_timed_stamps_the_span_of_the_stage_function():
    def stage(ctx, inputs):
        time.sleep(0.05)
        return StageResult(outputs={}, metrics={"x": 1.0})

    before = time.time()
    result = run_timed(stage, None, {})
    start, end = result.compute_span
    assert before <= start and end - start >= 0.05 and end <= time.time()
    assert result.metrics == {"x": 1.0}
