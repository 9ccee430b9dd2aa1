"""OpenRLHF 0.8's loop recipes as one stage of ours: `batch_inference` generate -> `batch_inference` rm with
`--post_processor rs` -> train_sft is the rs stage, with `iter_dpo` -> train_dpo it is iterative DPO
(dpo.iterative), a `csft` scoring pass -> train_sft is the csft stage. The loop's round count and each
step's sizes go to the stage's keys; the trainer's flags convert as the trainer's own do
(configs/from_openrlhf/convert.py), into the stage's section; what has no counterpart is listed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from configs.errors import ConfigError
from configs.from_openrlhf.convert import Conversion, Skipped, checked, convert, derive, schema_default, set_comment
from configs.from_openrlhf.flags import DPO, LAUNCHER, NOT_YET, SFT, Flag, Trainer
from configs.from_openrlhf.loops import Recipe, Step
from configs.from_openrlhf.script import FlagUse
from configs.from_openrlhf.values import Listed, NotMapped, Number, Switch, left_to_shell

GENERATE, SCORE, CSFT = "generate", "rm", "csft"  # the step tables: sampling, scoring for rs / iter_dpo, scoring for csft


@dataclass(frozen=True)
class Kind:
    """A recipe: its post-processor, the trainer it feeds, and where they go here."""

    name: str
    processor: str  # batch_inference --post_processor
    trainer: Trainer  # the trainer's flags, into the stage's section
    section: str  # the sampling keys' section (rs, dpo.iterative); empty: the recipe samples nothing
    rounds_key: str  # empty: one pass, no loop
    no_data: str  # why the stage names no dataset that holds what the loop's files held, for the config's notes
    reasons: dict[str, str] = field(default_factory=dict)  # the trainer's flags whose reason differs in the loop


KINDS = {k.processor: k for k in (
    Kind("rejection-sampling loop", "rs",
         Trainer(SFT, "rs", ("rs",), None, sets={"rs.enabled": True},
                 no_data="the loop's kept samples (the rm step's output): the rs stage keeps each round's in its work dir"),
         "rs", "rs.rounds",
         "data.sft: none in the script (its prompts have no responses); the rs stage holds SFT rows out for its "
         "eval/loss: name them before running it",
         reasons={"--input_template": "the rs stage trains on the prompts as it sampled them (as data.prompts renders "
                                      "them)"}),
    Kind("iterative DPO loop", "iter_dpo",
         Trainer(DPO, "dpo", ("dpo",), None,
                 no_data="the loop's pairs (the rm step's output): the dpo stage pairs each round's samples itself"),
         "dpo.iterative", "dpo.iterative.rounds",
         "data.preference: none in the script; the dpo stage holds preference pairs out for its eval "
         "(eval/reward_accuracy): name them before running it",
         reasons={"--ref_pretrain": "each round's reference is the policy it starts from (the script keeps the first "
                                    "round's)"}),
    Kind("conditional SFT recipe", "csft",
         Trainer(SFT, "csft", ("csft",), None, sets={"csft.enabled": True},
                 no_data="the rm step's scored rows (its output): the csft stage scores data.sft itself"),
         "", "", ""),
)}

WORK_FILES = "a round's {} stay in the stage's work dir"
SHARED = {  # every step's flags that name how it runs, not what it computes
    "--zero_stage": "the step loads its model whole on each rank",
    "--bf16": "the stage runs in the trainer's precision (infra.precision)",
    "--attn_implementation": "the stage's model.attn_implementation (the trainer's)",
    "--seed": "the stage's seed (seed) draws each round's prompts and samples",
    "--local_rank": LAUNCHER,
    "--disable_fast_tokenizer": "no counterpart yet: the fast tokenizer is used",
    "--full_determinism": "the stage's infra.deterministic (the trainer's)",
    "--use_ms": "ModelScope is not supported: hub ids are Hugging Face's",
    "--value_head_prefix": "a reward model's checkpoint names its own head (config.json value_head_prefix)",
}
SCORED_IN_MEMORY = "the generate step's samples: the stage scores them in memory each round"
READ = ("--eval_task", "--iter", "--post_processor")  # the recipe's structure: read, not listed

ROWS: tuple[Flag, ...] = (
    Flag(("--dataset",), (GENERATE,), ("data.prompts.paths",), Listed()),
    Flag(("--dataset_probs",), (GENERATE,), ("data.prompts.probs",), Listed(numbers=True)),
    Flag(("--input_key",), (GENERATE,), ("data.prompts.input_key",)),
    Flag(("--apply_chat_template",), (GENERATE,), ("data.prompts.apply_chat_template",), Switch(), absent=False),
    Flag(("--input_template",), (GENERATE,), ("data.prompts.input_template",)),
    Flag(("--max_samples",), (GENERATE,), ("data.prompts.max_samples",), Number(integer=True)),
    Flag(("--output_key",), (GENERATE,), why="the prompts' responses are the policy's samples"),
    Flag(("--best_of_n",), (GENERATE,), ("{loop}.samples_per_prompt",), Number(integer=True)),
    Flag(("--rollout_batch_size",), (GENERATE,), ("{loop}.prompts_per_round",), Number(integer=True), absent=2048,
         why="with --iter, each round's own slice of the prompts: the stage draws fresh ones each round"),
    Flag(("--temperature",), (GENERATE,), ("{loop}.temperature",), Number()),
    Flag(("--top_p",), (GENERATE,), ("{loop}.top_p",), Number()),
    Flag(("--max_new_tokens",), (GENERATE,), ("{loop}.max_new_tokens",), Number(integer=True), absent=1024),
    Flag(("--max_num_seqs",), (GENERATE,), ("{loop}.generate_batch_size",), Number(integer=True),
         why="vLLM's most sequences at once; here the sequences of one generate call"),
    Flag(("--micro_batch_size",), (GENERATE,), ("{loop}.generate_batch_size",), Number(integer=True),
         why="HF generate's batch (--eval_task generate)"),
    Flag(("--prompt_max_len",), (GENERATE,),
         why="a prompt is bounded with its row by data.max_len (a longer row is dropped at data prep)"),
    Flag(("--max_len",), (GENERATE,), why="sampling reads --prompt_max_len and --max_new_tokens"),
    Flag(("--greedy_sampling",), (GENERATE,), why="the stage samples (its temperature and top_p)"),
    Flag(("--repetition_penalty",), (GENERATE,), why=NOT_YET),
    Flag(("--tp_size",), (GENERATE,), why="no tensor parallelism: each rank samples its share of the prompts"),
    Flag(("--enable_prefix_caching",), (GENERATE,), why="the stage samples with HF generate, not a vLLM engine"),
    Flag(("--output_path",), (GENERATE,), why=WORK_FILES.format("samples")),
    Flag(("--enable_csft", "--csft_prompt"), (GENERATE,),
         why="conditional SFT's generation prompt is csft.template with csft.target_reward, in the eval stage"),
    Flag(("--pretrain",), (SCORE, CSFT), ("reward.rm_paths",), Listed(), also={"reward.source": "rm"}),
    Flag(("--micro_batch_size",), (SCORE, CSFT), ("reward.batch_size",), Number(integer=True), absent=16),
    Flag(("--dataset", "--dataset_probs", "--input_key", "--output_key", "--apply_chat_template", "--input_template",
          "--max_samples"), (SCORE,), why=SCORED_IN_MEMORY),
    Flag(("--max_len",), (SCORE,), why="the scorer reads each sample whole: a prompt and at most max_new_tokens"),
    Flag(("--normalize_reward", "--reward_template"), (SCORE,), why="OpenRLHF's rs and iter_dpo processors ignore it"),
    Flag(("--output_path",), (SCORE,), why=WORK_FILES.format("scored samples")),
    Flag(("--dataset",), (CSFT,), ("data.sft.paths",), Listed(), why="the rows scored, then trained on"),
    Flag(("--dataset_probs",), (CSFT,), ("data.sft.probs",), Listed(numbers=True)),
    Flag(("--input_key",), (CSFT,), ("data.sft.input_key",)),
    Flag(("--output_key",), (CSFT,), ("data.sft.output_key",)),
    Flag(("--apply_chat_template",), (CSFT,), ("data.sft.apply_chat_template",), Switch(), absent=False),
    Flag(("--input_template",), (CSFT,), ("data.sft.input_template",)),
    Flag(("--max_samples",), (CSFT,), ("data.sft.max_samples",), Number(integer=True)),
    Flag(("--normalize_reward",), (CSFT,), ("csft.normalize_reward",), Switch(), absent=False),
    Flag(("--reward_template",), (CSFT,),
         why="csft.template writes {prompt} and {reward} (one decimal) where OpenRLHF's writes {input} and {reward} (two): "
             "set csft.template"),
    Flag(("--max_len",), (CSFT,), why="a row is bounded by data.max_len (the trainer's --max_len)"),
    Flag(("--output_path",), (CSFT,), why="the scored rows stay in the stage's work dir"),
)
INDEX = {(table, name): row for row in ROWS for table in row.trainers for name in row.names}


def convert_recipe(recipe: Recipe, origin: str, sets: Sequence[tuple[str, object, str]] = ()) -> Conversion:
    """The recipe's stage: the trainer's flags into its section, the steps' and the loop's sizes, the datasets;
    a recipe this project has no stage for is a ConfigError naming `origin`'s line."""
    kind = kind_of(recipe, origin)
    c = convert(recipe.trainer, origin, trainer=kind.trainer)
    c.recipe = describe(kind, recipe)
    for key, value in kind.trainer.sets.items():
        c.set(key, value, f"the script's {kind.name}", "derived")
    c.skipped = [Skipped(s.flag, kind.reasons.get(s.flag.name, s.reason)) for s in c.skipped]
    for step in recipe.steps:
        table = GENERATE if step.task.startswith("generate") else (CSFT if kind.processor == "csft" else SCORE)
        if table == GENERATE and not kind.section:
            c.skipped.append(Skipped(FlagUse("batch_inference", ("--eval_task", step.task), step.line),
                                     f"the {kind.trainer.stage} stage samples nothing: it scores and trains on data.sft"))
            continue
        step_flags(c, kind, step, table, recipe)
    c.skipped += [Skipped(chore.use, chore.reason) for chore in recipe.chores]
    rounds(c, kind, recipe)
    for key, value, text in sets:
        if key.startswith("data.") and value is not None and not isinstance(value, dict):
            c.set(key, value, set_comment(text, c.settings[key].source if key in c.settings else ""), "set")
    datasets(c, kind)
    if kind.processor == "iter_dpo":
        dpo_steps(c)
    return c


