"""Wall time of the tiny pipeline through the real CLI: cold (empty store) and warm (all cached).

    python -m benchmarks.pipeline_walltime [--repeats N] [KEY=VALUE ...]

Each repeat uses a fresh state folder for the cold run, then re-runs once warm. Per-stage times
come from the MLflow store the run wrote (the summary's stage timings), so the table also shows
how much of the wall time is orchestration (Prefect, Ray start, MLflow, artifact copies).
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


def run_once(workdir: Path, overrides: list[str]) -> tuple[float, dict[str, float], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PREFECT_API_URL")}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", *overrides], cwd=workdir, env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"rlhf run failed:\n{proc.stderr[-2000:]}")
    return wall, stage_seconds(workdir), proc.stdout


def stage_seconds(workdir: Path) -> dict[str, float]:
    """Each stage's own run time in the newest pipeline run (0 for a cached stage)."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / '.rlhf' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlhf-pipeline")
    parent = client.search_runs([exp.experiment_id], "tags.`rlhf.kind` = 'pipeline'",
                                order_by=["attributes.start_time DESC"])[0]
    seconds = {}
    for key, value in parent.data.tags.items():
        if not key.startswith("stage."):
            continue
        status, *run = value.split()
        stage = key.removeprefix("stage.")
        if status == "ran" and run:
            info = client.get_run(run[0]).info
            seconds[stage] = (info.end_time - info.start_time) / 1000
        else:
            seconds[stage] = 0.0
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    rows, cold_summary = [], ""
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="rlhf-bench-") as tmp:
            for mode in ("cold", "warm"):
                wall, stages, stdout = run_once(Path(tmp), args.overrides)
                rows.append({"repeat": i, "mode": mode, "wall_s": wall, "stages_s": stages})
                if mode == "cold":
                    cold_summary = stdout[stdout.rfind("rlhf-pipeline run "):]
    print(f"# tiny pipeline wall time ({datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs)\n")
    print("| run | wall time (s) | stage compute (s) | orchestration share | per stage (s) |")
    print("|---|---|---|---|---|")
    for r in rows:
        compute = sum(r["stages_s"].values())
        per_stage = ", ".join(f"{k} {v:.1f}" for k, v in r["stages_s"].items())
        print(f"| {r['mode']} #{r['repeat']} | {r['wall_s']:.1f} | {compute:.1f} | {1 - compute / r['wall_s']:.0%} | {per_stage} |")
    print("\nLast cold run's summary:\n" + cold_summary)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
