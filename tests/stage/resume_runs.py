"""What the resume tests share: a model whose training draws from torch's RNG, kills at a chosen point, and
the comparisons of a resumed run with an uninterrupted one (weights bit for bit, metric histories)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file

# what a rerun cannot repeat: wall-clock timings and the rates derived from them
TIMING = ("time/", "train/tokens_per_s", "rollout/samples_per_s")


def dropout_model(base_model: Path, out: Path, p: float = 0.1) -> Path:
    """A copy of `base_model` with attention dropout `p`: every training forward draws from torch's RNG, so a
    resume that did not restore the generator trains other weights."""
    shutil.copytree(base_model, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "attention_dropout": p}))
    return out


def histories(rows: list[tuple[int, dict]]) -> dict[int, dict[str, float]]:
    """Logged metrics by step (a step's train and eval logs merged), timings left out."""
    out: dict[int, dict[str, float]] = {}
    for step, metrics in rows:
        out.setdefault(step, {}).update({k: v for k, v in metrics.items() if not k.startswith(TIMING)})
    return out


def assert_same_histories(uninterrupted: list[tuple[int, dict]], resumed: list[tuple[int, dict]], resumed_from: int) -> None:
    """The resumed run logged every step after `resumed_from` the uninterrupted run logged, with the same values."""
    want, got = histories(uninterrupted), histories(resumed)
    assert {s for s in want if s > resumed_from} <= set(got), (sorted(want), sorted(got))
    differ = {(s, k): (v, want.get(s, {}).get(k)) for s, m in got.items() for k, v in m.items() if want.get(s, {}).get(k) != v}
    assert not differ and all(set(got[s]) == set(want[s]) for s in got), differ


def assert_same_weights(a: Path, b: Path) -> None:
    """Every safetensors file under output folder `a` is in `b`, every tensor equal bit for bit."""
    files = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    assert files and files == sorted(p.relative_to(b) for p in b.rglob("*.safetensors"))
    for name in files:
        x, y = load_file(a / name), load_file(b / name)
        assert x.keys() == y.keys()
        differ = [k for k in x if not torch.equal(x[k], y[k])]
        assert not differ, f"{name}: {len(differ)} of {len(x)} tensors differ, e.g. {differ[0]}"


@contextmanager
def killed_between_micro_batches(optimizer_step: int, occurrence: int = 1) -> Iterator[None]:
    """A Ctrl-C in the forward of the last micro-batch of a DeepSpeed engine's optimizer step `optimizer_step`
    (1-based; of the `occurrence`th engine to get there, for a stage that trains a fresh engine per round): the
    step's earlier micro-batches have accumulated their gradients, and it is not taken."""
    seen = 0

    def hook(module, args):
        nonlocal seen
        if (type(module).__name__ == "DeepSpeedEngine" and module.training and module.gradient_accumulation_steps() > 1
                and module.global_steps + 1 == optimizer_step and module.is_gradient_accumulation_boundary()):
            seen += 1
            if seen == occurrence:
                raise KeyboardInterrupt(f"simulated kill in optimizer step {optimizer_step}'s last micro-batch")

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def latest(ckpt_dir: Path) -> str:
    return (ckpt_dir / "latest").read_text().strip()