def kind_of(recipe: Recipe, origin: str) -> Kind:
    scoring = [s for s in recipe.steps if s.task == "rm"]
    processors = [(s, " ".join(u.words)) for s in scoring for u in s.flags if u.name == "--post_processor"]
    if not processors:
        raise ConfigError(f"{origin} line {recipe.steps[0].line}: batch_inference names no --post_processor (rs, iter_dpo, "
                          f"csft): OpenRLHF's loop recipes score with one; convert the trainer's command alone")
    step, processor = processors[0]
    kind = KINDS.get(processor)
    if kind is None or kind.trainer.name != recipe.trainer.trainer:
        raise ConfigError(f"{origin} line {step.line}: batch_inference --post_processor {processor} with "
                          f"{recipe.trainer.trainer}: OpenRLHF's loop recipes pair rs and csft with train_sft, iter_dpo "
                          "with train_dpo; convert the trainer's command alone")
    return kind


def describe(kind: Kind, recipe: Recipe) -> str:
    steps = [f"batch_inference {s.task} (line {s.line})" for s in recipe.steps] + [f"{recipe.trainer.trainer} (line "
                                                                                   f"{recipe.trainer.line})"]
    count = f"{recipe.loop.rounds} rounds of " if recipe.loop and recipe.loop.rounds is not None else ""
    return f"{kind.name}: {count}{', '.join(steps)}"


