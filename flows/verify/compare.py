"""Where a stage's rerun first departs from its original run: the pure comparison of two runs' output files
(path -> SHA-256) and metric histories (key -> [(step, value)]), and the one line that reports it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

History = Sequence[tuple[int, float]]

# what may differ between two runs of the same work: when and how fast things ran, and the machine's readings
UNTIMED_PREFIXES = ("time/", "system/")
TIMING_SUFFIXES = ("_s", "per_s")
RESUMED = "resumed_from_step"  # logged by a stage that resumed from a checkpoint: bookkeeping, not its work


def timing(key: str) -> bool:
    """A metric of when or how fast, not of what was computed (`time/compute_s`, `system/cpu_utilization_percentage`,
    `rl/samples_per_s`, `sft/step_s`)."""
    return key.startswith(UNTIMED_PREFIXES) or key.rsplit("/", 1)[-1].endswith(TIMING_SUFFIXES)


def first_file_difference(original: Mapping[str, str], rerun: Mapping[str, str]) -> str | None:
    """The first path (in sorted order) whose digest differs or which only one side has, with a word on
    which side lacks it; None when both hold the same files with the same contents."""
    for path in sorted(set(original) | set(rerun)):
        if path not in rerun:
            return f"{path} (missing in the rerun)"
        if path not in original:
            return f"{path} (only in the rerun)"
        if original[path] != rerun[path]:
            return path
    return None


@dataclass(frozen=True)
class MetricDifference:
    key: str
    step: int
    original: float | None  # None: that side has no value there
    rerun: float | None

    def text(self) -> str:
        def shown(value: float | None) -> str:
            return "none" if value is None else repr(value)

        return f"metric {self.key} at step {self.step}: {shown(self.original)} vs {shown(self.rerun)}"


def _first_in_history(key: str, original: History, rerun: History) -> MetricDifference | None:
    """The first point where two histories of one metric part: a different step or value at the same
    position, or a point only one of them has."""
    for i in range(max(len(original), len(rerun))):
        ours = original[i] if i < len(original) else None
        theirs = rerun[i] if i < len(rerun) else None
        if ours == theirs:
            continue
        if ours is None or theirs is None:
            step, value = ours or theirs  # type: ignore[misc]  # one of them is a point
            return MetricDifference(key, step, value if ours else None, value if theirs else None)
        if ours[0] != theirs[0]:  # a point logged at another step: the earlier one is where they part
            first = min(ours, theirs)
            return MetricDifference(key, first[0], first[1] if first is ours else None, first[1] if first is theirs else None)
        return MetricDifference(key, ours[0], ours[1], theirs[1])
    return None


def first_metric_difference(original: Mapping[str, History], rerun: Mapping[str, History]) -> MetricDifference | None:
    """The earliest difference over every metric: by step, then by key; a metric only one run has counts from
    its first point."""
    found = [d for key in set(original) | set(rerun) if (d := _first_in_history(key, original.get(key, ()), rerun.get(key, ())))]
    return min(found, key=lambda d: (d.step, d.key), default=None)


def from_resume(original: Mapping[str, History], rerun: Mapping[str, History]) -> tuple[dict[str, History], dict[str, History], int | None]:
    """An original run that resumed from a checkpoint logged each metric from the step it resumed at (its
    earlier points are in the interrupted run): the rerun's history is compared from the same step, the
    metrics the original has no point of since then are left out, and RESUMED itself too. Returns both sides
    and the step it resumed at (None: it did not resume; both returned as given)."""
    if RESUMED not in original or not original[RESUMED]:
        return dict(original), dict(rerun), None
    resumed = int(original[RESUMED][0][1])
    kept: dict[str, History] = {k: v for k, v in original.items() if k != RESUMED}
    trimmed: dict[str, History] = {k: [(s, v) for s, v in points if s >= min(s for s, _ in kept[k])]
                                   for k, points in rerun.items() if kept.get(k)}
    return kept, trimmed, resumed


@dataclass(frozen=True)
class Verdict:
    """One stage's comparison, or why there is none (`failed`: the rerun did not finish)."""

    stage: str
    files: int = 0
    metrics: int = 0
    file_difference: str | None = None
    metric_difference: MetricDifference | None = None
    failed: str | None = None
    note: str | None = None  # e.g. the stage's code changed since the run: a difference may come from that

    @property
    def identical(self) -> bool:
        return self.failed is None and self.file_difference is None and self.metric_difference is None

    def line(self) -> str:
        """`sft: identical (12 files, 9 metrics)`, `rl: differs: first at rl_model/model.safetensors`,
        `rm: differs: metric eval/loss at step 20: 0.5 vs 0.51`, or `dpo: rerun failed: ...`."""
        if self.failed is not None:
            text = f"{self.stage}: rerun failed: {self.failed}"
        elif self.identical:
            text = f"{self.stage}: identical ({self.files} files, {self.metrics} metrics)"
        else:
            parts = ([f"first at {self.file_difference}"] if self.file_difference else []) + \
                ([self.metric_difference.text()] if self.metric_difference else [])
            text = f"{self.stage}: differs: {'; '.join(parts)}"
        return f"{text} ({self.note})" if self.note else text


def verdict(stage: str, original_files: Mapping[str, str], rerun_files: Mapping[str, str],
            original_metrics: Mapping[str, History], rerun_metrics: Mapping[str, History], note: str | None = None) -> Verdict:
    """Compare two runs of `stage`: every output file, and every metric but the timing ones (`timing`)."""
    ours, theirs, resumed = from_resume({k: v for k, v in original_metrics.items() if not timing(k)},
                                        {k: v for k, v in rerun_metrics.items() if not timing(k)})
    if resumed is not None:
        resumed_note = f"the original resumed at step {resumed}: metrics compared from there"
        note = f"{note}; {resumed_note}" if note else resumed_note
    return Verdict(stage, len(original_files), len(ours), first_file_difference(original_files, rerun_files),
                   first_metric_difference(ours, theirs), note=note)
