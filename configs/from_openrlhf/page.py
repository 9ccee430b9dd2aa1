"""docs/from-openrlhf.md, generated from the flag table (configs/from_openrlhf/flags.py) so it cannot drift:

    python -m configs.from_openrlhf.page > docs/from-openrlhf.md
"""

from __future__ import annotations

from configs.from_openrlhf.flags import ALL, GROUPS, TRAINING, Flag
from configs.from_openrlhf.recipes import ROWS as RECIPE_ROWS
from configs.from_openrlhf.recipes import SHARED
from configs.from_openrlhf.values import shown

COMMAND = "python -m configs.from_openrlhf.page > docs/from-openrlhf.md"

INTRO = f"""\
# From OpenRLHF

<!-- Generated from configs/from_openrlhf/flags.py by `{COMMAND}`; edit the table, not this file. -->

`rlhf from-openrlhf SCRIPT` reads an OpenRLHF launch script (or, with `-`, a command line pasted on
standard input) that calls one of its trainers (`openrlhf.cli.train_sft`, `train_rm`, `train_prm`,
`train_dpo`, `train_kto`, `train_ppo_ray`, `train_kd`) through `deepspeed --module`, `python -m`, `torchrun -m` or
`ray job submit -- python3 -m`, and writes the config of this project that does the same: a commented
YAML for `rlhf run --config`. Beside each key is the flag it came from; a header says which stages run
and the `--only` that runs the script's stage alone; the flags it could not map are listed at the end,
each with the reason. It takes the flat flags of OpenRLHF 0.5 to 0.10.1 (`--pretrain`,
`--actor_learning_rate`) and the nested ones of 0.10.2 on (`--actor.model_name_or_path`, `--actor.adam.lr`).
OpenRLHF's README writes the SFT and RM trainers' model and checkpointing as the actor's
(`--actor.model_name_or_path`, `--actor.gradient_checkpointing_enable`) and the RM's head prefix as
`--value_prefix_head`, where those trainers' own argument parsers take `--model.model_name_or_path`,
`--model.gradient_checkpointing_enable` and `--value_head_prefix`: the README's spellings are read as what
they mean, with a note beside the key.

```bash
rlhf from-openrlhf train_ppo_ray.sh -o my.yaml                     # convert; the config is loaded before it is written
rlhf from-openrlhf train_ppo_ray.sh -o my.yaml --set model.name_or_path=/models/llama3-sft \\
    --set inputs.sft_model=/models/llama3-sft --set rl.rollout.batch_size=16   # local copies, a smaller run
rlhf run --config my.yaml
```

`--set KEY=VALUE` (repeatable) overrides a key of the result as `rlhf run KEY=VALUE` does. A script that
calls no trainer, or gives a flag a value OpenRLHF would refuse (`--actor_learning_rate abc`), is one
`error:` line; a flag the trainer does not know is listed as not mapped. `$VARS` and `{{placeholders}}`
stay as written (a number or switch the shell fills in is listed as not mapped: `--set` it).

## Where this project differs

- **Stages.** A trainer other than `train_sft` starts from an SFT model: `--pretrain` becomes
  `model.name_or_path` and is pinned as `inputs.sft_model`, so the `sft` stage does not run; a PPO
  script's single `--reward_pretrain` is pinned as `inputs.reward_model`. Where `inputs` takes no hub id
  or folder (MLflow URIs only), the SFT pin is shown commented out and sft runs, and the reward model is
  named by `reward.rm_paths`. `rlhf run` runs the whole DAG on the config (RL and eval included); the
  header's `--only` runs the script's stage alone.
- **Model.** A config of data files names its model: one whose script's model flag was not read (no
  `model.name_or_path`) is refused with that key, in `rlhf from-openrlhf`, `rlhf check` and `rlhf run`
  alike, never trained as the tiny preset's model (which only a config with `base: tiny` builds).
- **Data.** The schema needs prompts whenever the data comes from files, and SFT rows unless
  `inputs.sft_model` is pinned (eval reads them for perplexity). Those the script does not name are
  derived from the one it does (after `--set`: they follow the paths and keys you set), and marked so:
  a preference set's chosen responses as SFT rows (its chosen conversations as prompts, their last turn
  the label), an SFT set's prompts with their responses
  as labels, a prompt set's labels as responses. A PPO script without `--label_key` has its prompts
  stand in as labels and names no SFT rows (eval then reports no perplexity). A PRM script's rows (`data.prm`) and a KTO script's
  unpaired rows stand in for SFT rows and prompts the same way. `train_kto` reads unpaired rows whatever
  its flags (OpenRLHF has no switch for them): its dataset becomes `data.preference` with
  `unpaired: true`, and `dpo.loss: kto`; without `--output_key` the input is a whole conversation, its
  last turn the response.
- **Batches.** OpenRLHF's `--train_batch_size` is global; here a DeepSpeed stage accumulates
  `grad_accum_steps` micro batches on each of `infra.num_workers` ranks (from `deepspeed --num_gpus` or
  `torchrun --nproc_per_node`, else 1). PPO's keeps its meaning (`rl.train_batch_size`).
- **Lengths.** OpenRLHF 0.9 on bounds prompt and response together (`--max_len`); here the prompt
  (`rl.rollout.prompt_max_len`) and the response (`rl.rollout.generate_max_len`) are bounded apart:
  with `--max_new_tokens` the prompt gets the rest, without it each gets the whole.
- **Defaults.** Where OpenRLHF's default differs from ours and the script leaves it, the config states
  OpenRLHF's: no chat template (SFT's `User: {{}}\\nAssistant: ` template), bf16, PPO's `gae` estimator and
  one sample per prompt, a rollout batch of 1024, one sequence per micro batch, SFT's two epochs, KTO's
  beta 0.01, the data lengths. Each rank gets one GPU (`infra.gpus_per_worker: 1`).
- **Pairs.** `--ipo` drops `--label_smoothing` (cDPO goes with the sigmoid loss).
- **Runs and checkpoints.** Runs go to MLflow, not Weights & Biases or TensorBoard; checkpoints are the
  stage runs' artifacts, and a rerun resumes by itself.

## Loop recipes

OpenRLHF 0.8's loop recipes (its `train_rejection_sampling_llama.sh`, `train_iterative_dpo_llama.sh` and
`train_conditional_llama.sh`) run `openrlhf.cli.batch_inference` steps before a trainer, most of them in a
`while (($iter < $TRAINING_ITERS))` loop whose rounds each start from the last round's policy. Such a
script becomes one stage of this project, named by the scoring step's `--post_processor`:

| OpenRLHF's steps | stage here | the loop's count |
|---|---|---|
| `--eval_task generate_vllm`, `--eval_task rm --post_processor rs`, `train_sft` | `rs` (`rs.enabled`) | `rs.rounds` |
| `--eval_task generate_vllm`, `--eval_task rm --post_processor iter_dpo`, `train_dpo` | `dpo` with `dpo.iterative` | `dpo.iterative.rounds` |
| `--eval_task rm --post_processor csft`, `train_sft` | `csft` (`csft.enabled`) | (one pass) |

`train_kd` (`train_knowledge_distillation.sh`) is one command: the `kd` stage, its `--pretrain` the
student (pinned as `inputs.sft_model`), `--teacher_model` the teacher (`kd.teacher: path`).

The rounds are the loop's bound less its counter's start (`TRAINING_ITERS=10`, `iter=0`: 10). The steps'
`$VARS` are read as the first round sees them, each variable's first assignment (`--pretrain
$POLICY_MODEL_PATH` is the starting policy, not the last round's). The trainer's flags convert as its own
(the table below), into the stage's section (`rs.lr`, `csft.micro_batch_size`); the sampling flags go to the
stage's sampling keys (`{{loop}}`: `rs` or `dpo.iterative`) and the scoring step's reward model to
`reward.rm_paths`. The steps: `generate` samples (`--eval_task generate_vllm` or `generate`), `rm` scores
for `rs` and `iter_dpo`, `csft` is conditional SFT's scoring pass:

{{steps}}

The shell's chores between the steps have no counterpart and are listed with the flags: the
`checkSuccess` exit checks (a failed step fails the stage's run), `mkdir` (the steps' files are the stage
run's own), the iteration log a loop resumes from and a step skipped when its output exists (a rerun
resumes the stage by itself).

Where the recipes differ here:

- **One process.** The stage samples, scores and trains in its own run, the samples in memory and its work
  dir, not in jsonl files between commands; it samples with HF generate on each rank, not a vLLM engine.
- **Fresh prompts.** OpenRLHF's `--iter` slices round r's prompts from the dataset; the stage draws each
  round's `prompts_per_round` fresh ones.
- **Iterative DPO** shares `dpo.max_steps` between its rounds: the converter writes the rounds times a
  round's steps (its prompts, one pair each, over `--train_batch_size`, for `--max_epochs`). Each round's
  reference is the policy it starts from; OpenRLHF's script keeps the first round's.
- **Held-out rows.** The `rs` stage holds SFT rows out for `eval/loss`, iterative DPO preference pairs
  for `eval/reward_accuracy`: the recipes name neither, so the config says so and the stage is off until
  `data.sft` / `data.preference` name them.
- **Conditional SFT** takes single-turn rows (a prompt and a response column); OpenRLHF's recipe reads the
  `chosen` conversation, its last turn the response: set `data.sft.input_key` and `data.sft.output_key`.
  `csft.template` writes `{{prompt}}` and `{{reward}}` where OpenRLHF's `--reward_template` writes `{{input}}` and
  `{{reward}}`.

## The flags

`{{stage}}` is the trainer's stage section (`sft`, `rm`, `prm`, `dpo`, `rl`, `kd`; in a loop recipe its stage's), `{{model}}` each model it
trains (`rl.actor` and `rl.critic` for PPO), `{{data}}` the dataset it reads (`data.sft`,
`data.preference`, `data.prompts`, `data.prm`). Trainers: `ppo` is `train_ppo_ray`; `prm`, `kto` and `kd` take flat flags
only (OpenRLHF dropped them before its flags became nested; `train_kd` and `batch_inference` after 0.9.0).
"""


