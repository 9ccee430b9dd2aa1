"""Wall time of the tiny pipeline through the real CLI: cold (empty store) and warm (all cached).

    python -m benchmarks.pipeline_walltime [--repeats N] [KEY=VALUE ...]

Each repeat uses a fresh state folder for the cold run, then re-runs once warm. Stage times come
from the MLflow runs the pipeline wrote (start to end, so a stage queued for Ray resources counts its
wait); the orchestration share is the wall time during which no stage run was open (Prefect and Ray
start-up, the cache look-ups, the summary).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(workdir: Path, overrides: list[str]) -> tuple[float, dict[str, float], float, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PREFECT_API_URL")}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", *overrides], cwd=workdir, env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"rlhf run failed:\n{proc.stderr[-2000:]}")
    return wall, *stage_seconds(workdir), proc.stdout


def stage_seconds(workdir: Path) -> tuple[dict[str, float], float]:
    """Each stage's run time in the newest pipeline run (0 for a cached stage), and the time during
    which at least one stage ran (stages that run side by side overlap; this counts them once)."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / '.rlhf' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlhf-pipeline")
    parent = client.search_runs([exp.experiment_id], "tags.`rlhf.kind` = 'pipeline'",
                                order_by=["attributes.start_time DESC"])[0]
    seconds, spans = {}, []
    for key, value in parent.data.tags.items():
        if not key.startswith("stage."):
            continue
        status, *run = value.split()
        stage = key.removeprefix("stage.")
        seconds[stage] = 0.0
        if status == "ran" and run:
            info = client.get_run(run[0]).info
            seconds[stage] = (info.end_time - info.start_time) / 1000
            spans.append((info.start_time / 1000, info.end_time / 1000))
    return seconds, covered(spans)


def covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    rows, cold_summary = [], ""
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="rlhf-bench-") as tmp:
            for mode in ("cold", "warm"):
                wall, stages, busy, stdout = run_once(Path(tmp), args.overrides)
                rows.append({"repeat": i, "mode": mode, "wall_s": wall, "stages_s": stages, "busy_s": busy})
                if mode == "cold":
                    cold_summary = stdout[stdout.rfind("rlhf-pipeline run "):]
    print(f"# tiny pipeline wall time ({datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs)\n")
    print("| run | wall time (s) | some stage running (s) | orchestration share | per stage run (s) |")
    print("|---|---|---|---|---|")
    for r in rows:
        per_stage = ", ".join(f"{k} {v:.1f}" for k, v in r["stages_s"].items())
        share = 1 - r["busy_s"] / r["wall_s"]
        print(f"| {r['mode']} #{r['repeat']} | {r['wall_s']:.1f} | {r['busy_s']:.1f} | {share:.0%} | {per_stage} |")
    print("\nLast cold run's summary:\n" + cold_summary)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
