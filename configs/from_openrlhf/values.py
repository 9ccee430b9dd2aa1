"""How an OpenRLHF flag's words become a value of this project's config: the value kinds the flag table
(configs/from_openrlhf/flags.py) names. Each kind checks the words as OpenRLHF's argparse would and says,
for the docs page, what it does."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SHELL = re.compile(r"\$|^\{\w*\}$|^<[\w-]+>$")  # `$VAR`, `${VAR}`, `$(...)`, `{wandb_token}`, `<PATH>`


class BadValue(Exception):
    """The words are not what OpenRLHF's flag takes; the message says what it expects."""


class NotMapped(Exception):
    """The value has no counterpart in this project; the message says why."""


def two_numbers(words: tuple[str, ...]) -> tuple[float, float]:
    if len(words) != 2:
        raise BadValue("expected 2 numbers")
    try:
        return float(words[0]), float(words[1])
    except ValueError:
        raise BadValue("expected 2 numbers") from None


def shown(value: object) -> str:
    """A value as YAML writes it: `true`, `bf16`."""
    return {True: "true", False: "false"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def left_to_shell(words: tuple[str, ...]) -> str | None:
    """The first word the shell would fill in (`$MODEL_PATH`, `{wandb_token}`), if any."""
    return next((w for w in words if SHELL.search(w)), None)


@dataclass(frozen=True)
class Value:
    """A flag's words -> one value (set on each of the row's keys)."""

    def convert(self, words: tuple[str, ...]) -> object:
        raise NotImplementedError

    def described(self) -> str:
        """What the conversion does, for the docs page."""
        return "as given"

    def one(self, words: tuple[str, ...], expected: str) -> str:
        if len(words) != 1:
            raise BadValue(f"expected {expected}" + (" (got no value)" if not words else f" (got {len(words)} words)"))
        return words[0]


@dataclass(frozen=True)
class Text(Value):
    def convert(self, words: tuple[str, ...]) -> object:
        return self.one(words, "one value")


@dataclass(frozen=True)
class Number(Value):
    integer: bool = False
    positive: str = ""  # when set: a value <= 0 is not mapped, for this reason (`--save_steps -1`)

    def described(self) -> str:
        return self.expected.removeprefix("an ").removeprefix("a ") + ("; not mapped when <= 0" if self.positive else "")

    def convert(self, words: tuple[str, ...]) -> object:
        word = self.one(words, self.expected)
        try:
            number: float = int(word) if self.integer else float(word)
        except ValueError:
            if not self.integer:
                raise BadValue(f"expected {self.expected}") from None
            try:  # `--overlong_buffer_len 4096.0`, `--max_samples 1e5`: a whole number written as a float
                number = float(word)
            except ValueError:
                raise BadValue(f"expected {self.expected}") from None
            if not number.is_integer():
                raise BadValue(f"expected {self.expected}") from None
            number = int(number)
        if self.positive and number <= 0:
            raise NotMapped(self.positive)
        return number

    @property
    def expected(self) -> str:
        return "an integer" if self.integer else "a number"


@dataclass(frozen=True)
class Switch(Value):
    """A store_true flag: present means `value`."""

    value: object = True

    def described(self) -> str:
        return f"`{shown(self.value)}`"

    def convert(self, words: tuple[str, ...]) -> object:
        if words:
            raise BadValue(f"takes no value (got {' '.join(words)!r})")
        return self.value


@dataclass(frozen=True)
class Choice(Value):
    """One of OpenRLHF's choices, each to our value, or to a reason it is not mapped (a `Why`)."""

    mapping: dict[str, object] = field(default_factory=dict)

    def described(self) -> str:
        return "; ".join(f"{k}: not mapped, {v.reason}" if isinstance(v, Why) else
                         (f"{k}" if shown(v) == k else f"{k}: `{shown(v)}`") for k, v in self.mapping.items())

    def convert(self, words: tuple[str, ...]) -> object:
        word = self.one(words, "one of: " + ", ".join(self.mapping))
        if word not in self.mapping:
            raise BadValue("expected one of: " + ", ".join(self.mapping))
        found = self.mapping[word]
        if isinstance(found, Why):
            raise NotMapped(found.reason)
        return found


@dataclass(frozen=True)
class Why:
    """A choice that has no counterpart here, and why."""

    reason: str


@dataclass(frozen=True)
class Pair(Value):
    """nargs=2 numbers: one each to the row's two keys, both as a list to its one key (or to each key, `whole`),
    or the one at `pick`."""

    pick: int | None = None
    whole: bool = False

    def described(self) -> str:
        if self.pick is not None:
            return ("the lower" if self.pick == 0 else "the upper") + " of two numbers"
        return "two numbers, as a list to each key" if self.whole else "two numbers, to the two keys (or as a list to one)"

    def convert(self, words: tuple[str, ...]) -> object:
        both = two_numbers(words)
        if self.pick is not None:
            return both[self.pick]
        return list(both) if self.whole else both


@dataclass(frozen=True)
class MetricKey(Value):
    """An eval metric of OpenRLHF's PPO (`eval_<source>_pass1`: the mean reward of the sampled responses;
    `eval_<source>_pass<k>`: their best) as the held-out metric of ours that is the same number."""

    def described(self) -> str:
        return ("`eval_<source>_pass1`: `sampled_reward`; `eval_<source>_pass<k>`, k > 1: `pass_at_k`; `none` or empty: "
                "not mapped (the output stays the last step's)")

    def convert(self, words: tuple[str, ...]) -> object:
        key = self.one(words, "an eval metric key") if words else ""
        if key in ("", "none"):
            raise NotMapped(f"{key or 'empty'}: OpenRLHF's output is the last step's policy, as the default here")
        found = re.fullmatch(r"eval_.+_pass(\d+)", key)
        if found is None:
            raise NotMapped(f"{key}: only eval_<source>_pass<k> has a counterpart (sampled_reward, pass_at_k)")
        return "sampled_reward" if int(found.group(1)) == 1 else "pass_at_k"


@dataclass(frozen=True)
class Symmetric(Value):
    """A range `-x x` as the bound x."""

    def described(self) -> str:
        return "a range `-x x` as x; another range is not mapped"

    def convert(self, words: tuple[str, ...]) -> object:
        low, high = two_numbers(words)
        if low != -high or high <= 0:
            raise NotMapped(f"only a range symmetric about 0 has a counterpart (got {words[0]} {words[1]})")
        return high


@dataclass(frozen=True)
class Listed(Value):
    """A comma-separated list (`--dataset a,b`, `--dataset_probs 0.5,0.5`)."""

    numbers: bool = False

    def described(self) -> str:
        return "comma-separated " + ("numbers" if self.numbers else "values") + ", as a list"

    def convert(self, words: tuple[str, ...]) -> object:
        items = [item.strip() for item in self.one(words, "a comma-separated list").split(",") if item.strip()]
        if not self.numbers:
            return items
        try:
            return [float(item) for item in items]
        except ValueError:
            raise BadValue("expected comma-separated numbers") from None


@dataclass(frozen=True)
class Words(Value):
    """nargs="*" / nargs=n words as a list; `single` is the one word that stands alone (`all-linear`)."""

    count: int | None = None
    single: str = ""

    def described(self) -> str:
        return (f"{self.count} words" if self.count else "words") + ", as a list" + (f" (`{self.single}` alone as it is)" if self.single else "")

    def convert(self, words: tuple[str, ...]) -> object:
        if self.count is not None and len(words) != self.count:
            raise BadValue(f"expected {self.count} values")
        if not words:
            raise BadValue("expected at least one value")
        return words[0] if self.single and list(words) == [self.single] else list(words)


@dataclass(frozen=True)
class Factor(Value):
    """One factor of a product over rows mapping the same key (`--actor_num_nodes` x `--actor_num_gpus_per_node`);
    a row the script does not use counts with its `default` (OpenRLHF's)."""

    default: int = 1

    def described(self) -> str:
        return f"integer; the key is the product with its partner flag (OpenRLHF's default {self.default} where omitted)"

    def convert(self, words: tuple[str, ...]) -> object:
        return Number(integer=True).convert(words)


@dataclass(frozen=True)
class PerRank(Value):
    """A global batch (`--train_batch_size`) as optimizer steps' accumulation: global / (micro batch x ranks)."""

    def described(self) -> str:
        return "global batch / (micro batch x infra.num_workers), at least 1"

    def convert(self, words: tuple[str, ...]) -> object:
        return Number(integer=True, positive="expected a positive batch size").convert(words)


@dataclass(frozen=True)
class RewardModel(Value):
    """`--reward_pretrain a[,b]`: one reward model is pinned as the pipeline's reward_model; several are averaged."""

    def described(self) -> str:
        return "reward.source `rm`; one model: inputs.reward_model; several (comma-separated): reward.rm_paths, averaged"

    def convert(self, words: tuple[str, ...]) -> object:
        paths = Listed().convert(words)
        assert isinstance(paths, list)
        if len(paths) == 1:
            return {"reward.source": "rm", "inputs.reward_model": paths[0]}
        return {"reward.source": "rm", "reward.rm_paths": paths}


@dataclass(frozen=True)
class CriticStart(Value):
    """`--critic_pretrain PATH`: a checkpoint to start the critic from; the converter names the SFT model and the
    pipeline's reward model as such when the path is theirs (configs/from_openrlhf/convert.py, `critic_start`)."""

    def described(self) -> str:
        return ("the policy's model: init_from `sft`; the pinned reward model: `reward_model`; another checkpoint: "
                "`path`, with init_path")

    def convert(self, words: tuple[str, ...]) -> object:
        return {"rl.critic.init_from": "path", "rl.critic.init_path": self.one(words, "a model path")}


@dataclass(frozen=True)
class RewardUrl(Value):
    """`--remote_rm_url`: an http(s) URL is a reward server; a file path is a reward function file."""

    def described(self) -> str:
        return ("an http(s) URL: reward.source `remote`, reward.url; a file: reward.source `func`, reward.func_path "
                "(reward_func(queries, prompts, labels))")

    def convert(self, words: tuple[str, ...]) -> object:
        urls = Listed().convert(words)
        assert isinstance(urls, list)
        if len(urls) != 1:
            raise NotMapped("several reward sources at once have no counterpart; one url or file")
        url = urls[0]
        if re.match(r"^https?://", url):
            return {"reward.source": "remote", "reward.url": url}
        return {"reward.source": "func", "reward.func_path": url}
