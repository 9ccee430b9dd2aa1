"""LoRA-merge stage: every model a training stage saved as a LoRA adapter, merged into its base
with peft and saved as a full HF checkpoint (causal LM, or the RM's sequence-classification model
with its head and reward statistics), with the tokenizer.

Reads whichever of `sft_model`, `reward_model`, `prm`, `dpo_model`, `rl_model` the pipeline made;
writes `merged_models/<name>/` for each that is an adapter. The stage checks each merge: the merged
model's logits on a probe batch equal the adapter model's (`max_logit_diff`, reported).
`merge` is also what `rlhf merge` runs, and `materialize` is how the flow hands an adapter to a
stage that needs a full model.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from configs.errors import CheckpointError
from stages.common import checkpoint, checkpoint_paths, lora
from stages.dag.contract import StageContext, StageResult

MODEL_INPUTS = ("sft_model", "reward_model", "prm", "dpo_model", "rl_model")
PROBE_TOKENS = 32
# transformers builds models under process-wide patches (meta device, default dtype): stages running
# side by side in the flow's threads must not load at the same time
_MATERIALIZE_LOCK = threading.Lock()


def load_base(base: str, sequence_classification: bool):
    source = checkpoint_paths.resolve(base)
    checkpoint_paths.validate(source, field="base")
    try:
        if sequence_classification:
            return AutoModelForSequenceClassification.from_pretrained(source, num_labels=1)
        return AutoModelForCausalLM.from_pretrained(source)
    except Exception as exc:  # the IO / config errors vary; one line is what the user needs
        raise CheckpointError(f"base={base}: cannot load ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc


def merge(adapter: Path, out: Path, base: str | None = None, is_rm: bool | None = None) -> float:
    """Merge `adapter` into `base` (default: the base it records) and save a full checkpoint at `out`
    (written aside and renamed into place). Returns the max |logit| difference between the adapter
    model and the merged one on a probe batch."""
    from peft import PeftModel

    adapter = Path(adapter)
    if not checkpoint_paths.is_adapter(adapter):
        raise CheckpointError(f"adapter={adapter}: not a LoRA adapter (no {checkpoint_paths.ADAPTER_CONFIG})")
    config = json.loads((adapter / checkpoint_paths.ADAPTER_CONFIG).read_text())
    base = base or config.get("base_model_name_or_path")
    if not base:
        raise CheckpointError(f"adapter={adapter}: records no base model; pass one")
    is_rm = config.get("task_type") == "SEQ_CLS" if is_rm is None else is_rm
    extra = lora.read_extra(adapter)
    tokenizer = checkpoint.load_tokenizer(adapter)
    model = load_base(base, is_rm)
    recorded = extra.get("base_signature")
    if recorded and lora.base_signature(model) != recorded:
        raise CheckpointError(f"adapter={adapter} was trained on another base than {base} (its weights differ); "
                              "pass the checkpoint the adapter was trained from")
    if is_rm:
        model.config.pad_token_id = tokenizer.pad_token_id  # where the head reads the last token
    try:
        peft_model = PeftModel.from_pretrained(model, adapter).eval()
    except Exception as exc:
        raise CheckpointError(f"adapter={adapter} does not fit base={base} ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
    # a probe batch of ordinary tokens (the first of the vocabulary that are not special)
    ids = [i for i in range(len(tokenizer)) if i not in set(tokenizer.all_special_ids)][:PROBE_TOKENS]
    probe = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    with torch.no_grad():
        expected = peft_model(**probe).logits
        merged = peft_model.merge_and_unload()
        diff = float((merged(**probe).logits - expected).abs().max())
    tmp = out.with_name(f"{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    fields = extra.get("config_fields", {})
    if is_rm:
        from stages.rm.stage import save_reward_model

        save_reward_model(merged, tokenizer, tmp, merged.state_dict(), fields.get("value_head_prefix", "score"),
                          fields.get("normalize_reward", False), fields.get("reward_mean", 0.0), fields.get("reward_std", 1.0))
    else:
        lora.save_trained(merged, tokenizer, tmp, None, None, fields)
    try:
        os.rename(tmp, out)  # atomic: a reader sees no checkpoint or a whole one
    except OSError:
        if not (out / "config.json").is_file():
            raise
        shutil.rmtree(tmp)  # another process merged the same adapter first
    return diff


def materialize(path: Path) -> Path:
    """`path` itself, or for an adapter its merged checkpoint (made once, beside it)."""
    if not checkpoint_paths.is_adapter(path):
        return path
    merged = Path(path).with_name(Path(path).name + ".merged")
    with _MATERIALIZE_LOCK:
        if not (merged / "config.json").is_file():
            merge(Path(path), merged)
    return merged


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    out = ctx.output_dir / "merged_models"
    out.mkdir(parents=True)
    diffs = {}
    for name in MODEL_INPUTS:
        if name in inputs and checkpoint_paths.is_adapter(inputs[name]):
            diffs[name] = merge(inputs[name], out / name)
            print(f"[lora_merge] {name}: merged ({out / name}); max |logit diff| vs the adapter model {diffs[name]:.2e}", flush=True)
    if not diffs:
        raise CheckpointError("lora_merge: none of this pipeline's models is a LoRA adapter")
    metrics = {f"merge/{name}/max_logit_diff": d for name, d in diffs.items()}
    metrics |= {"merge/max_logit_diff": max(diffs.values()), "merge/models": float(len(diffs))}
    return StageResult(outputs={"merged_models": out}, metrics=metrics)
