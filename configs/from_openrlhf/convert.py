"""An OpenRLHF trainer call as this project's config keys, each with where its value came from.

The flag table (configs/from_openrlhf/flags.py) maps each flag; what no single flag says is derived here,
each rule with the comment a reader sees beside its keys: the starting model pinned as the SFT model,
accumulation steps from the global batch, PPO's prompt and response bounds from its total length,
the datasets the schema needs that the script does not name, OpenRLHF's GPU ranks, and the few flag
pairs this project takes one of.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError

from configs.errors import ConfigError
from configs.from_openrlhf.flags import KTO, PPO, PRM, ROWS, TRAINERS, Flag, Trainer, row_for
from configs.from_openrlhf.script import FlagUse, TrainerCall
from configs.from_openrlhf.values import (
    BadValue,
    Choice,
    CriticStart,
    Factor,
    Listed,
    NotMapped,
    Pair,
    PerRank,
    RewardModel,
    RewardUrl,
    Switch,
    Text,
    Words,
    left_to_shell,
)
from configs.schema import PipelineConfig, section_type

TEXTUAL = (Text, Words, RewardModel, RewardUrl, CriticStart)  # kinds whose values may hold a `$VAR` the shell fills in
COPIED = ("paths", "probs", "split", "max_samples", "apply_chat_template", "input_template")  # what a derived dataset shares
EVAL_SHARED = ("apply_chat_template", "input_template")  # what --eval.dataset reads as the prompts do
OPENRLHF_LENGTHS = {"data.max_len": 2048, "rl.rollout.prompt_max_len": 1024, "rl.rollout.generate_max_len": 1024}


@dataclass
class Setting:
    value: object
    source: str  # the comment beside the key
    kind: str = "flag"  # flag | default (OpenRLHF's, the script not saying) | derived | set (--set)
    use: FlagUse | None = None


@dataclass(frozen=True)
class Skipped:
    flag: FlagUse
    reason: str


@dataclass
class Conversion:
    call: TrainerCall
    trainer: Trainer
    origin: str
    settings: dict[str, Setting] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # comments on sections (`data.prompts:  # derived ...`)
    skipped: list[Skipped] = field(default_factory=list)
    parked: dict[str, Setting] = field(default_factory=dict)  # pins the schema does not take yet, shown commented out
    recipe: str = ""  # a loop recipe's name and steps (`rejection-sampling loop: 10 rounds of ...`); empty: one trainer call

    @property
    def source_name(self) -> str:
        """What of the script the config does: `train_sft`, or `train_sft in its rejection-sampling loop`."""
        return self.trainer.name + (f" in its {self.recipe.split(':')[0]}" if self.recipe else "")

    def set(self, key: str, value: object, source: str, kind: str = "flag", use: FlagUse | None = None) -> None:
        self.settings[key] = Setting(value, source, kind, use)

    def value(self, key: str, default: object = None) -> object:
        return self.settings[key].value if key in self.settings else default

    def has_section(self, section: str) -> bool:
        return any(key.startswith(section + ".") for key in self.settings)

    def drop(self, key: str, reason: str) -> None:
        """Take back a flag's key: the flag is listed as not mapped, for `reason`."""
        setting = self.settings.pop(key)
        if setting.use is not None:
            self.skipped.append(Skipped(setting.use, reason))

    @property
    def generation(self) -> str:
        known = [f.name for f in self.call.flags if row_for(self.trainer.name, f.name) is not None]
        nested = any("." in name for name in known)
        flat = any("." not in name for name in known if name not in ("--local_rank", "--use_ms", "--optim"))
        if nested and flat:
            return "flat and nested flags mixed"
        return "nested flags (OpenRLHF 0.10.2 on)" if nested else "flat flags (OpenRLHF 0.5 to 0.10.1)"


