"""benchmarks/time_to_quality.py: a trial's time to quality is its clock at its first eval at or above
the start's accuracy plus the target gain, and a system that never got there has no median (only "not
within the budget")."""

from benchmarks import time_to_quality as ttq


def test_the_first_eval_at_or_above_the_start_plus_the_gain_gives_the_step_and_the_clock():
    start, gain = 0.3, ttq.TARGET_GAIN
    curve = [(0, 0.0, start), (5, 3.0, start + gain - 0.01), (10, 6.5, start + gain), (15, 9.0, start + gain + 0.1)]
    assert ttq.first_at_target(curve) == (10, 6.5)
    assert ttq.first_at_target(curve[:2]) == (None, None)
    higher = [(0, 0.0, 0.35), *curve[1:]]  # the same curve from a better start has not gained enough
    assert ttq.first_at_target(higher) == (15, 9.0)


def test_a_seed_that_never_reached_the_target_leaves_no_median():
    assert ttq.median_or_none([3.0, 1.0, 2.0]) == 2.0
    assert ttq.median_or_none([3.0, None, 2.0]) is None


def trial(system: str, seconds: float | None) -> dict:
    curve = [(0, 0.0, 0.2), (5, 2.5, 0.25), (10, 5.0, 0.2 + ttq.TARGET_GAIN if seconds else 0.25)]
    return {"system": system, "curve": curve, "seconds_to_target": seconds, "steps_to_target": 10 if seconds else None,
            "samples_per_prompt": 4}


def test_the_table_gives_the_ratio_only_when_both_systems_got_there(monkeypatch):
    monkeypatch.setattr(ttq.importlib.metadata, "version", lambda _: "1.13.0")
    both = ttq.report(10, 1, {"ours": [trial("ours", 5.0)], "trl": [trial("trl", 10.0)]})
    assert both.data["ratio"] == 0.5 and both.rows[-1][:2] == ["ours / TRL", "0.50"]
    missed = ttq.report(10, 1, {"ours": [trial("ours", 5.0)], "trl": [trial("trl", None)]})
    assert missed.data["ratio"] is None and missed.rows[1][1] == "not within 10 steps"
