"""benchmarks/gpu_smoke.py runs its stage steps on a CPU with a small model (the code paths a GPU run
takes, without the numbers that only a GPU gives)."""

import json

import pytest

from benchmarks import gpu_smoke

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)


def test_gpu_smoke_runs_every_stage_under_zero_2_and_3(tmp_path, capsys):
    out = tmp_path / "smoke.json"
    assert gpu_smoke.main(["--device", "cpu", "--tiny", "--steps", "1", "--seq-len", "16", "--batch", "2",
                           "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["stage"], r["zero"]) for r in rows] == [(s, z) for z in (2, 3) for s in ("sft", "rm", "dpo", "rl")]
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in rows)  # no GPU: no MFU, no GPU memory
    assert "| rl | 3 |" in capsys.readouterr().out