def expand(key: str, trainer: Trainer) -> list[str]:
    """A row's key at the trainer's places: `{model}.lr` -> `rl.actor.lr`, `rl.critic.lr` for PPO. A place the
    trainer's stage lacks (rs, kd and csft train whole models: no `lora`) is NotMapped."""
    if "{data}" in key:
        if trainer.data is None:
            raise NotMapped(trainer.no_data)
        return [key.replace("{data}", trainer.data)]
    models = trainer.models if "{model}" in key else (trainer.stage,)
    keys = [key.replace("{model}", model).replace("{stage}", trainer.stage) for model in models]
    for found in keys:
        if not in_schema(found):
            if ".lora." in found:
                raise NotMapped(f"the {trainer.stage} stage trains the whole model (no LoRA)")
            raise NotMapped(f"the {trainer.stage} stage has no {found.rsplit('.', 1)[1]} ({found})")
    return keys


def in_schema(key: str) -> bool:
    """`key` names a field of the config's sections."""
    section: type[BaseModel] | None = PipelineConfig
    for part in key.split("."):
        if section is None or part not in section.model_fields:
            return False
        section = section_type(section.model_fields[part].annotation)
    return True


def convert(call: TrainerCall, origin: str, sets: Sequence[tuple[str, object, str]] = (),
            trainer: Trainer | None = None) -> Conversion:
    """The config keys of `call`, from the table, then the derived ones; a value OpenRLHF would refuse is a
    ConfigError naming `origin`'s line. `sets`: the user's `--set` (key, value, as written) on data keys,
    applied before the datasets are derived from one another, so that a derived set follows them. `trainer`:
    where the call's keys go when a loop recipe runs it (train_sft as the rs stage's training), else its own."""
    c = Conversion(call, trainer or TRAINERS[call.trainer], origin)
    used = {f.name for f in call.flags}
    factors: dict[str, dict[tuple[str, ...], tuple[int, FlagUse]]] = {}  # key -> a factor row's names -> its value
    global_batch: list[tuple[str, int, FlagUse]] = []
    ordered = sorted(call.flags, key=lambda f: bool((row := row_for(call.trainer, f.name)) and row.needs))
    for use in ordered:
        row = row_for(call.trainer, use.name)
        if row is None:
            c.skipped.append(Skipped(use, f"unknown to OpenRLHF's {call.trainer}"))
            continue
        try:
            value, keys = read_flag(row, use, used, c)
        except NotMapped as exc:
            c.skipped.append(Skipped(use, str(exc)))
            continue
        source = use.shown() + variable_note(use.words, call.variables) + (f": {row.why}" if row.why else "")
        if isinstance(row.value, Factor) and isinstance(value, int):
            for key in keys:
                factors.setdefault(key, {})[row.names] = (value, use)
        elif isinstance(row.value, PerRank) and isinstance(value, int):
            global_batch += [(key, value, use) for key in keys]
        elif isinstance(value, dict):
            for key, v in value.items():
                c.set(key, v, source, use=use)
        elif isinstance(row.value, Pair) and isinstance(value, tuple):
            for key, v in (zip(keys, value) if len(keys) > 1 else [(keys[0], list(value))]):
                c.set(key, v, source, use=use)
        else:
            for key in keys:
                c.set(key, value, source, use=use)
        for key, v in row.also.items():
            c.set(key, v, source, use=use)
    for key, sources in factors.items():
        c.set(key, *product(key, sources, c.trainer))
    for key, v in c.trainer.sets.items():
        c.set(key, v, call.trainer)
    for stray in call.stray:
        end = max((f.line for f in call.flags), default=call.line)
        c.skipped.append(Skipped(stray, f"not passed to the trainer: its command ends on line {end} (a missing `\\`?)"))
    launcher_ranks(c)
    for key, total, use in global_batch:
        accumulation(c, key, total, use)
    pin_starting_model(c)
    park_refused_pins(c)
    openrlhf_defaults(c, used)
    if c.trainer.name == PPO:
        rollout_lengths(c)
        critic_start(c)
    for key, value, text in sets:
        if key.startswith("data.") and value is not None and not isinstance(value, dict):
            c.set(key, value, set_comment(text, c.settings[key].source if key in c.settings else ""), "set")
    datasets(c)
    c.set("infra.gpus_per_worker", 1, "OpenRLHF trains on GPUs: one per rank", "default")
    resolve_conflicts(c)
    return c


