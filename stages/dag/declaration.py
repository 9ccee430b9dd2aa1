"""The pipeline DAG, declared once: each stage, the named artifacts it consumes and produces,
the config keys its result depends on, and how it runs. Flow, CLI and tests all read this."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter

from configs.reward_sources import consumed_model, own_models, path_keys
from configs.schema import EvalConfig, LoRAConfig, PipelineConfig
from stages.data import chat_template
from stages.eval.results import SCORE

# a question the DAG asks of a config: does the stage run, does it consume an input, does a key count
ConfigTest = Callable[[PipelineConfig], bool]


@dataclass(frozen=True)
class StageSpec:
    name: str
    # "module:function" taking (StageContext, inputs) and returning StageResult; the project modules it
    # imports, transitively, are the stage's code version (artifacts.code_graph). The harness that calls
    # it (runtime.worker_pool) decides where a stage runs, not what it computes, and is not counted.
    entrypoint: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    config_keys: tuple[str, ...]  # dotted config paths that determine the result (fingerprinted)
    key_metric: str
    summary: str = ""  # what the stage makes, in a line: the descriptions of its MLflow runs and registered models
    distributed: bool = False  # a DeepSpeed stage: runs on infra.num_workers workers
    register: tuple[str, ...] = ()  # outputs registered as MLflow models
    optional_outputs: tuple[str, ...] = ()  # may be absent (e.g. no PRM data); consumers are then skipped
    # optional outputs made only when the config asks for them (rl's critic_model): pins of the stage's other
    # outputs pin it away
    requested_outputs: tuple[str, ...] = ()
    local_sources: tuple[str, ...] = ()  # config keys naming local files whose content the result depends on
    # inputs consumed only when the config asks for them (e.g. the pipeline's own RM as the RL reward)
    input_when: dict[str, ConfigTest] = field(default_factory=dict)
    # config keys and local sources that count only when the config uses them (the reward for iterative DPO)
    config_when: dict[str, ConfigTest] = field(default_factory=dict)
    optional_inputs: tuple[str, ...] = ()  # used when upstream made them, not needed (eval's candidate models)
    datasets: tuple[str, ...] = ()  # outputs that are datasets (split files): logged as MLflow dataset inputs of their consumers
    driver: bool = False  # the entrypoint runs in the flow process and starts its own Ray actors
    run_when: ConfigTest | None = None  # the stage runs only when this holds for the config (else skipped)
    off_because: str = ""  # why the stage is skipped when `run_when` does not hold, in a line
    takes_adapters: bool = False  # inputs that are LoRA adapters reach it as they are, not merged
    # the stage scores the models it is given: its metrics are `<model>/<metric>`, a model scored before from the
    # same checkpoint is not scored again (the flow hands it the prior results), and its run decides the champion
    scores_models: bool = False
    plots_eval_series: bool = False  # its `eval/*` series are drawn as a plot on its run (the held-out curve of RL)

    def asked_for(self, cfg: PipelineConfig) -> bool:
        """The config turns the stage on (`run_when`), whatever its inputs."""
        return self.run_when is None or self.run_when(cfg)

    def wanted_inputs(self, cfg: PipelineConfig) -> tuple[str, ...]:
        return tuple(name for name in self.inputs if name not in self.input_when or self.input_when[name](cfg))

    def wanted_config(self, keys: tuple[str, ...], cfg: PipelineConfig) -> tuple[str, ...]:
        """`keys` (config_keys or local_sources) less those `config_when` rules out for `cfg`."""
        return tuple(key for key in keys if key not in self.config_when or self.config_when[key](cfg))

    @property
    def module(self) -> str:
        return self.entrypoint.partition(":")[0]

    def load(self):
        return getattr(importlib.import_module(self.module), self.entrypoint.partition(":")[2])


def scores_with(artifact: str) -> ConfigTest:
    """The config's reward scores with the pipeline's own `artifact` (configs/reward_sources.py says when)."""
    return lambda cfg: consumed_model(cfg.reward) == artifact


def paired_preferences(cfg: PipelineConfig) -> bool:
    """The preference data are pairs, not KTO's unpaired rows (the RM trains on pairs only)."""
    return cfg.data.preference is None or not cfg.data.preference.unpaired


def scored_by_reward(cfg: PipelineConfig) -> bool:
    """RL's rollouts are scored by the reward section, not played as an agent's episodes (which give their own)."""
    return not cfg.rl.agent.path


def critic_from_reward_model(cfg: PipelineConfig) -> bool:
    """RL's critic starts from the pipeline's reward model (rl.critic.init_from)."""
    return cfg.rl.critic.init_from == "reward_model"


