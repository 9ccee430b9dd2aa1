"""The OpenRLHF trainer call in a shell script: which trainer, and the flags it is given, each with its line.

Launch scripts are bash, so this reads as much bash as they use: line continuations, comments, quotes
(`'...'`, `"..."`, `$'...'`), env assignments, arrays (`ARGS=(...)` spliced by `${ARGS[@]}`), heredocs
read into a variable (`read -r -d '' cmd <<EOF ... EOF`, then `deepspeed --module $cmd`) and commands
inside a quoted string (`bash -c "... python3 -m openrlhf.cli.train_ppo_ray ..."`). Anything else is
left as written: `$VARS` and `{placeholders}` stay in the values, and nothing is run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from configs.errors import ConfigError

TRAINERS = ("train_sft", "train_rm", "train_prm", "train_dpo", "train_kto", "train_ppo_ray", "train_kd")
STEPS = ("batch_inference",)  # the other modules of OpenRLHF's loop recipes: generate, then score with a reward model
MODULE = re.compile(r"^(?:.*/)?openrlhf(?:\.cli\.|/cli/)(\w+?)(?:\.py)?$")
NAME = r"[A-Za-z_][A-Za-z0-9_]*"
ASSIGNMENT = re.compile(rf"^({NAME})=(.*)$", re.S)
ARRAY_USE = re.compile(rf'^"?\$\{{({NAME})\[[@*]\]\}}"?$')
VARIABLE_USE = re.compile(rf"^\$(?:\{{({NAME})\}}|({NAME}))$")
ELISIONS = ("...", "…")  # documentation's "more flags here"
MAX_SCRIPT_CHARS = 1 << 20  # a launch script is a few KB; more is not a script to convert
MAX_WORDS = 10_000  # words one array may hold once spliced
ANSI_C = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "e": "\x1b", "0": "\0"}


@dataclass(frozen=True)
class Word:
    text: str  # after quote removal
    raw: str  # as written: `"${ARGS[@]}"` splices an array, the text `${ARGS[@]}` in single quotes does not
    line: int
    op: bool = False  # a redirection (`>`, `&>>`, `<<`): it ends a command's arguments


@dataclass(frozen=True)
class FlagUse:
    name: str  # `--pretrain`
    words: tuple[str, ...]  # the values after it (none for a switch)
    line: int

    def shown(self) -> str:
        """`--max_len 2048` as a reader finds it in the script, one line."""
        return " ".join((self.name, *self.words)).replace("\n", "\\n")


@dataclass
class TrainerCall:
    trainer: str  # `train_ppo_ray`
    line: int  # of the module's name
    launcher: list[str]  # the words before the module in its command (`deepspeed --module`)
    flags: list[FlagUse]
    stray: list[FlagUse] = field(default_factory=list)  # flags on lines after the command ended (a missing `\`)
    variables: dict[str, str] = field(default_factory=dict)  # `NAME=value` set in the script


@dataclass
class Script:
    """A script split into commands, with what its assignments define."""

    commands: list[list[Word]] = field(default_factory=list)
    arrays: dict[str, list[Word]] = field(default_factory=dict)
    heredocs: dict[str, list[Word]] = field(default_factory=dict)  # `read ... NAME <<EOF`: NAME's words
    loose: list[list[Word]] = field(default_factory=list)  # heredoc bodies read into no variable


class Lexer:
    """Bash's words and command boundaries, with the line each word starts on."""

    def __init__(self, text: str, origin: str, first_line: int = 1):
        self.text, self.origin, self.pos, self.line = text, origin, 0, first_line
        self.script = Script()
        self.pending: list[tuple[str, bool, list[Word]]] = []  # heredocs opened on this line: (delimiter, strip tabs, command)

    def error(self, message: str, line: int) -> ConfigError:
        return ConfigError(f"{self.origin} line {line}: {message}")

    def peek(self, ahead: int = 0) -> str:
        at = self.pos + ahead
        return self.text[at] if at < len(self.text) else ""

    def read(self) -> Script:
        command: list[Word] = []
        while self.pos < len(self.text):
            c = self.peek()
            if c == "\\" and self.peek(1) == "\n":
                self.pos += 2
                self.line += 1
            elif c in " \t":
                self.pos += 1
            elif c == "\n":
                self.pos += 1
                self.line += 1
                if command and command[-1].raw in ELISIONS:  # a README's `...` line: the command goes on
                    command.pop()
                    continue
                self.end(command)
                command = []
                self.read_heredocs()
            elif c == "#":
                while self.pos < len(self.text) and self.peek() != "\n":
                    self.pos += 1
            elif c in ";&|()" and not (c == "&" and self.peek(1) == ">"):
                op = c + self.peek(1) if self.peek(1) == c else c
                self.pos += len(op)
                self.end(command)
                command = []
            elif c in "<>" or c == "&":
                self.redirection(command)
            else:
                word = self.word()
                if word.text.endswith("=") and ASSIGNMENT.match(word.raw) and self.peek() == "(":
                    self.array(word.raw[:-1])
                else:
                    command.append(word)
        self.end(command)
        self.read_heredocs()
        return self.script

    def end(self, command: list[Word]) -> None:
        if command:
            self.script.commands.append(command)

    def redirection(self, command: list[Word]) -> None:
        start, line = self.pos, self.line
        while self.peek() and self.peek() in "<>&-":
            self.pos += 1
        op = self.text[start:self.pos]
        command.append(Word(op, op, line, op=True))
        if op in ("<<", "<<-"):
            while self.peek() in " \t":
                self.pos += 1
            delimiter = self.word()
            self.pending.append((delimiter.text, op == "<<-", command))

    def read_heredocs(self) -> None:
        """The bodies of the heredocs opened on the line just ended: each up to its delimiter line."""
        for delimiter, strip_tabs, command in self.pending:
            first, body = self.line, []
            while self.pos < len(self.text):
                end = self.text.find("\n", self.pos)
                end = len(self.text) if end < 0 else end
                text = self.text[self.pos:end]
                self.pos, self.line = min(end + 1, len(self.text)), self.line + 1
                if (text.lstrip("\t") if strip_tabs else text) == delimiter:
                    break
                body.append(text)
            inner = Lexer("\n".join(body), self.origin, first).read()
            self.script.arrays |= inner.arrays
            words = [w for c in inner.commands for w in c]
            names = [w.text for w in command if not w.op]
            if names and names[0] == "read" and len(names) > 1:
                self.script.heredocs[names[-1]] = words
            else:
                self.script.loose.append(words)
        self.pending = []

    def array(self, name: str) -> None:
        """`NAME=( ... )`: its elements, over any number of lines, with comments."""
        self.pos += 1
        items: list[Word] = []
        opened = self.line
        while True:
            c = self.peek()
            if not c:
                raise self.error(f"{name}=( is never closed", opened)
            if c == ")":
                self.pos += 1
                break
            if c == "\\" and self.peek(1) == "\n":
                self.pos += 2
                self.line += 1
            elif c in " \t\n":
                self.line += c == "\n"
                self.pos += 1
            elif c == "#":
                while self.peek() and self.peek() != "\n":
                    self.pos += 1
            else:
                items.append(self.word())
        spliced = [w for item in items for w in self.script.arrays.get(array_name(item) or "", [item])]
        if len(spliced) > MAX_WORDS:  # `A=("${A[@]}" "${A[@]}")` doubles per line: bounded, not 2^lines
            raise self.error(f"{name}=( ... ) holds {len(spliced)} words, over {MAX_WORDS}; a trainer call has a few "
                             "hundred", opened)
        self.script.arrays[name] = spliced

    def word(self) -> Word:
        """One word: quotes removed, `$(...)`, `${...}` and backticks kept whole."""
        start, line, out = self.pos, self.line, []
        while self.pos < len(self.text):
            c = self.peek()
            if c in " \t\n;&|()<>":
                break
            if c == "\\":
                nxt = self.peek(1)
                self.pos += 2
                if nxt == "\n":
                    self.line += 1
                else:
                    out.append(nxt)
            elif c == "'":
                out.append(self.single_quoted())
            elif c == "$" and self.peek(1) == "'":
                self.pos += 1
                out.append(self.ansi_c_quoted())
            elif c == '"':
                out.append(self.double_quoted())
            elif c == "$" and self.peek(1) in "({":
                out.append(self.balanced())
            elif c == "`":
                end = self.text.find("`", self.pos + 1)
                if end < 0:
                    raise self.error("a ` is never closed", line)
                out.append(self.text[self.pos:end + 1])
                self.line += self.text.count("\n", self.pos, end)
                self.pos = end + 1
            else:
                out.append(c)
                self.pos += 1
        return Word("".join(out), self.text[start:self.pos], line)

    def single_quoted(self) -> str:
        end = self.text.find("'", self.pos + 1)
        if end < 0:
            raise self.error("a ' is never closed", self.line)
        text = self.text[self.pos + 1:end]
        self.line += text.count("\n")
        self.pos = end + 1
        return text

    def ansi_c_quoted(self) -> str:
        line, out = self.line, list[str]()
        self.pos += 1
        while True:
            c = self.peek()
            if not c:
                raise self.error("a $' is never closed", line)
            self.pos += 1
            if c == "'":
                return "".join(out)
            if c == "\\":
                nxt = self.peek()
                self.pos += 1
                out.append(ANSI_C.get(nxt, "\\" + nxt))
            else:
                self.line += c == "\n"
                out.append(c)

    def double_quoted(self) -> str:
        line, out = self.line, list[str]()
        self.pos += 1
        while True:
            c = self.peek()
            if not c:
                raise self.error('a " is never closed', line)
            if c == '"':
                self.pos += 1
                return "".join(out)
            if c == "\\" and self.peek(1) in '"\\$`\n':
                nxt = self.peek(1)
                self.pos += 2
                if nxt == "\n":
                    self.line += 1
                else:
                    out.append(nxt)
            elif c == "$" and self.peek(1) in "({":
                out.append(self.balanced())
            else:
                self.line += c == "\n"
                out.append(c)
                self.pos += 1

    def balanced(self) -> str:
        """`$(...)` or `${...}` as written, nested brackets and quotes inside included."""
        start, line = self.pos, self.line
        opening = self.peek(1)
        closing = ")" if opening == "(" else "}"
        depth, self.pos = 0, self.pos + 1
        while True:
            c = self.peek()
            if not c:
                raise self.error(f"a ${opening} is never closed", line)
            self.pos += 1
            if c == opening:
                depth += 1
            elif c == closing:
                depth -= 1
                if depth == 0:
                    return self.text[start:self.pos]
            elif c in "'\"":
                end = self.text.find(c, self.pos)
                self.pos = len(self.text) if end < 0 else end + 1
            self.line += c == "\n"


