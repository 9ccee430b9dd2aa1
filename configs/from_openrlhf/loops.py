"""OpenRLHF 0.8's loop recipes in a launch script: its `batch_inference` steps (generate, then score with a
reward model) and the trainer call after them, the `while (($iter < $N))` loop around them with its round
count, and the shell's bookkeeping between them (exit checks, folders, an iteration log), each chore with
why it has no counterpart here.

The recipes set their sizes in variables (`TRAINING_ITERS=10`, `--rollout_batch_size $ROLLOUT_BATCH_SIZE`):
a step's `$NAME` is read as the first round sees it, each name's first assignment in the script (the
policy a loop reassigns to the last round's output, `POLICY_MODEL_PATH=$MODEL_OUTPUT_PATH`, is the
starting one). The loop's counter stays as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from configs.from_openrlhf.script import (
    ASSIGNMENT,
    STEPS,
    TRAINERS,
    FlagUse,
    Found,
    TrainerCall,
    Word,
    find_calls,
    flag_uses,
    read_script,
    trainer_call,
)

VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
COMPARISONS = {"<": 0, "-lt": 0, "<=": 1, "-le": 1}  # the bound's own round counts with `<=`
CHECK = "OpenRLHF's exit check between steps: a failed step fails the stage's run here, and Prefect reports it"
FOLDERS = "the steps' files (samples, scored rows, checkpoints) are the stage run's own, kept in MLflow"
RESUME = "resuming at the logged round: a rerun of the stage resumes from its last finished round by itself"
REUSE = "a step skipped when its output exists: a rerun of the stage reuses what it saved by itself"


@dataclass(frozen=True)
class Loop:
    counter: str  # `iter`
    rounds: int | None  # None: the bound is not a number the script sets
    line: int
    shown: str  # the condition as written: `(($iter < $TRAINING_ITERS))`
    source: str  # how the count was read, for the comment beside the rounds key


@dataclass(frozen=True)
class Step:
    """A `batch_inference` call: `task` is its --eval_task (`generate_vllm`, `generate`, `rm`)."""

    task: str
    flags: list[FlagUse]
    line: int  # of the module's name
    in_loop: bool


@dataclass(frozen=True)
class Chore:
    use: FlagUse  # the command as a reader finds it, with its line
    reason: str


@dataclass
class Recipe:
    steps: list[Step]
    trainer: TrainerCall  # its flags read as the first round sees them
    loop: Loop | None
    chores: list[Chore] = field(default_factory=list)
    policy_switch: int | None = None  # the line where the loop points the policy at the last round's output


def read_recipe(text: str, origin: str) -> Recipe | None:
    """The loop recipe in `text`: its batch_inference steps and one trainer call; None when it has no step or
    not exactly one trainer call (read_call then converts it, or says why not)."""
    script = read_script(text, origin)
    found, _ = find_calls(script, origin)
    # `echo $cmd` before `python -m $cmd` names the same heredoc's step: each step once, as launched
    launched = [f for f in found if f.command[0].text != "echo"]
    steps = list({(f.module, f.command[f.at].line): f for f in launched if f.module in STEPS}.values())
    trainers = {(f.module, f.command[f.at].line): f for f in launched if f.module in TRAINERS}
    if not steps or len(trainers) != 1:
        return None
    values = first_values(script.commands)
    loop = read_loop(script.commands, values)
    end = loop_end(script.commands, loop)
    keep = {loop.counter} if loop else set()
    (call,) = trainers.values()
    trainer = trainer_call(call, script)
    trainer.flags = [resolved(use, values, keep) for use in trainer.flags]
    read = [Step(task_of(flag_uses(f.command[f.at + 1:])), [resolved(use, values, keep) for use in flag_uses(f.command[f.at + 1:])],
                 f.command[f.at].line, inside(f, loop, end)) for f in steps]
    recipe = Recipe(read, trainer, loop, chores(script.commands, loop))
    if loop is not None:
        pretrain = " ".join(w for use in trainer.flags if use.name == "--pretrain" for w in use.words)
        recipe.policy_switch = policy_switch(script.commands, loop, end, call, values, pretrain)
    return recipe


def task_of(flags: list[FlagUse]) -> str:
    return next((" ".join(use.words) for use in flags if use.name == "--eval_task"), "")


def first_values(commands: list[list[Word]]) -> dict[str, str]:
    """Each variable's first assignment, `$NAME`s in it read from earlier ones; `$(...)` left as written."""
    values: dict[str, str] = {}
    for command in commands:
        words = command[1:] if command[0].text in ("export", "readonly", "local", "declare") else command
        for word in words:
            m = ASSIGNMENT.match(word.text)
            if not m or not ASSIGNMENT.match(word.raw):
                break
            if m[1] not in values:
                values[m[1]] = substituted(m[2], values, set())
    return values