def either(first: ConfigTest, second: ConfigTest) -> ConfigTest:
    return lambda cfg: first(cfg) or second(cfg)


def iterative_dpo(cfg: PipelineConfig) -> bool:
    return cfg.dpo.iterative.rounds > 0


def both(first: ConfigTest, second: ConfigTest) -> ConfigTest:
    return lambda cfg: first(cfg) and second(cfg)


def iterative_dpo_with(uses: ConfigTest) -> ConfigTest:
    return both(iterative_dpo, uses)


REWARD_MODELS = own_models()  # the pipeline's own models a reward source may score with: reward_model, prm
REWARD_FILES = path_keys()  # local files the reward sources read
SCORES_WITH = {artifact: scores_with(artifact) for artifact in REWARD_MODELS}
# what RL's periodic evals read: every eval key but the metric the champion is chosen by (RL reports them all)
RL_EVAL_KEYS = tuple(f"eval.{key}" for key in EvalConfig.model_fields if key != "metric")


def rejection_sampling(cfg: PipelineConfig) -> bool:
    return cfg.rs.enabled


def distillation(cfg: PipelineConfig) -> bool:
    return cfg.kd.enabled


def kd_teacher(name: str) -> ConfigTest:
    return lambda cfg: cfg.kd.teacher == name


def conditional_sft(cfg: PipelineConfig) -> bool:
    return cfg.csft.enabled


def own_reward_model(cfg: PipelineConfig) -> bool:
    """Conditional SFT scores with the pipeline's RM unless reward.rm_paths names others."""
    return not cfg.reward.rm_paths


# the policies of the stages a config turns on, each scored by eval beside the others when it runs
OPTIONAL_POLICIES = {"rs_model": rejection_sampling, "kd_model": distillation, "csft_model": conditional_sft}


def lora_of(cfg: PipelineConfig, section: str) -> LoRAConfig:
    """The LoRA config of a dotted section, e.g. `rl.actor`."""
    return attrgetter(f"{section}.lora")(cfg)


def trains_adapters(cfg: PipelineConfig) -> bool:
    """Some stage saves its model as a LoRA adapter."""
    return any(lora_of(cfg, section).rank for section in ADAPTER_SECTIONS)


LORA_SECTIONS = ("sft", "rm", "prm", "dpo", "rl.actor", "rl.critic")  # config sections with a `lora` key
ADAPTER_SECTIONS = LORA_SECTIONS[:-1]  # those whose stage output is then an adapter (the critic stays inside RL)
TRAINING_INFRA = ("infra.zero_stage", "infra.precision", "infra.num_workers", "infra.deterministic")
LM_KERNELS = ("model.attn_implementation", "model.use_liger_kernel")  # how a causal LM's layers compute


def training_stage(name: str, output: str, inputs: tuple[str, ...], key_metric: str, summary: str, *,
                   kernels: tuple[str, ...] = LM_KERNELS, config_keys: tuple[str, ...] = (), **more) -> StageSpec:
    """A DeepSpeed training stage: `stages/<name>/stage.py`'s `run` on `infra.num_workers` ranks, making one
    model (`output`, registered); its result depends on the seed, how the model's layers compute (`kernels`),
    its config section, the training infra, and `config_keys`. `more`: the other StageSpec fields."""
    return StageSpec(name=name, entrypoint=f"stages.{name}.stage:run", inputs=inputs, outputs=(output,),
                     config_keys=("seed", *kernels, name, *TRAINING_INFRA, *config_keys), key_metric=key_metric,
                     summary=summary, distributed=True, register=(output,), **more)


