"""The RL stage's layout as pure functions of the config: its roles (the actor groups), which of them
run in another's actors, which share bundles, how many CPUs and GPUs that takes, and what
`rl.rollout.engine: auto` becomes on a cluster of a given size. Nothing here starts Ray, so the driver checks a
layout before any stage runs."""

from __future__ import annotations

from enum import StrEnum

from configs.errors import PipelineError
from configs.schema import PipelineConfig


class Role(StrEnum):
    """What an RL actor group does. A role's value is its name in logs, metrics and errors."""

    ACTOR = "actor"  # the policy's DeepSpeed ranks
    CRITIC = "critic"  # the value model's DeepSpeed ranks (estimators that need a critic)
    REF = "ref"  # the frozen reference model (a KL coefficient or KL loss)
    REWARD = "reward"  # the reward scorers
    ENGINE = "engine"  # the rollout engines

    def __repr__(self) -> str:  # a list of roles in a message reads as a list of names
        return repr(self.value)


# per rl.rollout.engine: the roles with no actors of their own, and the role whose actors do their work (hybrid:
# the policy ranks sample with their own weights and hold the reference)
HOSTS: dict[str, dict[Role, Role]] = {"hybrid": {Role.ENGINE: Role.ACTOR, Role.REF: Role.ACTOR}}
# the colocate_* options: the roles each puts on the same bundles
COLOCATE = {"colocate_actor_ref": (Role.ACTOR, Role.REF), "colocate_critic_reward": (Role.CRITIC, Role.REWARD)}


def hosts(cfg: PipelineConfig) -> dict[Role, Role]:
    return HOSTS.get(cfg.rl.rollout.engine, {})


def roles(cfg: PipelineConfig, needs_critic: bool) -> dict[Role, int]:
    """Every role the config has work for, with its number of workers (hosted roles included)."""
    rl = cfg.rl
    sizes = {Role.ACTOR: rl.actor.num_workers, Role.ENGINE: rl.rollout.num_engines, Role.REWARD: rl.placement.reward_num_workers}
    if rl.algorithm.needs_reference:
        sizes[Role.REF] = rl.placement.ref_num_workers
    if needs_critic:
        sizes[Role.CRITIC] = rl.critic.num_workers
    return sizes


def group_sizes(cfg: PipelineConfig, needs_critic: bool) -> dict[Role, int]:
    """The roles with actors of their own, and how many."""
    hosted = hosts(cfg)
    return {role: n for role, n in roles(cfg, needs_critic).items() if role not in hosted}


def bundles_needed(cfg: PipelineConfig, needs_critic: bool) -> tuple[float, float]:
    """(CPUs, GPUs) the stage's placement groups reserve: each pool as many bundles as its largest group."""
    sizes = group_sizes(cfg, needs_critic)
    bundles = sum(max(sizes[g] for g in pool) for pool in pools(cfg, list(sizes)))
    return bundles * cfg.infra.cpus_per_worker, bundles * cfg.infra.gpus_per_worker


def fits(cfg: PipelineConfig, needs_critic: bool, cpus: float, gpus: float) -> bool:
    need_cpu, need_gpu = bundles_needed(cfg, needs_critic)
    return need_cpu <= cpus and need_gpu <= gpus


def resolve_layout(cfg: PipelineConfig, cpus: float, gpus: float) -> PipelineConfig:
    """`rl.rollout.engine: auto` made concrete for a cluster of `cpus` / `gpus`: engine and reference actors of
    their own (OpenRLHF's separate layout) where every group gets its own bundles, else the hybrid
    layout with every group colocated (ZeRO-3 partitions the weights the hybrid ranks sample with: an HF
    engine, colocated). A config that names its engine is returned as it is."""
    if cfg.rl.rollout.engine != "auto":
        return cfg
    resolved = cfg.model_copy(deep=True)
    resolved.rl.rollout.engine = "hf"
    if fits(resolved, cfg.rl.algorithm.needs_critic, cpus, gpus) or cfg.rl.rollout.async_train:  # async: engines of their own or nothing
        return resolved
    resolved.rl.rollout.engine = "hybrid" if cfg.infra.zero_stage != 3 else "hf"
    if "colocate_all" not in cfg.rl.placement.model_fields_set:
        resolved.rl.placement.colocate_all = True
    return resolved


def describe_layout(cfg: PipelineConfig) -> str:
    rl = cfg.rl
    shared = ("every group colocated" if rl.placement.colocate_all else "the models colocated, the engines apart" if rl.placement.colocate_models
              else "groups on bundles of their own")
    return f"rl.rollout.engine={rl.rollout.engine}, {shared}"


def pools(cfg: PipelineConfig, groups: list[Role]) -> list[list[Role]]:
    """The sets of groups that share bundles, from the colocate_* options."""
    rl = cfg.rl
    if rl.placement.colocate_all:
        return [groups]
    if rl.placement.colocate_models:
        split: tuple[list[Role], list[Role]] = ([g for g in groups if g != Role.ENGINE], [g for g in groups if g == Role.ENGINE])
        return [pool for pool in split if pool]
    together = [[g for g in pair if g in groups] for option, pair in COLOCATE.items() if getattr(rl.placement, option)]
    placed = {g for pool in together for g in pool}
    return [p for p in together if p] + [[g] for g in groups if g not in placed]


def check_fits(cfg: PipelineConfig, cpus: float, gpus: float, where: str) -> None:
    """One line when the RL layout can never be placed on a cluster of `cpus` / `gpus` (`where` names it)."""
    need_cpu, need_gpu = bundles_needed(cfg, cfg.rl.algorithm.needs_critic)
    if need_cpu > cpus or need_gpu > gpus:
        sizes = group_sizes(cfg, cfg.rl.algorithm.needs_critic)
        raise PipelineError(
            f"stage rl needs {need_cpu:g} CPU / {need_gpu:g} GPU for its actor groups {pools(cfg, list(sizes))} "
            f"({describe_layout(cfg)}, infra.cpus_per_worker={cfg.infra.cpus_per_worker:g}), but {where} has "
            f"{cpus:g} CPU / {gpus:g} GPU; " + (
                "rl.rollout.async_train keeps the engines on bundles of their own: set rl.placement.colocate_models: true (the models on "
                "one pool, the engines on another), lower infra.cpus_per_worker, or set rl.rollout.async_train: false"
                if cfg.rl.rollout.async_train
                else "set rl.rollout.engine: auto (or hybrid) and rl.placement.colocate_all: true, or use fewer workers")
        )


def check_async(cfg: PipelineConfig) -> None:
    """One line when `rl.rollout.async_train` is asked of a layout where generation cannot overlap training: the
    engines must be actors of their own, on bundles the policy does not share."""
    rl = cfg.rl
    if not rl.rollout.async_train:
        return
    if rl.rollout.engine in HOSTS:
        raise PipelineError(f"rl.rollout.async_train: with rl.rollout.engine={rl.rollout.engine} the policy ranks sample themselves, so nothing "
                            "generates while they train; set rl.rollout.engine: hf or vllm, or rl.rollout.async_train: false")
    if any(Role.ACTOR in pool and Role.ENGINE in pool for pool in pools(cfg, [Role.ACTOR, Role.ENGINE])):
        raise PipelineError("rl.rollout.async_train: rl.placement.colocate_all puts the rollout engines on the policy's bundles, where they "
                            "take turns with it; set rl.placement.colocate_all: false (engines on bundles of their own), or "
                            "rl.rollout.async_train: false")