def substituted(text: str, values: dict[str, str], keep: set[str]) -> str:
    if "$(" in text or "`" in text:
        return text  # a command's output: not known before the script runs
    return VARIABLE.sub(lambda m: values.get(m[1] or m[2], m[0]) if (m[1] or m[2]) not in keep else m[0], text)


def resolved(use: FlagUse, values: dict[str, str], keep: set[str]) -> FlagUse:
    return FlagUse(use.name, tuple(substituted(w, values, keep) for w in use.words), use.line)


def read_loop(commands: list[list[Word]], values: dict[str, str]) -> Loop | None:
    """The first `while (($i < $N))` / `while [ $i -lt $N ]` loop, and its rounds: N less the counter's start."""
    for i, command in enumerate(commands[:-1]):
        if command[0].text != "while":
            continue
        condition = [w.text for w in (command[1:] or commands[i + 1])]  # `((` ends a command, `[` does not
        bracketed = condition[0] in ("[", "[[")
        shown = " ".join(condition) if bracketed else f"(({' '.join(condition)}))"
        words = [w for w in condition if w not in ("[", "]", "[[", "]]")]
        if len(words) != 3 or words[1] not in COMPARISONS:
            return Loop("", None, command[0].line, shown, "")
        counter = words[0].lstrip("$").strip("{}")
        start, bound = values.get(counter, ""), substituted(words[2], values, set())
        if not (start.isdigit() and bound.isdigit()):
            return Loop(counter, None, command[0].line, shown, "")
        rounds = int(bound) - int(start) + COMPARISONS[words[1]]
        source = f"while {shown} (line {command[0].line}): {words[2]} = {bound}, from {counter}={start}"
        return Loop(counter, max(rounds, 0), command[0].line, shown, source)
    return None


def loop_end(commands: list[list[Word]], loop: Loop | None) -> int:
    if loop is None:
        return 0
    return next((c[0].line for c in commands if c[0].text == "done" and c[0].line > loop.line), 1 << 30)


def inside(found: Found, loop: Loop | None, end: int) -> bool:
    """The step runs in the loop: the command that launches it is between `while` and `done`."""
    return loop is not None and loop.line < found.command[0].line < end


def policy_switch(commands: list[list[Word]], loop: Loop, end: int, trainer: Found, values: dict[str, str],
                  pretrain: str) -> int | None:
    """The line in the loop that reassigns the variable the trainer's --pretrain reads (the last round's policy)."""
    names = {m[1] or m[2] for w in trainer.command for m in VARIABLE.finditer(w.raw)}
    for command in commands:
        m = ASSIGNMENT.match(command[0].text)
        if m and m[1] in names and loop.line < command[0].line < end and values.get(m[1]) == pretrain:
            return command[0].line
    return None


def chores(commands: list[list[Word]], loop: Loop | None) -> list[Chore]:
    """The shell's bookkeeping a recipe does around its steps, each with why it has no counterpart."""
    found: list[Chore] = []
    for i, command in enumerate(commands):
        first = command[0]
        if len(command) == 1 and i + 1 < len(commands) and commands[i + 1][0].text == "{":
            found.append(Chore(FlagUse(f"{first.text}() {{...}}", (), first.line), CHECK))
        elif first.text == "if" and "!" in (words := [w.text for w in command]) and {"-e", "-f"} & set(words):
            found.append(Chore(FlagUse(" ".join(words), (), first.line), REUSE))
        elif first.text == "mkdir":
            found.append(Chore(FlagUse(" ".join(w.text for w in command), (), first.line), FOLDERS))
        elif loop is not None and loop.counter and first.raw.startswith(f"{loop.counter}=$(") and "((" not in first.raw:
            found.append(Chore(FlagUse(first.raw, (), first.line), RESUME))
    return found