def step_flags(c: Conversion, kind: Kind, step: Step, table: str, recipe: Recipe) -> None:
    """One step's flags: each to its keys, or listed with its reason; OpenRLHF's defaults where ours differ."""
    used = {use.name for use in step.flags}
    for use in step.flags:
        if use.name in READ:
            continue
        if use.name == "--pretrain" and table == GENERATE:
            if use.words != tuple(w for u in recipe.trainer.flags if u.name == "--pretrain" for w in u.words):
                c.skipped.append(Skipped(use, "samples with another model than the one trained: here each round samples "
                                              "with the policy it trains"))
            continue
        row = INDEX.get((table, use.name))
        try:
            if row is None:
                raise NotMapped(SHARED.get(use.name, "unknown to OpenRLHF's batch_inference"))
            if not row.mapped:
                raise NotMapped(row.why)
            keys = [key.replace("{loop}", kind.section) for key in row.keys]
            if (shell := left_to_shell(use.words)) is not None and not isinstance(row.value, Listed):
                raise NotMapped(f"{shell} is filled in by the shell: set {keys[0]} with --set")
            value = checked(row, use, c.origin)
        except NotMapped as exc:
            c.skipped.append(Skipped(use, str(exc)))
            continue
        source = f"{use.shown()} (batch_inference {step.task}, line {use.line})" + (f": {row.why}" if row.why else "")
        for key in keys:
            c.set(key, value, source, use=use)
        for key, v in row.also.items():
            c.set(key, v, source, use=use)
    for row in ROWS:
        if table in row.trainers and row.absent is not None and not used & set(row.names):
            for key in (k.replace("{loop}", kind.section) for k in row.keys):
                if key not in c.settings:
                    c.set(key, row.absent, f"OpenRLHF's default (no {row.names[0]} in batch_inference {step.task})", "default")