def read_flag(row: Flag, use: FlagUse, used: set[str], c: Conversion) -> tuple[object, list[str]]:
    """The row's value for `use` and the keys it goes to; NotMapped when it has none here."""
    if row.needs and not used & set(row.needs):
        raise NotMapped(f"takes effect only with {row.needs[0]}")
    if not row.mapped:
        if isinstance(row.value, Choice):
            checked(row, use, c.origin)  # a reason that depends on the value, or OpenRLHF's own refusal
        raise NotMapped(row.why)
    keys = [k for key in row.keys for k in (expand(key, c.trainer) if "{" in key else [key])]
    if isinstance(row.value, Switch) and use.words and all(left_to_shell((w,)) for w in use.words):
        # `--flash_attn $EXTRA_ARGS`: words the shell fills in, not the switch's
        c.skipped.append(Skipped(FlagUse(use.words[0], use.words[1:], use.line), "filled in by the shell: not read"))
        use = FlagUse(use.name, (), use.line)
    shell = left_to_shell(use.words)
    textual = isinstance(row.value, TEXTUAL) or (isinstance(row.value, Listed) and not row.value.numbers)
    if shell is not None and not textual:
        raise NotMapped(f"{shell} is filled in by the shell: set {keys[0]} with --set")
    return checked(row, use, c.origin), keys


def checked(row: Flag, use: FlagUse, origin: str) -> object:
    try:
        return row.value.convert(use.words)
    except BadValue as exc:
        shown = f" {' '.join(use.words)!r}" if use.words else ""
        raise ConfigError(f"{origin} line {use.line}: {use.name}{shown}: {exc}") from None


def product(key: str, used: dict[tuple[str, ...], tuple[int, FlagUse]], trainer: Trainer) -> tuple[int, str]:
    """`--actor_num_nodes 2 --actor_num_gpus_per_node 8` -> 16, a factor the script omits at OpenRLHF's default."""
    rows = [r for r in ROWS if trainer.name in r.trainers and isinstance(r.value, Factor) and key in r.keys]
    total, parts = 1, []
    for row in rows:
        if row.names in used:
            value, use = used[row.names]
            parts.append(use.shown())
        else:
            value = row.value.default if isinstance(row.value, Factor) else 1
            parts.append(f"{row.names[0]} {value} (OpenRLHF's default)")
        total *= value
    return total, " x ".join(parts)


def launcher_ranks(c: Conversion) -> None:
    """`deepspeed --num_gpus 8` / `torchrun --nproc_per_node 8 --nnodes 2`: the data-parallel ranks."""
    if c.trainer.name == PPO:
        return  # Ray places PPO's model groups: their sizes are the trainer's own flags
    words, counts = c.call.launcher, {}
    for i, word in enumerate(words[:-1]):
        name, _, inline = word.partition("=")
        if name in ("--num_gpus", "--nproc_per_node", "--nproc-per-node", "--num_nodes", "--nnodes"):
            value = inline or words[i + 1]
            if value.isdigit():
                counts[name] = int(value)
    per_node = counts.get("--num_gpus") or counts.get("--nproc_per_node") or counts.get("--nproc-per-node")
    if per_node:
        nodes = counts.get("--num_nodes") or counts.get("--nnodes") or 1
        shown = " ".join(f"{k} {v}" for k, v in counts.items())
        c.set("infra.num_workers", per_node * nodes, f"{words[0]} {shown}", "derived")