def trainers(row: Flag) -> str:
    if set(row.trainers) == set(ALL):
        return "all"
    if set(row.trainers) == set(TRAINING):
        return "all but ppo"
    return ", ".join(t.removeprefix("train_").removesuffix("_ray") for t in row.trainers)


def how(row: Flag) -> str:
    """The value's conversion, its caveat and OpenRLHF's default where the config states it; or why not mapped."""
    if not row.mapped:
        described = row.value.described() if row.value.described() != "as given" else ""
        return row.why or described
    parts = [row.value.described()]
    if row.also:
        parts.append("sets " + ", ".join(f"{k} `{shown(v)}`" for k, v in row.also.items()))
    if row.needs:
        parts.append(f"only with {row.needs[0]}")
    if row.why:
        parts.append(row.why)
    if row.absent is not None:
        default = shown(row.absent).replace("\n", "\\n")
        parts.append(f"omitted: OpenRLHF's `{default}`" + (f" (unless {row.absent_unless[0]})" if row.absent_unless else ""))
    return "; ".join(parts)


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def names(row: Flag, nested: bool) -> str:
    return "<br>".join(f"`{n}`" for n in row.names if ("." in n) == nested)


def steps() -> str:
    """The table of batch_inference's flags in the loop recipes."""
    lines = ["| flag | step | key here | value, or why not mapped |", "|---|---|---|---|"]
    for row in RECIPE_ROWS:
        keys = "<br>".join(f"`{k}`" for k in row.keys) or "not mapped"
        tables = ", ".join(row.trainers)
        lines.append(f"| {'<br>'.join(f'`{n}`' for n in row.names)} | {tables} | {keys} | {cell(how(row))} |")
    for name, why in SHARED.items():
        lines.append(f"| `{name}` | every step | not mapped | {cell(why)} |")
    return "\n".join(lines)


def page() -> str:
    lines = [INTRO.replace("{steps}", steps())]
    for title, rows in GROUPS:
        lines += [f"### {title}", "", "| flat (0.5 to 0.10.1) | nested (0.10.2 on) | trainers | key here | value, or why not mapped |",
                  "|---|---|---|---|---|"]
        for row in rows:
            keys = "<br>".join(f"`{k}`" for k in row.keys) or "not mapped"
            lines.append(f"| {names(row, False)} | {names(row, True)} | {trainers(row)} | {keys} | {cell(how(row))} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(page(), end="")
