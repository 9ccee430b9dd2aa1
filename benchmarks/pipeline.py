"""The tiny pipeline end to end through the real CLI: wall time cold (empty store) and warm (all
cached), how much of it is orchestration, and the memory each stage needs.

    python -m benchmarks run pipeline [--repeats N] [--overrides KEY=VALUE ...]

Each repeat runs `python -m flows.cli.main run` twice in a fresh folder: cold, then warm. Wall time is the
command's, start-up included. A stage's compute time is the span of its stage function (in its Ray
worker, or the driver for RL: the `rlhf.compute_span` tag of its MLflow run); orchestration is the
rest of the wall time: Python and Prefect start-up, Ray start, actor start-up, input downloads,
publishing and registering the checkpoints, MLflow logging, the summary. Stages that overlap count
once.

Memory is the proportional set size (PSS: shared pages split among the processes that map them) of
the CLI process and everything it starts (Prefect server, Ray, the stage workers), sampled once a
second; a stage's peak is the largest sample while its MLflow run was open. (Reading PSS for the ten
or so processes of a run costs a few per cent of one core.)
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.report import Report, RunOptions

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_EVERY_S = 1.0
CLEAN_ENV = ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PREFECT_API_URL")


@dataclass
class StageSpan:
    stage: str
    run: tuple[float, float]  # the stage's MLflow run, start to end (Unix seconds)
    compute: tuple[float, float]  # the stage function


@dataclass
class PipelineRun:
    mode: str  # cold | warm
    wall_s: float
    stages: list[StageSpan]
    memory: list[tuple[float, float]] = field(default_factory=list)  # (Unix time, PSS MiB)

    @property
    def compute_s(self) -> float:
        return covered([s.compute for s in self.stages])

    @property
    def peak_mib(self) -> float:
        return max((m for _, m in self.memory), default=0.0)

    def peak_during(self, span: tuple[float, float]) -> float:
        return max((m for t, m in self.memory if span[0] <= t <= span[1]), default=0.0)


def pipeline(options: RunOptions) -> dict[str, Report]:
    runs: list[PipelineRun] = []
    repeats = options.repeats_or(1)  # a cold run is minutes
    folders = [options.workdir / f"pipeline-{repeat}" for repeat in range(repeats)]
    for repeat, folder in enumerate(folders):
        folder.mkdir()
        for mode in ("cold", "warm"):
            run = run_cli(folder, mode, options.overrides)
            runs.append(run)
            print(f"[pipeline] {mode} run {repeat + 1}/{repeats}: {run.wall_s:.1f} s wall, "
                  f"{run.compute_s:.1f} s in stage functions, peak {run.peak_mib:,.0f} MiB", flush=True)
    return {"pipeline": report(runs, repeats), "pipeline-learned": learned(folders[0])}


def run_cli(folder: Path, mode: str, overrides: list[str]) -> PipelineRun:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    log = folder / f"{mode}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli.main", "run", *overrides], cwd=folder, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
        memory = sample_memory(proc)
        proc.wait()
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"rlhf run ({mode}) failed, exit {proc.returncode}:\n{log.read_text()[-3000:]}")
    return PipelineRun(mode, wall, stage_spans(folder), memory.result())


class sample_memory:
    """PSS of a process and all its descendants, once a second, in a background thread."""

    def __init__(self, proc: subprocess.Popen):
        import psutil

        self.samples: list[tuple[float, float]] = []
        self.root = psutil.Process(proc.pid)
        self.thread = threading.Thread(target=self.loop, args=(proc,), daemon=True)
        self.thread.start()

    def loop(self, proc: subprocess.Popen) -> None:
        import psutil

        while proc.poll() is None:
            total = 0
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for p in processes:
                with contextlib.suppress(psutil.Error):  # exited between the listing and the read
                    total += p.memory_full_info().pss
            self.samples.append((time.time(), total / 2**20))
            time.sleep(SAMPLE_EVERY_S)

    def result(self) -> list[tuple[float, float]]:
        self.thread.join()
        return self.samples


def stage_runs(folder: Path, statuses: tuple[str, ...] = ("ran",)) -> dict:
    """stage -> its MLflow run, for the stages of the folder's newest pipeline run with one of `statuses`
    (a cached stage's run is the one that made its outputs)."""
    from mlflow import MlflowClient

    from flows.cli.runs import pipeline_runs, stage_outcomes

    client = MlflowClient(f"sqlite:///{folder / '.rlhf' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlhf-pipeline")
    if exp is None:
        raise LookupError(f"{folder}: no pipeline run in its MLflow store")
    (parent,) = pipeline_runs(client, exp.experiment_id, 1)
    return {stage: client.get_run(run_id) for stage, (status, run_id) in stage_outcomes(parent).items()
            if status in statuses and run_id is not None}


def stage_spans(folder: Path) -> list[StageSpan]:
    """The stages that ran in the folder's newest pipeline run, from their MLflow runs."""
    from artifacts import run_tags

    spans = []
    for stage, run in stage_runs(folder).items():
        start, end = (float(t) for t in run.data.tags[run_tags.TAG_COMPUTE_SPAN].split())
        spans.append(StageSpan(stage, (run.info.start_time / 1000, run.info.end_time / 1000), (start, end)))
    return sorted(spans, key=lambda s: s.run[0])


def covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def report(runs: list[PipelineRun], repeats: int) -> Report:
    columns = ["run / stage", "wall s", "stage compute s", "orchestration s", "orchestration share", "peak PSS MiB"]
    rows: list[list[str]] = []
    data: dict[str, list[dict]] = {"runs": []}
    for mode, label in (("cold", "cold: empty store, every stage runs"), ("warm", "warm: identical re-run, all cached")):
        of_mode = [r for r in runs if r.mode == mode]
        wall = statistics.median(r.wall_s for r in of_mode)
        compute = statistics.median(r.compute_s for r in of_mode)
        share = statistics.median(1 - r.compute_s / r.wall_s for r in of_mode)
        peak = max(r.peak_mib for r in of_mode)
        rows.append([label, f"{wall:.1f}", f"{compute:.1f}", f"{wall - compute:.1f}", f"{share:.0%}", f"{peak:,.0f}"])
    cold = next(r for r in runs if r.mode == "cold")
    for span in cold.stages:  # the first cold run, stage by stage: its MLflow run's length vs its compute
        run_s, compute_s = span.run[1] - span.run[0], span.compute[1] - span.compute[0]
        rows.append([f"· {span.stage} (its MLflow run)", f"{run_s:.1f}", f"{compute_s:.1f}", f"{run_s - compute_s:.1f}",
                     f"{1 - compute_s / run_s:.0%}", f"{cold.peak_during(span.run):,.0f}"])
    for r in runs:
        data["runs"].append({"mode": r.mode, "wall_s": r.wall_s, "compute_s": r.compute_s, "peak_pss_mib": r.peak_mib,
                             "stages": [{"stage": s.stage, "run": s.run, "compute": s.compute,
                                         "peak_pss_mib": r.peak_during(s.run)} for s in r.stages]})
    title = (f"Tiny pipeline through `rlhf run`: cold and warm wall time, orchestration share and peak memory "
             f"(median of {repeats} repeat(s); stage rows from the first cold run)")
    return Report(title, columns, rows, data=data)


# what the eval stage calls each model it scores, and how the table names it
LEARNED_MODELS = {"base": "base (random init)", "sft": "SFT", "rl": "RL (the preset's GRPO)", "dpo": "DPO (offline)"}


def learned(folder: Path) -> Report:
    """What the first cold run's models score: the eval stage's held-out accuracies per model and the reward
    models' own eval accuracy (from the run's MLflow store; the warm run after it reads them cached)."""
    runs = stage_runs(folder, ("ran", "cached"))
    scores = runs["eval"].data.metrics
    rows = [[label, f"{scores[f'{model}/accuracy']:.3f}", f"{scores[f'{model}/sampled_accuracy']:.3f}"]
            for model, label in LEARNED_MODELS.items() if f"{model}/accuracy" in scores]
    rows.append(["RM: pairwise accuracy on held-out pairs", f"{runs['rm'].data.metrics['eval/accuracy']:.3f}", ""])
    rows.append(["PRM: step accuracy on held-out solutions", f"{runs['prm'].data.metrics['eval/step_accuracy']:.3f}", ""])
    title = ("What the tiny preset's cold `rlhf run` learned: held-out accuracy of each model the eval stage scores "
             "(greedy, and sampled: 4 answers per prompt at temperature 1), and the reward models' own eval")
    return Report(title, ["model", "greedy", "sampled"], rows, data={"eval": scores})