def accumulation(c: Conversion, key: str, total: int, use: FlagUse) -> None:
    """OpenRLHF's global batch as accumulation steps: global / (micro batch x data-parallel ranks)."""
    micro_key = key.rsplit(".", 1)[0] + ".micro_batch_size"
    micro = c.value(micro_key) or schema_default(micro_key)
    ranks = c.value("infra.num_workers", 1)
    assert isinstance(micro, int) and isinstance(ranks, int)
    steps = max(1, total // (micro * ranks))
    exact = "" if steps * micro * ranks == total else f", rounded from {total / (micro * ranks):g}"
    rank_text = f"{ranks} rank" + ("s" if ranks != 1 else "")
    c.set(key, steps, f"{use.shown()}: the global batch, over micro batch {micro} x {rank_text} "
                      f"(infra.num_workers){exact}", use=use)


def schema_default(key: str) -> object:
    node: object = PipelineConfig()
    for part in key.split("."):
        node = getattr(node, part)
    return node


def pin_starting_model(c: Conversion) -> None:
    """A trainer that starts from an SFT model: that model is the pipeline's sft_model, so sft does not run."""
    model = c.settings.get("model.name_or_path")
    if c.trainer.from_sft and model is not None:
        c.set("inputs.sft_model", model.value, f"{model.use.shown() if model.use else model.source}: "
                                              f"{c.trainer.name} starts from an SFT model, so sft does not run", use=model.use)


def pin_refused(artifact: str, value: object) -> str | None:
    """Why the schema's `inputs` refuses `value` as a pin (a hub id or a folder where it takes only MLflow URIs), or None."""
    try:
        PipelineConfig.model_validate({"inputs": {artifact: value}})
    except ValidationError as exc:
        return exc.errors()[0]["msg"]
    return None


def park_refused_pins(c: Conversion) -> None:
    """Pins `inputs` does not take: the reward model is named by reward.rm_paths instead; the SFT model is shown
    commented out, and sft runs (from model.name_or_path)."""
    for key in [k for k in c.settings if k.startswith("inputs.")]:
        setting = c.settings[key]
        if pin_refused(key.removeprefix("inputs."), setting.value) is None:
            continue
        del c.settings[key]
        if key == "inputs.reward_model":
            c.set("reward.rm_paths", [setting.value], f"{setting.source} ({key} takes MLflow URIs only here)", use=setting.use)
        else:
            c.parked[key] = Setting(setting.value, f"{setting.source.split(':')[0]}: {key} takes MLflow URIs only "
                                                   "here, so sft runs", "derived", setting.use)


def openrlhf_defaults(c: Conversion, used: set[str]) -> None:
    """OpenRLHF's defaults where ours differ and the script leaves the key unset."""
    for row in ROWS:
        if row.absent is None or c.trainer.name not in row.trainers or used & {*row.names, *row.absent_unless}:
            continue
        try:
            keys = [k for key in row.keys for k in expand(key, c.trainer)]
        except NotMapped:
            continue
        for key in keys:
            if key in c.settings or ("{data}" in row.keys[0] and not c.has_section(str(c.trainer.data))):
                continue
            name = next((n for n in row.names if ("." in n) == ("nested" in c.generation)), row.names[0])
            c.set(key, row.absent, f"OpenRLHF's default (no {name})", "default")


def rollout_lengths(c: Conversion) -> None:
    """PPO's prompt and response bounds. OpenRLHF 0.9 on bounds prompt + response (`--max_len`) and gives a
    response what its prompt leaves; here each has its own bound."""
    total, prompt, response = (c.value(k) for k in OPENRLHF_LENGTHS)
    source = " and ".join(s.use.shown() for k in OPENRLHF_LENGTHS if (s := c.settings.get(k)) and s.use)
    if total is None and prompt is None and response is None:
        for key, value in OPENRLHF_LENGTHS.items():
            c.set(key, value, "OpenRLHF's default", "default")
        return
    if isinstance(total, int):
        if prompt is None and isinstance(response, int) and total > response:
            c.set("rl.rollout.prompt_max_len", total - response, f"from {source}: what the response leaves", "derived")
        elif response is None and isinstance(prompt, int) and total > prompt:
            c.set("rl.rollout.generate_max_len", total - prompt, f"from {source}: what the prompt leaves", "derived")
        elif prompt is None and response is None:
            for key in ("rl.rollout.prompt_max_len", "rl.rollout.generate_max_len"):
                c.set(key, total, f"from {source}: OpenRLHF gives a response what its prompt leaves of it", "derived")
    elif isinstance(prompt, int) and isinstance(response, int):
        c.set("data.max_len", prompt + response, f"from {source}: a row holds a prompt and its response", "derived")


def critic_start(c: Conversion) -> None:
    """Where PPO's critic starts. OpenRLHF's `--critic_pretrain` is a path: the policy's model or the pinned reward
    model become rl.critic.init_from `sft` / `reward_model`. Without it OpenRLHF starts a gae critic from the first
    reward model, unless the reward is remote (or an agent's), and from the policy's model then; the schema's
    default is `sft`, so OpenRLHF's is written. Estimators without a critic ignore the critic's flags."""
    estimator = c.value("rl.algorithm.advantage_estimator")
    if estimator != "gae":
        c.settings.pop("rl.critic.init_path", None)  # the same flag as init_from's: listed once
        for key in ("rl.critic.init_from", "rl.critic.save_value_network"):
            if key in c.settings:
                c.drop(key, f"OpenRLHF ignores it: advantage_estimator {estimator} trains no critic")
        return
    path, pinned_rm = c.value("rl.critic.init_path"), c.value("inputs.reward_model")
    if path is not None:
        named = {c.value("model.name_or_path"): ("sft", "the policy's model"),
                 pinned_rm: ("reward_model", "the reward model, pinned as inputs.reward_model")}
        if path in named:
            use = c.settings.pop("rl.critic.init_path").use
            value, what = named[path]
            c.set("rl.critic.init_from", value, f"{use.shown() if use else '--critic.model_name_or_path'}: {what}", use=use)
        return
    rm_paths = c.value("reward.rm_paths")
    if c.value("reward.source") != "rm" or "rl.agent.path" in c.settings or not (pinned_rm or rm_paths):
        return
    flag = "--critic.model_name_or_path" if "nested" in c.generation else "--critic_pretrain"
    why = f"OpenRLHF's default (no {flag}): the critic starts from the reward model"
    if pinned_rm is not None:
        c.set("rl.critic.init_from", "reward_model", why, "default")
    elif isinstance(rm_paths, list):
        c.set("rl.critic.init_from", "path", why.replace("the reward model", "the first reward model"), "default")
        c.set("rl.critic.init_path", rm_paths[0], "", "default")


def datasets(c: Conversion) -> None:
    """`data.source: files` with the script's dataset, and the ones the schema also needs (SFT rows and
    prompts) derived from it; a script whose data has no counterpart here keeps the synthetic task."""
    section = c.trainer.data
    if section is None or f"{section}.paths" not in c.settings:
        for key in [k for k in c.settings if section and k.startswith(section + ".")]:
            c.drop(key, "the script names no dataset for it")
        if "sft.pretrain_mode" in c.settings:
            c.drop("sft.pretrain_mode", "the script names no dataset, and the synthetic task standing in has no plain text")
        why = c.trainer.no_data or "the script names no dataset"
        c.notes["data"] = f"{why}; the synthetic task stands in: point data.* at your files"
        return
    c.set("data.source", "files", "the script's dataset", "derived")
    if c.trainer.name == KTO:
        unpaired_datasets(c)
    elif c.trainer.name == PRM:
        text = c.value("data.prm.input_key", "input")
        derive(c, section, "data.sft", "a stand-in, the PRM texts as their own responses (the schema needs SFT rows; "
                                       "eval reads them for perplexity): name real SFT rows", input_key=text, output_key=text)
        derive(c, section, "data.prompts", "a stand-in, the PRM texts as prompts and labels (the schema needs prompts for rl "
                                           "and eval): name real prompts before running those", input_key=text, label_key=text)
    elif section == "data.sft":  # train_sft's rows, train_kd's
        derive(c, "data.sft", "data.prompts", "the SFT rows' prompts, their responses as labels (the schema needs "
                                                "prompts for rl and eval)",
               input_key=c.value("data.sft.input_key", "input"),
               label_key=c.value("data.sft.output_key") or c.value("data.sft.input_key", "input"))
    elif section == "data.preference":
        prompt = c.value("data.preference.input_key")
        chosen = c.value("data.preference.chosen_key", "chosen")
        turns = {"input_key": prompt, "output_key": chosen} if prompt else {"input_key": chosen, "multiturn": True}
        derive(c, section, "data.sft", "the chosen responses as SFT rows (the schema needs SFT rows; eval reads them "
                                       "for perplexity)", **turns)
        derive(c, section, "data.prompts", "the preference prompts, the chosen responses as labels (the schema needs "
                                           "prompts for rl and eval)" if prompt else
               "the chosen conversations in full, as labels too (the schema needs prompts for rl and eval): name real "
               "prompts before running those", input_key=prompt or chosen, label_key=chosen)
    else:  # PPO's prompts
        prompt = c.value("data.prompts.input_key", "input")
        label = c.value("data.prompts.label_key")
        if label is None:
            c.set("data.prompts.label_key", prompt, "no --label_key: the script's reward reads no labels, and the schema "
                                                    "needs a label column; the prompt stands in", "derived")
        if label is not None:
            derive(c, "data.prompts", "data.sft", "the prompts, their labels as responses (eval reads SFT rows for "
                                                  "perplexity)", input_key=prompt, output_key=label)
        else:  # no responses at all: no SFT rows (inputs.sft_model stands in for the sft stage)
            c.notes["data"] = ("no SFT rows (data.sft): the script's prompts have no responses, so eval reports no "
                               "perplexity; name SFT rows in data.sft for it")
        if "data.eval_prompts.paths" in c.settings:  # --eval.dataset: OpenRLHF reads it with the prompts' keys
            for name in (*EVAL_SHARED, "input_key", "label_key"):
                if f"data.prompts.{name}" in c.settings and f"data.eval_prompts.{name}" not in c.settings:
                    c.set(f"data.eval_prompts.{name}", c.value(f"data.prompts.{name}"), "", "derived")
            c.notes["data.eval_prompts"] = "derived: read with the prompts' keys, as OpenRLHF reads --eval.dataset"


def unpaired_datasets(c: Conversion) -> None:
    """KTO's rows: without --output_key OpenRLHF reads the input as a whole conversation, its last turn the
    response; SFT rows and prompts are derived from them."""
    prompt = c.value("data.preference.input_key", "input")
    response = c.value("data.preference.output_key")
    if response is None:
        c.set("data.preference.output_key", prompt, "no --output_key: the conversation's last turn is the response "
                                                    "(OpenRLHF's)", "derived")
    turns = {"input_key": prompt, "output_key": response} if response else {"input_key": prompt, "multiturn": True}
    derive(c, "data.preference", "data.sft", "a stand-in, the rows' responses, undesirable ones too, as SFT rows (the "
                                             "schema needs SFT rows; eval reads them for perplexity): name real SFT rows",
           **turns)
    derive(c, "data.preference", "data.prompts", "the rows' prompts, their responses as labels (the schema needs prompts "
                                                 "for rl and eval)", input_key=prompt, label_key=response or prompt)


def set_comment(text: str, earlier: str) -> str:
    """The comment beside a key `--set` gave: the override, and what the key said before it."""
    return f"--set {text}" + (f" (was {earlier})" if earlier else "")


def derive(c: Conversion, source: str, target: str, why: str, **keys: object) -> None:
    """`target` as a copy of `source`'s shared keys (paths, split, template, ...) plus `keys`, commented with `why`."""
    for name in COPIED:
        if f"{source}.{name}" in c.settings:
            c.set(f"{target}.{name}", c.settings[f"{source}.{name}"].value, "", "derived")
    for name, value in keys.items():
        c.set(f"{target}.{name}", value, "", "derived")
    c.notes[target] = f"derived: {why}"


def resolve_conflicts(c: Conversion) -> None:
    """Flag pairs OpenRLHF takes together and this project does not: the first keeps its key."""
    if c.value("dpo.loss") == "ipo" and "dpo.label_smoothing" in c.settings:
        c.drop("dpo.label_smoothing", "cDPO's label smoothing goes with the sigmoid loss, and --ipo is set")


def listed(skipped: Skipped) -> str:
    """One line of the not-mapped list."""
    shown = skipped.flag.shown()
    shown = shown if len(shown) <= 70 else shown[:67] + "..."
    return f"{shown}: {skipped.reason} (line {skipped.flag.line})"


def variable_note(words: tuple[str, ...], variables: dict[str, str]) -> str:
    """`$MODEL_PATH` is "Qwen/..." in the script: the value a reader would want beside the key."""
    names = [n for w in words for n in re.findall(r"\$\{?(\w+)\}?", w)]
    found = [f"{n}={variables[n]}" for n in dict.fromkeys(names) if n in variables]
    return f" (the script sets {', '.join(found)})" if found else ""
