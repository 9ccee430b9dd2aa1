"""The pipeline benchmark's arithmetic and memory sampler (the cold run itself is minutes: run it
with `python -m benchmarks run pipeline`)."""

import subprocess
import sys

import pytest

from benchmarks.pipeline import PipelineRun, StageSpan, covered, report, sample_memory

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)


def test_covered_counts_overlapping_spans_once():
    assert covered([]) == 0
    assert covered([(0, 2), (1, 3), (5, 6)]) == 4  # [0, 3] and [5, 6]
    assert covered([(5, 6), (0, 10)]) == 10  # nested


def test_report_splits_wall_time_into_stage_compute_and_orchestration():
    stages = [StageSpan("sft", run=(10, 30), compute=(12, 28)), StageSpan("rm", run=(30, 40), compute=(31, 39))]
    memory = [(11, 500.0), (20, 900.0), (35, 700.0), (45, 400.0)]
    runs = [PipelineRun("cold", 50.0, stages, memory), PipelineRun("warm", 5.0, [], [(1, 300.0)])]
    rep = report(runs, 1)
    cold, warm, sft, rm = rep.rows
    assert cold[1:] == ["50.0", "24.0", "26.0", "52%", "900"]  # 16 + 8 s computing of 50
    assert warm[1:] == ["5.0", "0.0", "5.0", "100%", "300"]
    assert sft[1:] == ["20.0", "16.0", "4.0", "20%", "900"]  # its peak: the samples while its run was open
    assert rm[1:] == ["10.0", "8.0", "2.0", "20%", "700"]


def test_memory_sampler_follows_a_process_and_its_children():
    child = "import time; x = bytearray(64 * 2**20); time.sleep(2.5)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    proc = subprocess.Popen([sys.executable, "-c", parent])
    sampler = sample_memory(proc)
    proc.wait()
    samples = sampler.result()
    assert len(samples) >= 2
    assert max(mib for _, mib in samples) > 64  # the child's buffer counts
    assert [t for t, _ in samples] == sorted(t for t, _ in samples)

