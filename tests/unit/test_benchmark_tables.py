"""benchmarks/tables.py: every marked table in the docs is what its JSON renders (`python -m benchmarks report`),
and a marker naming a file or benchmark that is not there is one line naming the page and the file."""

import json

import pytest

from benchmarks import tables


def test_the_docs_tables_are_what_their_json_renders():
    assert tables.stale() == [], "run `python -m benchmarks report`"


def test_a_marker_is_filled_from_its_file_and_only_its_block_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    result = {"date": "2026-01-02", "machine": {"cpus": 2, "platform": "Linux", "torch": "2.0", "transformers": "5.0"},
              "benchmarks": {"toy-1": {"title": "A toy", "columns": ["a", "b"], "rows": [["1", "2"]]}}}
    (tmp_path / "r.json").write_text(json.dumps(result))
    page = "before\n<!-- table: r.json#toy-1 -->\nstale\n<!-- /table -->\nafter\n"
    assert tables.refreshed(page, "p.md") == (
        "before\n<!-- table: r.json#toy-1 -->\nA toy. Measured 2026-01-02 on 2 CPUs (Linux), torch 2.0, transformers 5.0.\n\n"
        "| a | b |\n|---|---|\n| 1 | 2 |\n<!-- /table -->\nafter\n")
    with pytest.raises(SystemExit, match=r"^p.md: the table of r.json: KeyError: .*no benchmark 'other' in this file \(it holds: toy-1\)"):
        tables.refreshed("<!-- table: r.json#other -->\n<!-- /table -->", "p.md")
    with pytest.raises(SystemExit, match=r"^p.md: the table of gone.json: FileNotFoundError"):
        tables.refreshed("<!-- table: gone.json -->\n<!-- /table -->", "p.md")


def test_the_suite_table_lists_runs_newest_first_in_minutes():
    from benchmarks.suite import report

    result = {"about": "Runs", "runs": [
        {"when": "2026-11-28 15:00", "machine": "m", "how": "ci", "commit": "abc1234", "passed": 10, "total_s": 2391,
         "pytest_s": 2263, "notes": "n"},
        {"when": "2026-12-07 03:00", "machine": "m", "how": "tree", "passed": 12, "pytest_s": 1322}]}
    assert report(result).splitlines()[2:] == [
        "| when | machine | how | commit | tests | in all | pytest | notes |", "|---|---|---|---|---|---|---|---|",
        "| 2026-12-07 03:00 | m | `pytest -q` in the tree |  | 12 |  | 22m02s |  |",
        "| 2026-11-28 15:00 | m | clean clone, `.ci/run` | abc1234 | 10 | 39m51s | 37m43s | n |"]
