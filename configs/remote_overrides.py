"""What a deployment run may override. Anyone who reaches the Prefect server can start one with any
`overrides`, so there they set data and hyperparameters, never code: a key that runs code or chooses which
code runs is refused, one line naming it, unless the config file on the worker already sets it to the same
value (`rlhf run`, on one's own machine, takes every key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from configs.errors import ConfigError
from configs.loader import flatten, get_dotted, parse_override, read_preset

# key -> what setting it would do
CODE_KEYS = {
    "model.trust_remote_code": "runs the model repository's own Python",
    "reward.func_path": "names the Python file the reward workers run",
    "rl.agent.path": "names the Python file the reward workers or the driver run",
    "rl.rollout.vllm_python": "names the program the rollout engines run",
}
PINS = "inputs."  # a hub id here downloads a model from anywhere; a run, a registered model or a worker folder is fine


def refuse_other_config(config: str | None, registered: str | None) -> None:
    """ConfigError unless a deployment run keeps the config its deployment was registered with: another file on
    the worker could set any of the keys above (and the check below compares with the file the run names)."""
    if config != registered:
        raise ConfigError(f"config={config!r}: a deployment run takes the config file its deployment was registered "
                          f"with ({registered!r}); to run another, serve a deployment for it (rlhf serve --config FILE)")


def refuse_code_overrides(config: str | None, overrides: list[str]) -> None:
    """ConfigError for the first override that sets a code key (`CODE_KEYS`, any `*.func_path`) or pins a hub id
    (`inputs.*`) to other than what the config file `config` (with its bases) says."""
    raw, file, _ = read_preset(config)
    for text in overrides:
        key, value = parse_override(text)
        for leaf, leaf_value in flatten({key: value}).items():  # `rl={agent: {path: x}}` sets rl.agent.path
            why = CODE_KEYS.get(leaf) or ("names a Python file to run" if leaf.endswith(".func_path") else None)
            if why is None and leaf.startswith(PINS) and is_hub_id(leaf_value):
                why = "downloads a model from the hub"
            if why is not None and get_dotted(raw, leaf) != leaf_value:
                raise ConfigError(f"override {text!r}: {leaf} {why}; a deployment run takes data and hyperparameter "
                                  f"overrides only: set {leaf} in the config file on the worker ({file})")


def is_hub_id(value: Any) -> bool:
    """A pin that is neither an MLflow run or registered model nor a path on the worker: `org/name`."""
    if not isinstance(value, str) or value.startswith(("runs:/", "models:/")):
        return False
    return not (value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().exists())
