"""Checks that must fail before any work starts, cheap enough to run in the flow's driver: the model
path, local dataset files (readable, with the columns the config names), the reward function file
(compiled, not run), and what the local machine has (the CPUs the Ray cluster is given, the RL layout
they fit, a GPU for the options that need one). Nothing here imports torch or transformers unless the
config asks for a GPU-only option or packing."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from operator import attrgetter
from pathlib import Path

from configs.errors import CheckpointError, ConfigError, PipelineError
from configs.schema import FILE_DATASETS, DatasetConfig, PipelineConfig, sections_with
from stages.common import checkpoint_paths, moe, packing, vocabulary
from stages.dag.declaration import BY_NAME, LORA_SECTIONS, STAGES, StageSpec, lora_of
from stages.dag.plan import plan
from stages.data import chat_template
from stages.rewards import func_file as reward_file
from stages.rl import agent_file
from stages.rl.layout import check_async, check_fits, resolve_layout

AUX_LOSS_SECTIONS = sections_with("aux_loss_coef")  # config sections with an aux_loss_coef


def check(cfg: PipelineConfig) -> None:
    for check_one in CHECKS:
        check_one(cfg)


def local_cluster(cfg: PipelineConfig) -> tuple[int, int] | None:
    """(CPUs, GPUs) of the local Ray cluster a run starts; None where the user named a cluster."""
    if os.environ.get("RAY_ADDRESS") or cfg.infra.ray_address:
        return None
    return cfg.infra.num_cpus or os.cpu_count() or 1, local_gpus()


def local_gpus() -> int:
    """The NVIDIA GPUs Ray would see here (CUDA_VISIBLE_DEVICES, else the driver's list), without CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = "/proc/driver/nvidia/gpus"
    return len(os.listdir(gpus)) if os.path.isdir(gpus) else 0


def with_rl_layout(cfg: PipelineConfig) -> PipelineConfig:
    """`rl.rollout.engine: auto` resolved for the local cluster (on a named cluster the RL stage resolves it)."""
    size = local_cluster(cfg)
    return cfg if size is None else resolve_layout(cfg, *size)


def check_inputs(cfg: PipelineConfig, only: Sequence[str] = ()) -> None:
    """The model path, and the first rows of each local dataset file of a `data.source: files` config
    (`data_files.check_first_rows`: data prep checks every row, and reads a hub dataset)."""
    if cfg.model.name_or_path:
        checkpoint_paths.validate(cfg.model.name_or_path)
        check_model_family(cfg)
    if cfg.data.source != "files":
        return
    from stages.data import files as data_files  # HF datasets: only a config that reads files needs it here

    for section in FILE_DATASETS:
        ds_cfg: DatasetConfig | None = getattr(cfg.data, section)
        if ds_cfg is None or not all(data_files.is_local(p) for p in ds_cfg.paths):
            continue
        plain = section == "sft" and cfg.sft.pretrain_mode
        ds_cfg = data_files.as_read(cfg.data, section)
        columns = data_files.file_columns(section, ds_cfg, plain)
        data_files.check_first_rows(ds_cfg, section, columns, data_files.holds_out(cfg.data, section), plain)


def check_sft_rows(cfg: PipelineConfig, only: Sequence[str] = ()) -> None:
    """A files config without `data.sft` runs no stage that trains on SFT rows (eval then reports no perplexity)."""
    if cfg.data.source != "files" or cfg.data.sft is not None:
        return
    for spec in STAGES:
        if ("sft_data" in spec.wanted_inputs(cfg) and "sft_data" not in spec.optional_inputs and in_request(spec, cfg, only)
                and spec.asked_for(cfg)):
            if spec.name == "sft":
                raise ConfigError("data.sft is empty and the sft stage trains on it: name SFT rows in data.sft, or pin "
                                  "inputs.sft_model to a checkpoint to start from (what an OpenRLHF PPO, RM or DPO "
                                  "script's --pretrain is)")
            raise ConfigError(f"data.sft is empty and the {spec.name} stage trains on its rows: name SFT rows in data.sft, "
                              f"or set {spec.name}.enabled=false")


def check_reward(cfg: PipelineConfig, only: Sequence[str] = ()) -> None:
    """The `reward_func` file, when the config has a stage that scores with it: found, compiled, and
    defining a `reward_func` the stages can call (a deterministic error here would otherwise fail the
    stage's reward actors after the cluster and the models are up)."""
    scores = any("reward" in spec.wanted_config(spec.config_keys, cfg) and in_request(spec, cfg, only) for spec in STAGES)
    if scores and cfg.reward.source == "func":
        reward_file.check(reward_file.resolve_func_path(cfg.reward.func_path))
    if cfg.rl.agent.path and in_request(BY_NAME["rl"], cfg, only):
        agent_file.check(agent_file.resolve(cfg.rl.agent.path))


def check_distillation(cfg: PipelineConfig, only: Sequence[str] = ()) -> None:
    """`kd.teacher: path`: the teacher is a checkpoint, and where it and the student's model
    (`model.name_or_path`) are both local folders with a tokenizer.json, they share the tokenizer and
    vocabulary (else the kd stage checks the loaded tokenizers before it trains)."""
    kd = cfg.kd
    if not kd.enabled or kd.teacher != "path" or not in_request(BY_NAME["kd"], cfg, only):
        return
    teacher_path = kd.teacher_path
    if teacher_path is None:  # the config's validation pairs it with teacher: path
        raise ConfigError("kd.teacher: path needs kd.teacher_path, the teacher's checkpoint")
    checkpoint_paths.validate(teacher_path, "kd.teacher_path")
    student = cfg.model.name_or_path
    teacher_tokens = vocabulary.file_vocabulary(teacher_path)
    student_tokens = vocabulary.file_vocabulary(student) if student else None
    if not student or teacher_tokens is None or student_tokens is None:
        return
    widths = (vocabulary.logit_width(teacher_path), vocabulary.logit_width(student) if kd.student == "sft" else None)
    placeholder = cfg.prm.placeholder_token
    if cfg.data.source == "synthetic" and placeholder not in student_tokens:
        # data prep may add it to the student's tokenizer and grow its embeddings: compare without it
        teacher_tokens = {token: i for token, i in teacher_tokens.items() if token != placeholder}
        widths = (None, None)
    problem = vocabulary.mismatch(teacher_tokens, student_tokens, *widths)
    if problem:
        raise CheckpointError(vocabulary.message(f"kd.teacher_path={kd.teacher_path}", f"model.name_or_path={student}", problem))


def check_conditional_sft(cfg: PipelineConfig, only: Sequence[str] = ()) -> None:
    """Conditional SFT scores the SFT data with a reward model: `reward.rm_paths`, a pinned
    `inputs.reward_model`, or the one the rm stage trains, which needs preference data."""
    if not cfg.csft.enabled or not in_request(BY_NAME["csft"], cfg, only) or cfg.reward.rm_paths or "reward_model" in cfg.inputs:
        return
    if cfg.data.source == "files" and cfg.data.preference is None:
        raise ConfigError("csft.enabled: conditional SFT scores the SFT data with a reward model, and this pipeline has "
                          "none (reward.rm_paths is empty and, without data.preference, the rm stage trains none); set "
                          "reward.rm_paths, data.preference or inputs.reward_model")


def check_critic_start(cfg: PipelineConfig, only: Sequence[str] = ()) -> None:
    """RL's critic starts from a reward model there is: `rl.critic.init_path`'s checkpoint, or the pipeline's own (a
    pinned `inputs.reward_model`, or the one the rm stage trains, which needs preference data)."""
    critic = cfg.rl.critic
    if critic.init_from == "sft" or not in_request(BY_NAME["rl"], cfg, only):
        return
    if critic.init_path is not None:
        checkpoint_paths.validate(critic.init_path, "rl.critic.init_path")
    elif "reward_model" not in cfg.inputs and cfg.data.source == "files" and cfg.data.preference is None:
        raise ConfigError("rl.critic.init_from=reward_model: the critic starts from the pipeline's reward model, and this "
                          "pipeline has none (without data.preference the rm stage trains none); set data.preference or "
                          "inputs.reward_model, or rl.critic.init_from: path with rl.critic.init_path, or "
                          "rl.critic.init_from: sft")


def check_model_family(cfg: PipelineConfig) -> None:
    """Checked here on a local model's config.json (a hub model's when the stage loads it): a router
    loss (`<stage>.aux_loss_coef` > 0) needs an MoE model, and `<stage>.packing` a family whose forward
    takes position ids."""
    if not cfg.model.name_or_path:
        return
    config_file = Path(cfg.model.name_or_path).expanduser() / "config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text())
    for section in AUX_LOSS_SECTIONS:
        moe.check(config, attrgetter(f"{section}.aux_loss_coef")(cfg), f"{section}.aux_loss_coef")
    for section in packing.PACKED_SECTIONS:
        if getattr(cfg, section).packing:
            packing.check(config, f"{section}.packing")


def check_local_resources(cfg: PipelineConfig, only: Sequence[str] = ()) -> None:
    """A local Ray cluster has `infra.num_cpus` CPUs (default: all): training stages must fit in it; and
    this machine's GPUs: options that need CUDA (flash attention, Liger's kernels, QLoRA) fail here when it has none."""
    size = local_cluster(cfg)
    if size is None:
        return  # a remote cluster's size is checked when the stage asks for it
    if cfg.infra.worker_resources:
        pairs = ", ".join(f"{k}: {v:g}" for k, v in cfg.infra.worker_resources.items())
        raise PipelineError(
            f"infra.worker_resources={{{pairs}}}: stage work would wait for Ray nodes started with "
            f"these resources, which the local cluster a run starts has none of; set RAY_ADDRESS or infra.ray_address "
            f"to a cluster that has them, or leave infra.worker_resources empty"
        )
    if cfg.model.attn_implementation == "flash_attention_2":
        from stages.common import checkpoint

        checkpoint.require_flash_attn()
    if cfg.model.use_liger_kernel:
        from stages.common import liger

        liger.require()
    for section in LORA_SECTIONS:
        if lora_of(cfg, section).load_in_4bit:
            from stages.common import lora

            lora.require_qlora(f"{section}.lora")
    have, gpus = size
    need = cfg.infra.num_workers * cfg.infra.cpus_per_worker
    if need > have:
        raise PipelineError(
            f"infra.num_workers={cfg.infra.num_workers} x infra.cpus_per_worker={cfg.infra.cpus_per_worker} needs "
            f"{need} CPUs; the local Ray cluster has {have} (infra.num_cpus)"
        )
    if in_request(BY_NAME["rl"], cfg, only):
        check_fits(with_rl_layout(cfg), have, gpus, "the local Ray cluster (infra.num_cpus)")
        check_async(with_rl_layout(cfg))


def check_chat_template(cfg: PipelineConfig, only: Sequence[str] = ()) -> None:
    chat_template.check(cfg)


# in the order they run, each given the config and `--only`'s stages (empty: every stage); each raises its one-line
# error (flows/pre_run.py makes them one by one)
CHECKS = (check_inputs, check_chat_template, check_sft_rows, check_reward, check_distillation, check_conditional_sft,
          check_critic_start, check_local_resources)


def in_request(spec: StageSpec, cfg: PipelineConfig, only: Sequence[str]) -> bool:
    """The request runs `spec` itself (stages/dag/plan.py), so its checks apply."""
    return plan(cfg, only)[spec.name].in_request
