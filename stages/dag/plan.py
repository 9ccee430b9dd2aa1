"""Which stages a request runs, and why each other one does not: the one answer the flow (which stages get a
task), the pre-run checks and `rlhf check` (which stages to check, and the plan printed), and `rlhf
from-openrlhf` (the plan in a converted config's header) all read.

Read from the config alone, before anything runs: a stage the plan runs can still be skipped at run time when
its producer made no optional output (no PRM rows in a file's data, say)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from configs.schema import PipelineConfig
from stages.dag.declaration import STAGES, StageSpec, pinned_away, reused_by_only

# runs: it runs (or is served from the cache); reused: `--only` reads its outputs from an earlier run;
# off: the config turns it off or leaves it without an input; pinned: `inputs.*` stand in for its outputs;
# unrequested: `--only` leaves it out and nothing it names needs it
Status = Literal["runs", "reused", "off", "pinned", "unrequested"]

# the datasets data prep makes for a config of files, by the `data` section that names them
DATASET_SECTIONS = {"sft_data": "sft", "pref_data": "preference", "prm_data": "prm"}
NAMES = {"sft_data": "SFT data", "pref_data": "preference data", "prm_data": "PRM data"}


@dataclass(frozen=True)
class Planned:
    stage: str
    status: Status
    why: str = ""  # in a line, for every status but runs

    @property
    def scheduled(self) -> bool:
        """The flow gives it a task: it runs, is reused, or is recorded as skipped (off)."""
        return self.status not in ("pinned", "unrequested")

    @property
    def runs(self) -> bool:
        return self.status == "runs"

    @property
    def in_request(self) -> bool:
        """The request runs the stage itself (not reused, pinned away or left out by `--only`), unless the config
        turns it off: what the pre-run checks look at."""
        return self.status in ("runs", "off")

    def line(self) -> str:
        """`runs`, or why not: `off: why` (the config's doing, a pin's included), `reused: why`, `unrequested: why`."""
        if self.runs:
            return "runs"
        return f"{'off' if self.status in ('off', 'pinned') else self.status}: {self.why}"


def data_prep_outputs(cfg: PipelineConfig) -> set[str]:
    """What data prep makes for `cfg`: every dataset of the synthetic task; of files, those the config names."""
    made = {"base_model", "prompts", "eval_data"}
    if cfg.data.source == "synthetic":
        return made | set(DATASET_SECTIONS)
    return made | {name for name, section in DATASET_SECTIONS.items() if getattr(cfg.data, section) is not None}


def missing_input(name: str) -> str:
    if name in DATASET_SECTIONS:
        return f"no {NAMES[name]} (data.{DATASET_SECTIONS[name]})"
    return f"no {name} (its stage is off)"


def plan(cfg: PipelineConfig, only: Sequence[str] = ()) -> dict[str, Planned]:
    """Each stage of the DAG, in order, for `rlhf run` on `cfg` with `--only only` (every stage when empty)."""
    reused = reused_by_only(list(only), cfg)
    # what the request's stages will have made, as far as the config tells: None when data prep is not part of it
    made = data_prep_outputs(cfg) if not only or "data_prep" in only or "data_prep" in reused else None
    planned: dict[str, Planned] = {}
    for spec in STAGES:
        planned[spec.name] = entry = planned_stage(spec, cfg, only, reused, made)
        if entry.status in ("runs", "reused") and made is not None and spec.name != "data_prep":
            made |= set(spec.outputs)  # data prep's: those data_prep_outputs named, not every one it may make
    return planned


def planned_stage(spec: StageSpec, cfg: PipelineConfig, only: Sequence[str], reused: set[str],
                  made: set[str] | None) -> Planned:
    name = spec.name
    if only and name not in only and name not in reused:
        return Planned(name, "unrequested", "--only leaves it out")
    if pinned_away(spec, cfg):
        pins = ", ".join(f"inputs.{a}" for a in spec.outputs if a not in spec.requested_outputs)
        return Planned(name, "pinned", f"{pins} stands in for its output")
    if name in reused:
        return Planned(name, "reused", "--only reads its outputs from an earlier run")
    if not spec.asked_for(cfg):
        return Planned(name, "off", spec.off_because)
    if made is not None:
        wanted = [a for a in spec.wanted_inputs(cfg) if a not in cfg.inputs and a not in spec.optional_inputs]
        if missing := [a for a in wanted if a not in made]:
            return Planned(name, "off", "; ".join(missing_input(a) for a in missing))
    return Planned(name, "runs")
