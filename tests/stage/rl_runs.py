"""The RL stage tests' fast config and how they run it: on a local Ray cluster as the pipeline does
(`runtime.rl_driver.run`), or with every worker in the test's process (`stages.rl.stage.run_in_process`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from configs import load_config
from runtime import rl_driver
from stages.dag.contract import StageResult
from tests.stage.conftest import FAST, make_ctx

RL_FAST = [
    *FAST, "rl.max_steps=2", "rl.rollout.batch_size=4", "rl.rollout.n_samples_per_prompt=4", "rl.train_batch_size=8",
    "rl.micro_train_batch_size=4", "rl.rollout.micro_batch_size=16", "rl.eval_every=1", "rl.save_every=1",
    "rl.rollout.generate_max_len=12", "rl.actor.lr=1e-3", "eval.max_samples=8", "eval.max_new_tokens=12",
    "eval.samples_per_prompt=2", "rl.placement.colocate_all=true", "infra.cpus_per_worker=2",
    "rl.algorithm.recompute_old_log_probs=true",  # the policy's own old log-probs: rollout_logprob_gap checks the weight sync
    "rl.rollout.engine=hf",  # an engine and a reference of their own (the preset's hybrid layout: the hybrid test and the flow tests)
]

# a rollout (4 prompts x 4 samples) is one optimizer step (one average update); greedy evals only
ONE_UPDATE = ["rl.train_batch_size=16", "eval.samples_per_prompt=0"]
# Two runs of the same settings (in Ray workers of their own, or one after the other in the test's process) train
# to the same bytes: the preset's infra.deterministic fixes MKL's kernel choice, which otherwise followed each
# process's memory alignment (6e-6 apart after one step). A step moves some weight by about the learning rate
# (1e-3), far more than this:
STEP_MOVES = 1e-4


def run_rl(prepared, root, overrides, fail_at: int | None = None, extra_inputs=None, logged: list | None = None,
           run: Callable[..., StageResult] = rl_driver.run):
    """The RL stage on the fast config; `fail_at`: raise at that step's metrics (after its update), as a kill would
    end it; `logged`: where the (step, metrics) go, read by a caller whose run raises; `run`: the stage's
    entrypoint (Ray actors, or `run_in_process`)."""
    cfg = load_config(None, [*RL_FAST, *overrides])
    logged = [] if logged is None else logged

    def log(metrics, step):
        if fail_at is not None and step == fail_at and "train/reward" in metrics:
            raise RuntimeError(f"killed at step {step}")
        logged.append((step, metrics))

    ctx = make_ctx("rl", cfg, root, log)
    inputs = {"sft_model": prepared["base_model"], "prompts": prepared["prompts"], "eval_data": prepared["eval_data"],
              **(extra_inputs or {})}
    return run(ctx, inputs), logged


def tag_weights(root, step: int) -> dict[str, torch.Tensor]:
    """The policy's weights in its resumable checkpoint of `step` (ZeRO-2: DeepSpeed's model states hold them whole)."""
    path = root / "work" / "checkpoints" / "policy" / f"step{step}" / "mp_rank_00_model_states.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["module"]


def tags(root, model: str = "policy") -> set[str]:
    return {p.name for p in (root / "work" / "checkpoints" / model).iterdir() if p.is_dir()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Every tensor the two state dicts share is the same, bit for bit (see `gap` for the keys)."""
    return bool(a.keys() & b.keys()) and all(torch.equal(a[k], b[k]) for k in a.keys() & b.keys())


def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference between two state dicts, over their common keys (an HF output's tied head is its
    embedding, which a DeepSpeed checkpoint holds once)."""
    return max((a[k] - b[k]).abs().max().item() for k in a.keys() & b.keys())


def quick_reward_model(stage, module, data: str, output: str, prepared, root):
    """A 4-step rm or prm checkpoint trained from the base model (a scorer to plug into RL)."""
    cfg = load_config(None, [*FAST, f"{stage}.max_steps=4", f"{stage}.eval_every=2", f"{stage}.save_every=2"])
    result = module.run(make_ctx(stage, cfg, root / stage), {"sft_model": prepared["base_model"], data: prepared[data]})
    return result.outputs[output]
