"""The RL stage's layout as pure functions of the config: which actor groups exist, which share bundles,
how many CPUs and GPUs that takes, and what `rl.engine: auto` becomes on a cluster of a given size.
Nothing here starts Ray, so the driver checks a layout before any stage runs."""

from __future__ import annotations

from configs.errors import PipelineError
from configs.schema import PipelineConfig


def hosts(cfg: PipelineConfig) -> dict[str, str]:
    """The groups with no actors of their own, and the group whose actors do their work (hybrid: the
    policy ranks sample themselves and hold the reference)."""
    return {"engine": "actor", "ref": "actor"} if cfg.rl.engine == "hybrid" else {}


def group_sizes(cfg: PipelineConfig, needs_critic: bool) -> dict[str, int]:
    rl = cfg.rl
    sizes = {"actor": rl.actor.num_workers, "engine": rl.num_engines, "reward": rl.reward_num_workers}
    if rl.needs_reference:
        sizes["ref"] = rl.ref_num_workers
    if needs_critic:
        sizes["critic"] = rl.critic.num_workers
    hosted = hosts(cfg)
    return {group: n for group, n in sizes.items() if group not in hosted}


def bundles_needed(cfg: PipelineConfig, needs_critic: bool) -> tuple[float, float]:
    """(CPUs, GPUs) the stage's placement groups reserve: each pool as many bundles as its largest group."""
    sizes = group_sizes(cfg, needs_critic)
    bundles = sum(max(sizes[g] for g in pool) for pool in pools(cfg, list(sizes)))
    return bundles * cfg.infra.cpus_per_worker, bundles * cfg.infra.gpus_per_worker


def fits(cfg: PipelineConfig, needs_critic: bool, cpus: float, gpus: float) -> bool:
    need_cpu, need_gpu = bundles_needed(cfg, needs_critic)
    return need_cpu <= cpus and need_gpu <= gpus


def resolve_layout(cfg: PipelineConfig, cpus: float, gpus: float) -> PipelineConfig:
    """`rl.engine: auto` made concrete for a cluster of `cpus` / `gpus`: engine and reference actors of
    their own (OpenRLHF's separate layout) where every group gets its own bundles, else the hybrid
    layout with every group colocated (ZeRO-3 partitions the weights the hybrid ranks sample with: an HF
    engine, colocated). A config that names its engine is returned as it is."""
    if cfg.rl.engine != "auto":
        return cfg
    resolved = cfg.model_copy(deep=True)
    resolved.rl.engine = "hf"
    if fits(resolved, cfg.rl.needs_critic, cpus, gpus):
        return resolved
    resolved.rl.engine = "hybrid" if cfg.infra.zero_stage != 3 else "hf"
    if "colocate_all" not in cfg.rl.model_fields_set:
        resolved.rl.colocate_all = True
    return resolved


def describe_layout(cfg: PipelineConfig) -> str:
    rl = cfg.rl
    shared = "every group colocated" if rl.colocate_all else "groups on bundles of their own"
    return f"rl.engine={rl.engine}, {shared}"


def pools(cfg: PipelineConfig, groups: list[str]) -> list[list[str]]:
    """The sets of groups that share bundles, from the colocate_* options."""
    rl = cfg.rl
    if rl.colocate_all:
        return [groups]
    together = []
    if rl.colocate_actor_ref:
        together.append([g for g in ("actor", "ref") if g in groups])
    if rl.colocate_critic_reward:
        together.append([g for g in ("critic", "reward") if g in groups])
    placed = {g for pool in together for g in pool}
    return [p for p in together if p] + [[g] for g in groups if g not in placed]


def check_fits(cfg: PipelineConfig, cpus: float, gpus: float, where: str) -> None:
    """One line when the RL layout can never be placed on a cluster of `cpus` / `gpus` (`where` names it)."""
    need_cpu, need_gpu = bundles_needed(cfg, cfg.rl.needs_critic)
    if need_cpu > cpus or need_gpu > gpus:
        sizes = group_sizes(cfg, cfg.rl.needs_critic)
        raise PipelineError(
            f"stage rl needs {need_cpu:g} CPU / {need_gpu:g} GPU for its actor groups {pools(cfg, list(sizes))} "
            f"({describe_layout(cfg)}, infra.cpus_per_worker={cfg.infra.cpus_per_worker:g}), but {where} has "
            f"{cpus:g} CPU / {gpus:g} GPU; set rl.engine: auto (or hybrid) and rl.colocate_all: true, or use fewer workers"
        )