def array_name(word: Word) -> str | None:
    """The array `"${NAME[@]}"` splices, if the word is one such use."""
    m = ARRAY_USE.match(word.raw)
    return m[1] if m else None


def expanded(command: list[Word], script: Script) -> list[Word]:
    """The command with arrays and heredoc variables spliced in, as bash's expansion and word splitting do."""
    out: list[Word] = []
    for word in command:
        name = array_name(word)
        used = VARIABLE_USE.match(word.raw)
        if name is not None and name in script.arrays:
            out += script.arrays[name]
        elif used and (used[1] or used[2]) in script.heredocs:
            out += script.heredocs[used[1] or used[2]]
        else:
            out.append(word)
    return out


def assignments(commands: list[list[Word]]) -> dict[str, str]:
    """`NAME=value` words that lead a command (or follow export / readonly / local / declare)."""
    found: dict[str, str] = {}
    for command in commands:
        words = [w for w in command if not w.op]
        if words and words[0].text in ("export", "readonly", "local", "declare"):
            words = words[1:]
        for w in words:
            m = ASSIGNMENT.match(w.text)
            if not m or not ASSIGNMENT.match(w.raw):
                break
            found[m[1]] = m[2]
    return found


def module_of(word: Word) -> str | None:
    m = MODULE.match(word.text)
    return m[1] if m and not word.op else None