STAGES: tuple[StageSpec, ...] = (
    StageSpec(
        name="data_prep",
        entrypoint="stages.data_prep.stage:run",
        inputs=(),
        outputs=("base_model", "sft_data", "pref_data", "prm_data", "prompts", "eval_data"),
        optional_outputs=("sft_data", "pref_data", "prm_data"),
        # sft.pretrain_mode renders the SFT rows as plain text; the reward tokens read PRM files' labels
        config_keys=("seed", "model", "data", "prm.placeholder_token", "prm.reward_tokens", "sft.pretrain_mode"),
        local_sources=("model.name_or_path", "data.sft.paths", "data.preference.paths", "data.prompts.paths",
                       "data.prm.paths", chat_template.KEY),
        config_when={chat_template.KEY: chat_template.names_a_file},  # an inline template counts as config
        key_metric="rows/sft_data/train",
        summary="the base model and every dataset the later stages train and evaluate on",
        datasets=("sft_data", "pref_data", "prm_data", "prompts", "eval_data"),
    ),
    training_stage("sft", "sft_model", ("base_model", "sft_data"), "eval/loss",
                   "the SFT policy: the base model fine-tuned on the SFT data"),
    training_stage("rm", "reward_model", ("sft_model", "pref_data"), "eval/accuracy",
                   "the reward model: a Bradley-Terry scorer trained from the SFT model on the preference pairs",
                   kernels=("model.attn_implementation",),  # a sequence classifier: Liger patches causal LMs only
                   run_when=paired_preferences, off_because="data.preference.unpaired: KTO's rows, no pairs"),
    training_stage("prm", "prm", ("sft_model", "prm_data"), "eval/step_accuracy",
                   "the process reward model: a per-step scorer trained from the SFT model on labelled solution steps"),
    StageSpec(
        name="rl",
        entrypoint="runtime.rl_driver:run",
        plots_eval_series=True,
        inputs=("sft_model", "prompts", "eval_data", *REWARD_MODELS),
        input_when={a: both(scored_by_reward, uses) for a, uses in SCORES_WITH.items()}
        | {"reward_model": either(both(scored_by_reward, SCORES_WITH["reward_model"]), critic_from_reward_model)},
        outputs=("rl_model", "critic_model"),
        optional_outputs=("critic_model",),
        requested_outputs=("critic_model",),  # rl.critic.save_value_network
        config_keys=("seed", *LM_KERNELS, "rl", "reward", "prm.step_separator", *RL_EVAL_KEYS,
                     "infra.zero_stage", "infra.precision", "infra.deterministic"),
        local_sources=(*REWARD_FILES, "rl.critic.init_path"),
        config_when=dict.fromkeys(("reward", "prm.step_separator", *REWARD_FILES), scored_by_reward),
        key_metric="eval/reward",
        summary="the RL policy: the SFT model trained on its own samples, scored by the reward section's source "
                "(and with rl.critic.save_value_network its critic)",
        driver=True,
        register=("rl_model", "critic_model"),
    ),
    training_stage("dpo", "dpo_model", ("sft_model", "pref_data", "prompts", *REWARD_MODELS), "eval/reward_accuracy",
                   "the DPO policy: the SFT model trained on preference pairs (or its own ranked samples)",
                   input_when={"prompts": iterative_dpo, **{a: iterative_dpo_with(uses) for a, uses in SCORES_WITH.items()}},
                   config_keys=("reward", "prm.step_separator"), local_sources=REWARD_FILES,
                   config_when=dict.fromkeys(("reward", "prm.step_separator", *REWARD_FILES), iterative_dpo)),
    training_stage("rs", "rs_model", ("sft_model", "sft_data", "prompts", *REWARD_MODELS), "eval/loss",
                   "the rejection-sampling policy: the SFT model trained on the best of its own samples the reward keeps",
                   input_when=SCORES_WITH, config_keys=("reward", "prm.step_separator"), local_sources=REWARD_FILES,
                   run_when=rejection_sampling, off_because="rs.enabled is false"),
    training_stage("kd", "kd_model", ("sft_model", "sft_data", "rl_model", "dpo_model"), "eval/kl",
                   "the distilled policy: a student (the SFT model or a smaller one) trained toward the teacher's "
                   "distributions",
                   input_when={"rl_model": kd_teacher("rl"), "dpo_model": kd_teacher("dpo")},
                   local_sources=("kd.teacher_path",), run_when=distillation, off_because="kd.enabled is false"),
    training_stage("csft", "csft_model", ("sft_model", "sft_data", "reward_model"), "eval/loss",
                   "the conditional-SFT policy: the SFT model trained on the SFT data with each response's RM score in "
                   "its prompt",
                   input_when={"reward_model": own_reward_model},
                   config_keys=("reward.rm_paths", "reward.normalize", "reward.batch_size"),
                   local_sources=("reward.rm_paths",), run_when=conditional_sft, off_because="csft.enabled is false"),
    StageSpec(
        name="lora_merge",
        entrypoint="stages.lora_merge.stage:run",
        inputs=("sft_model", "reward_model", "prm", "dpo_model", "rl_model"),
        optional_inputs=("sft_model", "reward_model", "prm", "dpo_model", "rl_model"),
        outputs=("merged_models",),
        config_keys=("seed", *(f"{section}.lora" for section in ADAPTER_SECTIONS)),
        key_metric="merge/max_logit_diff",
        summary="full checkpoints of the LoRA adapters the run trained, each merged into its base",
        run_when=trains_adapters,
        off_because="no stage trains a LoRA adapter",
        takes_adapters=True,
        register=("merged_models",),
    ),
    StageSpec(
        name="eval",
        entrypoint="stages.eval.stage:run",
        inputs=("base_model", "sft_model", "rl_model", "dpo_model", *OPTIONAL_POLICIES, "sft_data", "eval_data",
                *REWARD_MODELS),
        input_when={**SCORES_WITH, **OPTIONAL_POLICIES},
        optional_inputs=("dpo_model", *OPTIONAL_POLICIES, "sft_data"),  # no SFT rows: no perplexity
        outputs=("eval_report",),
        # no prm.step_separator: a PRM scorer reads the separator it was trained with from its checkpoint
        config_keys=("seed", *LM_KERNELS, "eval", "reward", "infra.deterministic"),
        local_sources=REWARD_FILES,
        key_metric=SCORE,
        summary="every policy scored on the held-out prompts: the report the champion is chosen by",
        scores_models=True,
    ),
)

