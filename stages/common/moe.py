"""Mixture-of-experts models: the router's load-balancing loss, added to a training stage's loss times
`<stage>.aux_loss_coef` (OpenRLHF's `--aux_loss_coef`) and logged as `aux_loss`.

Each transformers MoE family defines its own `load_balancing_loss_func` (Switch Transformer's) beside
its model classes; that function is used as it is, over the tokens the stage's attention mask keeps.
The stages compute their losses from logits, so the loss HF adds `router_aux_loss_coef` to (one
computed from `labels`) is never the one trained on: the coefficient counts once.

A pass that should report the loss gets a list (`aux`) to append it to; `None` means a dense pass.
Nothing here imports torch or transformers until a loss is computed: the flow's preflight calls `check`.
"""

from __future__ import annotations

import sys

from configs.errors import ConfigError

EXPERT_COUNTS = ("num_local_experts", "num_experts")  # Mixtral-style, Qwen2-MoE-style config keys


def num_experts(config: dict) -> int:
    """Experts per MoE layer of a model config (as a dict, e.g. config.json); 0 for a dense model."""
    return next((int(config[key]) for key in EXPERT_COUNTS if config.get(key)), 0)


def check(config, coef: float, field: str) -> None:
    """`coef` > 0 needs a model with a router: a ConfigError naming `field` on a dense model. `config`:
    a loaded model config, or config.json as a dict (then the loss function is looked up later)."""
    if not coef:
        return
    values = config if isinstance(config, dict) else config.to_dict()
    if not num_experts(values):
        raise ConfigError(f"{field}={coef}: model_type {values.get('model_type')!r} is a dense model (its config.json has "
                          f"no {' or '.join(EXPERT_COUNTS)}), so it has no router loss; set {field}=0")
    if not isinstance(config, dict):
        loss_func(config)


def loss_func(config):
    """The family's `load_balancing_loss_func`, from the module of its causal-LM class."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    func = getattr(sys.modules.get(getattr(model_class, "__module__", "")), "load_balancing_loss_func", None)
    if func is None:
        raise ConfigError(f"aux_loss_coef: transformers defines no load_balancing_loss_func for model_type "
                          f"{config.model_type!r}; set the stage's aux_loss_coef=0")
    return func


def router_kwargs(aux: list | None) -> dict:
    """What a forward pass that reports the router loss is called with."""
    return {} if aux is None else {"output_router_logits": True}


def record(aux: list | None, model, outputs, mask) -> None:
    """Append the load-balancing loss of a pass of `model` (an HF or peft model, or a DeepSpeed engine
    around one) over the tokens `mask` ([B, T], 1 = a real token; None: every token) to `aux`."""
    if aux is None:
        return
    config = getattr(model, "module", model).config
    if getattr(outputs, "router_logits", None) is None:  # the loss func would return 0: a silent no-op
        raise RuntimeError(f"{type(outputs).__name__} carries no router_logits to compute the router loss from")
    experts = num_experts(config.to_dict())
    aux.append(loss_func(config)(outputs.router_logits, experts, config.num_experts_per_tok, mask))


def add_aux_loss(loss, aux: list | None, coef: float, logs: dict[str, float]):
    """`loss` plus `coef` times the recorded router losses; their sum goes to `logs["aux_loss"]`."""
    if not aux:
        return loss
    total = sum(aux)
    logs["aux_loss"] = total.item()
    return loss + coef * total
