"""`python -m benchmarks run grpo --systems ...`: a subset of the GRPO comparison's systems, checked before
anything runs."""

import pytest

from benchmarks.__main__ import main
from benchmarks.grpo_compare import systems_problem


def test_a_subset_with_ours_and_trl_is_accepted():
    assert systems_problem(["grpo"], ["ours", "trl", "trl_ray"]) is None
    assert systems_problem(["grpo", "grpo-50m"], ["ours", "trl"]) is None


@pytest.mark.parametrize(("names", "systems", "says"), [
    (["sft"], ["ours", "trl"], "only grpo and grpo-50m run a choice of systems, not sft"),
    # `run --systems ours trl grpo`: argparse gives the name to --systems, and no benchmark is named
    (["pipeline", "grpo"], ["ours", "trl", "grpo"], "grpo is a benchmark, not a system: name the benchmarks before --systems"),
    (["grpo"], ["ours", "trl_ray"], "trl must be among them"),
    (["grpo"], ["trl"], "ours must be among them"),
    (["grpo-50m"], ["ours", "trl", "ours_actors"], "grpo-50m has no system ours_actors (its systems: ours ours_padded trl)"),
])
def test_a_subset_that_cannot_run_is_named(names, systems, says):
    assert says in systems_problem(names, systems, ["pipeline", "sft", "grpo", "grpo-50m"])


def test_the_cli_refuses_it_in_one_line_before_running_anything(tmp_path, capsys):
    out = tmp_path / "benchmarks.json"
    with pytest.raises(SystemExit) as stop:
        main(["run", "grpo", "--systems", "ours", "typo", "trl", "--out", str(out)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "--systems: grpo has no system typo (its systems: ours ours_recompute ours_padded ours_actors trl trl_ray)")
    assert not out.exists()


def test_a_benchmark_named_after_the_systems_is_told_to_come_first(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["run", "--systems", "ours", "trl", "grpo", "--out", str(tmp_path / "benchmarks.json")])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "--systems: grpo is a benchmark, not a system: name the benchmarks before --systems")
