"""What data prep refuses in a model folder the user brings, each in one line that names the file or key
and the way out, before any dataset is written: a folder whose config.json has no causal-LM class, and
a chat template that renders the prompt differently once the response follows it."""

import json

import pytest
from transformers import ViTConfig, ViTModel

from configs import CheckpointError, DataError, load_config
from stages.common import checkpoint
from stages.data import prepared as prepared_data
from stages.data_prep import stage as data_prep
from tests.model_families import save_family_checkpoint
from tests.stage.conftest import make_ctx

CORPUS = ["What is 3 plus 4? Answer: 7", "What is 10 plus 2? Answer: 12"] * 4
# ChatML whose generation prompt ends in a newline that an assistant turn does not have
SPLIT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] }}"
    "{% if message['role'] == 'assistant' %}{{ ': ' + message['content'] + '<|im_end|>' }}"
    "{% else %}{{ '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def files_config(model_dir, tmp_path, *extra):
    qa = [{"question": f"What is {i} plus 2?", "response": f"Answer: {i + 2}"} for i in range(4)]
    pref = [{"chosen": [{"role": "user", "content": "What is 1 plus 2?"}, {"role": "assistant", "content": "Answer: 3"}],
             "rejected": [{"role": "user", "content": "What is 1 plus 2?"}, {"role": "assistant", "content": "Answer: 4"}]}] * 2
    for name, rows in (("sft", qa), ("pref", pref)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_config(None, [
        f"model.name_or_path={model_dir}", "data.source=files", "data.max_len=128",
        f"data.sft.paths=[{tmp_path / 'sft.jsonl'}]", "data.sft.input_key=question", "data.sft.output_key=response",
        f"data.preference.paths=[{tmp_path / 'pref.jsonl'}]",
        f"data.prompts.paths=[{tmp_path / 'sft.jsonl'}]", "data.prompts.input_key=question", "data.prompts.label_key=response",
        "data.prompts.eval_ratio=0.5", *extra,
    ])


def run_data_prep(cfg, root):
    return data_prep.run(make_ctx("data_prep", cfg, root), {})


def datasets_written(root) -> list[str]:
    return sorted(p.name for p in (root / "output").iterdir() if p.name != "base_model")


@pytest.fixture
def split_template_model(tmp_path):
    model_dir = save_family_checkpoint("qwen2", tmp_path / "model", CORPUS)
    tok = checkpoint.load_tokenizer(model_dir)
    tok.chat_template = SPLIT_TEMPLATE
    tok.save_pretrained(model_dir)
    return model_dir


def test_a_template_that_renders_the_prompt_otherwise_before_a_response_is_one_line(split_template_model, tmp_path):
    message = (rf"^{tmp_path}/sft.jsonl line \d+: the chat template of {split_template_model} renders the prompt differently "
               r"with and without the response \(the prompt with add_generation_prompt is not the start of the "
               r"conversation\); fix its chat_template, or set data\.sft\.apply_chat_template=false and a "
               r"data\.sft\.input_template$")
    with pytest.raises(DataError, match=message):
        run_data_prep(files_config(split_template_model, tmp_path), tmp_path / "sft")
    assert datasets_written(tmp_path / "sft") == []

    plain_sft = ["data.sft.apply_chat_template=false", "data.sft.input_template='Q {} A'"]
    with pytest.raises(DataError, match=rf"^{tmp_path}/pref.jsonl line 1: .* set data\.preference\.apply_chat_template=false "
                                        r"and a data\.preference\.input_template$"):
        run_data_prep(files_config(split_template_model, tmp_path, *plain_sft), tmp_path / "pref")

    plain = [*plain_sft, "data.preference.apply_chat_template=false", "data.preference.input_template='Q {} A'"]
    outputs = run_data_prep(files_config(split_template_model, tmp_path, *plain), tmp_path / "plain").outputs
    assert prepared_data.read_split(outputs["sft_data"], "train")[0]["texts"][0].startswith("Q What is")


def test_a_model_folder_without_a_causal_lm_class_is_one_line(tmp_path):
    vit = tmp_path / "vit"
    ViTModel(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                       image_size=8, patch_size=4)).save_pretrained(vit)
    with pytest.raises(CheckpointError, match=rf"^model\.name_or_path={vit}: config\.json has model_type 'vit' "
                                              r"\(architectures \['ViTModel'\]\), which has no causal-LM class in "
                                              r"transformers; use a decoder-only language model checkpoint"):
        run_data_prep(files_config(vit, tmp_path), tmp_path / "vit_run")
    assert datasets_written(tmp_path / "vit_run") == []

    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "not_a_model"}))
    (unknown / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=rf"^model\.name_or_path={unknown}: config\.json has model_type "
                                              r"'not_a_model', which transformers [\d.]+ does not know; use a "
                                              r"decoder-only language model checkpoint"):
        run_data_prep(files_config(unknown, tmp_path), tmp_path / "unknown_run")