@dataclass
class Found:
    module: str  # `train_sft`, `batch_inference`
    command: list[Word]
    at: int  # index of the module's name in the command
    after: list[Word] | None  # the next command, for flags a missing `\` cut off


def find_calls(script: Script, origin: str) -> tuple[list[Found], list[str]]:
    """Every trainer and loop-step call (and the other `openrlhf.cli` modules named), in commands, inside quoted
    strings (`bash -c "..."`) and in heredocs read into no variable."""
    calls: list[Found] = []
    others: list[str] = []
    commands = [expanded(c, script) for c in script.commands]
    for i, command in enumerate(commands):
        for at, word in enumerate(command):
            module = module_of(word)
            if module in TRAINERS or module in STEPS:
                calls.append(Found(module, command, at, commands[i + 1] if i + 1 < len(commands) else None))
            elif module is not None:
                others.append(module)
            elif "openrlhf" in word.text and word.text != word.raw and any(c in word.text for c in " \n"):
                inner = Lexer(word.text, origin, word.line).read()
                inner.arrays = script.arrays | inner.arrays
                inner.heredocs = script.heredocs | inner.heredocs
                found, named = find_calls(inner, origin)
                calls += found
                others += named
    # a heredoc the script never expands still shows the command it holds
    for body in [*script.loose, *([] if calls else script.heredocs.values())]:
        for at, word in enumerate(body):
            module = module_of(word)
            if module in TRAINERS or module in STEPS:
                calls.append(Found(module, body, at, None))
    return calls, others


