"""Async training's queue: which steps are drawn when, and what a checkpoint keeps of it."""

from stages.rl.drawn_ahead import Drawn, DrawnAhead


def fill(ahead: DrawnAhead, step: int, total: int, cursor: int, batch: int) -> int:
    """What the stage does during `step`: queue each step `to_draw` names, its prompts from `cursor` on."""
    for queued in ahead.to_draw(step, total):
        ahead.add(Drawn(queued, cursor, step, []))
        cursor += batch
    return cursor


def test_synchronous_training_draws_nothing_ahead():
    ahead = DrawnAhead(0)
    assert ahead.to_draw(0, 10) == [] and ahead.take(0) is None


def test_a_queue_of_two_keeps_two_steps_drawn_and_stops_at_the_last_step():
    ahead, cursor = DrawnAhead(2), 4  # step 0 drew its own 4 prompts
    cursor = fill(ahead, 0, 4, cursor, 4)
    assert [(d.step, d.start, d.updates) for d in ahead.queue] == [(1, 4, 0), (2, 8, 0)]
    assert ahead.take(2) is None  # only the next step's round is taken
    first = ahead.take(1)
    assert first is not None and (first.step, first.start) == (1, 4)
    cursor = fill(ahead, 1, 4, cursor + 4, 4)  # step 1 refilled 4 prompts from the cursor, after the queued ones
    assert [(d.step, d.start, d.updates) for d in ahead.queue] == [(2, 8, 0), (3, 16, 1)]
    assert cursor == 20  # the queued starts (8, 16) are the line above's
    ahead.take(2)
    assert ahead.to_draw(2, 4) == []  # step 3 is the run's last: nothing past it


def test_a_queue_longer_than_the_run_draws_every_remaining_step_at_once():
    assert DrawnAhead(4).to_draw(0, 3) == [1, 2]
