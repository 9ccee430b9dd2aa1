"""docs/own-task.md's "A stage of your own" stays true: its code blocks compile, every name they import exists,
its config section is a training section, and its DAG line makes the spec the page describes."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from configs.schema import TrainingConfig
from stages.dag.declaration import TRAINING_INFRA, training_stage

PAGE = Path(__file__).parent.parent.parent / "docs" / "own-task.md"


def blocks() -> list[str]:
    section = PAGE.read_text().split("## A stage of your own", 1)[1]
    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", section, re.S)]


def test_the_stage_module_imports_what_exists():
    stage, _, _ = blocks()
    namespace: dict = {}
    exec(compile(stage, "stages/polish/stage.py", "exec"), namespace)
    assert callable(namespace["run"])


def test_the_section_is_a_training_section_with_its_switch():
    _, section, _ = blocks()
    namespace: dict = {}
    exec("from pydantic import Field\nfrom configs.schema import TrainingConfig\n" + section, namespace)
    polish = namespace["PolishConfig"]()
    assert isinstance(polish, TrainingConfig) and polish.enabled is False and polish.lr == 1e-6


def test_the_dag_line_makes_the_spec_the_page_describes():
    _, _, line = blocks()
    spec = eval(line.strip().rstrip(","), {"training_stage": training_stage})
    assert spec.entrypoint == "stages.polish.stage:run" and spec.outputs == ("polish_model",)
    assert spec.register == ("polish_model",) and spec.distributed
    assert spec.config_keys == ("seed", "model.attn_implementation", "model.use_liger_kernel", "polish", *TRAINING_INFRA)
    assert spec.off_because == "polish.enabled is false"
