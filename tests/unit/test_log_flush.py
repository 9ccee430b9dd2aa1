"""Before Ray shuts down at the end of a run, its log monitor gets LOG_FLUSH_S after the last stage's
Ray work to forward that work's last lines; the time the flow spent publishing since counts."""

from __future__ import annotations

from flows.services.ray_cluster import LOG_FLUSH_S, log_flush_left


def test_the_wait_is_what_is_left_of_the_flush_after_the_last_work():
    assert log_flush_left(work_ended=100.0, now=100.0) == LOG_FLUSH_S
    assert log_flush_left(work_ended=100.0, now=100.0 + 0.25 * LOG_FLUSH_S) == 0.75 * LOG_FLUSH_S
    assert log_flush_left(work_ended=100.0, now=100.0 + 2 * LOG_FLUSH_S) == 0.0


def test_no_wait_when_no_stage_ran_on_ray_and_never_more_than_the_flush():
    assert log_flush_left(work_ended=float("-inf"), now=5.0) == 0.0  # every stage cached
    assert log_flush_left(work_ended=10.0, now=9.0) == LOG_FLUSH_S  # a clock read before the work's end
