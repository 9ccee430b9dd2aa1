"""The suite's shuffle seed (tests/shuffle_seed.py, chosen in tests/conftest.py): 20261128 for an even commit
count, 20261207 for an odd one, the first outside a git checkout; a seed on the command line, or pytest-randomly
turned off, still decides."""

import subprocess
from pathlib import Path

import pytest

from tests.shuffle_seed import commit_count, seed_for

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(("count", "seed"), [(0, 20261128), (1, 20261207), (540, 20261128), (541, 20261207), (None, 20261128)])
def test_the_commit_counts_parity_picks_the_seed(count, seed):
    assert seed_for(count) == seed


def git_commits(repo, n: int) -> None:
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for i in range(n):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                        "-m", f"c{i}"], check=True)


def test_the_commit_count_is_gits_and_none_outside_a_checkout(tmp_path):
    assert commit_count(tmp_path) is None
    git_commits(tmp_path / "repo", 3)
    assert commit_count(tmp_path / "repo") == 3


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def suite(pytester):
    """A suite of three tests with this project's seed hooks, run by pytest in a process of its own (torch, which
    pytest-randomly's DeepSpeed seeder imports, cannot be imported twice in one process)."""
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                          "from tests.conftest import pytest_configure, pytest_report_header, pytest_terminal_summary\n")
    pytester.makepyfile(test_order="def test_a(): pass\ndef test_b(): pass\ndef test_c(): pass\n")
    return pytester


def header_seeds(result) -> list[str]:
    return [line.removeprefix("Using --randomly-seed=") for line in result.outlines if line.startswith("Using --randomly-seed=")]


def test_an_odd_commit_count_shuffles_with_the_second_seed_and_says_why(suite):
    git_commits(suite.path, 1)
    result = suite.runpytest_subprocess("-p", "randomly")
    result.assert_outcomes(passed=3)
    assert header_seeds(result) == ["20261207"]
    result.stdout.fnmatch_lines(["shuffle seed 20261207: HEAD has 1 commits (odd)*",
                                 "*this order again: --randomly-seed=20261207"])


def test_a_seed_on_the_command_line_wins(suite):
    git_commits(suite.path, 1)
    result = suite.runpytest_subprocess("-p", "randomly", "--randomly-seed=5")
    result.assert_outcomes(passed=3)
    assert header_seeds(result) == ["5"] and "shuffle seed" not in result.stdout.str()


def test_without_pytest_randomly_the_file_order(suite):
    git_commits(suite.path, 1)
    result = suite.runpytest_subprocess("-p", "no:randomly", "-v")
    result.assert_outcomes(passed=3)
    assert header_seeds(result) == [] and "shuffle seed" not in result.stdout.str()
    ran = [line.split("::")[1].split()[0] for line in result.outlines if line.startswith("test_order.py::")]
    assert ran == ["test_a", "test_b", "test_c"]