BY_NAME = {spec.name: spec for spec in STAGES}
DATASETS = tuple(name for spec in STAGES for name in spec.datasets)  # the artifacts that are datasets, not models


def producer(artifact: str) -> StageSpec:
    for spec in STAGES:
        if artifact in spec.outputs:
            return spec
    raise KeyError(f"no stage produces {artifact!r}")


def upstream(spec: StageSpec) -> list[str]:
    """Names of the stages whose outputs `spec` consumes, in pipeline order."""
    names = {producer(a).name for a in spec.inputs}
    return [s.name for s in STAGES if s.name in names]


def needed_by(names: set[str] | list[str], cfg: PipelineConfig) -> set[str]:
    """The stages whose outputs the given stages consume under `cfg`, transitively (not themselves
    unless one consumes another); a pinned input (`cfg.inputs`) needs no producer."""
    needed: set[str] = set()
    for spec in reversed(STAGES):  # consumers before producers
        if spec.name in names or spec.name in needed:
            needed |= {producer(a).name for a in spec.wanted_inputs(cfg) if a not in cfg.inputs}
    return needed


def pinned_away(spec: StageSpec, cfg: PipelineConfig) -> bool:
    """Every output of the stage is pinned to an existing artifact: it need not run (what it makes only on
    request, `requested_outputs`, goes unmade)."""
    return set(spec.outputs) - set(spec.requested_outputs) <= set(cfg.inputs)


def check_pins(cfg: PipelineConfig) -> None:
    from configs.errors import ConfigError

    artifacts = [a for spec in STAGES for a in spec.outputs]
    unknown = [a for a in cfg.inputs if a not in artifacts]
    if unknown:
        raise ConfigError(f"inputs.{unknown[0]}: no stage produces {unknown[0]!r} (artifacts: {', '.join(artifacts)})")


def check_stages(names: list[str], option: str) -> None:
    """Every name is a stage (`option` names where the names came from, for the error)."""
    from configs.errors import ConfigError

    unknown = [s for s in names if s not in BY_NAME]
    if unknown:
        raise ConfigError(f"{option} {' '.join(unknown)}: unknown stage (stages: {', '.join(BY_NAME)})")


def reused_by_only(only: list[str] | None, cfg: PipelineConfig) -> set[str]:
    """The stages `--only` reuses from MLflow: those the named stages need, less the named ones."""
    return needed_by(only, cfg) - set(only) if only else set()


def check_request(cfg: PipelineConfig, force: list[str], only: list[str]) -> None:
    """A run's request names real stages and artifacts, and does not force a stage that --only reuses."""
    from configs.errors import ConfigError

    check_stages(force, "--force")
    check_stages(only, "--only")
    check_stages(list(cfg.infra.stage_retries), "infra.stage_retries")
    clash = set(force) & reused_by_only(only, cfg)
    if clash:
        raise ConfigError(f"--force {' '.join(sorted(clash))}: --only reuses it; add it to --only to rerun it")
    for option, names in (("--only", only), ("--force", force)):
        if "rm" in names and not paired_preferences(cfg):
            raise ConfigError(f"{option} rm: the RM trains on preference pairs, and data.preference.unpaired gives KTO's "
                              "single responses; give pairs (data.preference.unpaired=false) to train it")
    check_pins(cfg)


def check_order() -> None:
    """Every stage's producers are declared before it (the flow relies on it)."""
    seen: set[str] = set()
    for spec in STAGES:
        missing = set(upstream(spec)) - seen
        if missing:
            raise AssertionError(f"{spec.name} is declared before its upstream {sorted(missing)}")
        seen.add(spec.name)