def flag_uses(words: list[Word]) -> list[FlagUse]:
    """`--name value ...` pairs up to the first redirection; `--name=value` split; words before any flag dropped."""
    uses: list[FlagUse] = []
    name, line, values = "", 0, list[str]()
    for word in words:
        if word.op:
            break
        if word.text.startswith("--") and len(word.text) > 2 and word.text == word.text.strip():
            if name:
                uses.append(FlagUse(name, tuple(values), line))
            name, _, value = word.text.partition("=")
            line, values = word.line, [value] if "=" in word.text else []
        elif name:
            values.append(word.text)
    if name:
        uses.append(FlagUse(name, tuple(values), line))
    return uses


def read_call(text: str, origin: str) -> TrainerCall:
    """The one trainer call in `text`; a ConfigError naming `origin` when there is none, or several that differ."""
    script = read_script(text, origin)
    found, others = find_calls(script, origin)
    calls = [c for c in found if c.module in TRAINERS]
    others = [c.module for c in found if c.module not in TRAINERS] + others
    if not calls:
        also = f"; it calls openrlhf.cli.{', openrlhf.cli.'.join(dict.fromkeys(others))}" if others else ""
        raise ConfigError(f"{origin}: calls none of OpenRLHF's trainers ({', '.join(TRAINERS)}){also}")
    first = calls[0]
    flags = flag_uses(first.command[first.at + 1:])
    differing = [c for c in calls[1:] if (c.module, [(f.name, f.words) for f in flag_uses(c.command[c.at + 1:])])
                 != (first.module, [(f.name, f.words) for f in flags])]
    if differing:
        where = ", ".join(f"{c.module} (line {c.command[c.at].line})" for c in [first, *differing])
        raise ConfigError(f"{origin}: calls {len(differing) + 1} trainers: {where}; convert one command at a time")
    return trainer_call(first, script)


def read_script(text: str, origin: str) -> Script:
    """The script's commands; a ConfigError naming `origin` when it is too long to be a launch script."""
    if len(text) > MAX_SCRIPT_CHARS:
        raise ConfigError(f"{origin}: over {MAX_SCRIPT_CHARS} characters; a launch script is a few thousand: give "
                          "the one that calls the trainer")
    return Lexer(text.replace("\r\n", "\n"), origin).read()


def trainer_call(found: Found, script: Script) -> TrainerCall:
    """A found call with its flags, launcher and the script's assignments."""
    flags = flag_uses(found.command[found.at + 1:])
    stray = flag_uses(found.after) if found.after and found.after[0].text.startswith("--") else []
    launcher = [w.text for w in found.command[:found.at] if not ASSIGNMENT.match(w.text)]
    return TrainerCall(found.module, found.command[found.at].line, launcher, flags, stray, assignments(script.commands))