def rounds(c: Conversion, kind: Kind, recipe: Recipe) -> None:
    """The loop's round count as the stage's rounds: each from the last round's policy."""
    if not kind.rounds_key:
        return
    loop = recipe.loop if any(step.in_loop for step in recipe.steps) else None
    if loop is None:
        c.set(kind.rounds_key, 1, "the steps run once, in no loop: one round", "derived")
        return
    if loop.rounds is None:
        c.skipped.append(Skipped(FlagUse(f"while {loop.shown}", (), loop.line),
                                 f"the round count is not a number the script sets: set {kind.rounds_key} with --set"))
        return
    switch = (f"; each round from the last one's policy (line {recipe.policy_switch})" if recipe.policy_switch else "")
    c.set(kind.rounds_key, loop.rounds, loop.source + switch, "derived")


def datasets(c: Conversion, kind: Kind) -> None:
    """The recipe's datasets: prompts from the generate step (rs, iterative DPO) or SFT rows from the scoring pass
    (csft, its prompts derived from them)."""
    c.notes.pop("data", None)
    c.set("data.source", "files", "the script's dataset", "derived")
    if kind.processor == "csft":
        if "data.sft.paths" not in c.settings:
            raise ConfigError(f"{c.origin}: the csft scoring step names no --dataset: the rows it scores and trains on")
        prompt, response = c.value("data.sft.input_key", "input"), c.value("data.sft.output_key")
        if response is None:
            c.notes["data.sft"] = (f"OpenRLHF reads {prompt} without --output_key as a conversation, its last turn the "
                                   "response; conditional SFT here takes single-turn rows: set data.sft.input_key and "
                                   "data.sft.output_key to a prompt and a response column")
        derive(c, "data.sft", "data.prompts", "the SFT rows' prompts, their responses as labels (the schema needs prompts "
                                              "for rl and eval)", input_key=prompt, label_key=response or prompt)
        return
    if "data.prompts.paths" not in c.settings:
        raise ConfigError(f"{c.origin}: the {kind.name}'s generate step names no --dataset: the prompts it samples")
    if "data.prompts.label_key" not in c.settings:
        c.set("data.prompts.label_key", c.value("data.prompts.input_key", "input"),
              "no label column: the reward model reads none, and the schema needs one; the prompt stands in", "derived")
    c.notes["data"] = kind.no_data


def dpo_steps(c: Conversion) -> None:
    """Iterative DPO shares dpo.max_steps between its rounds; OpenRLHF trains each round's pairs (one per prompt)
    for --max_epochs: that many optimizer steps per round."""
    rounds_, prompts, micro, accumulation, ranks, epochs = (
        c.value(key, schema_default(key)) for key in ("dpo.iterative.rounds", "dpo.iterative.prompts_per_round",
                                                      "dpo.micro_batch_size", "dpo.grad_accum_steps", "infra.num_workers",
                                                      "dpo.epochs"))
    if not (isinstance(rounds_, int) and rounds_ and isinstance(prompts, int) and isinstance(micro, int)
            and isinstance(accumulation, int) and isinstance(ranks, int) and isinstance(epochs, int)):
        return  # the round count is not read: the user sets dpo.max_steps with it
    batch = micro * accumulation * ranks
    per_round = max(1, math.ceil(prompts * epochs / batch))
    c.set("dpo.max_steps", rounds_ * per_round, f"{rounds_} rounds x {per_round} steps: a round's {prompts} prompts, one "
                                                f"pair each, {epochs} epoch{'s' if epochs != 1 else ''} in batches of {batch}", "derived")
