"""`rlhf data preview`: rows rendered as the model sees them, the tokens that carry loss marked, and
the length percentiles against data.max_len."""

import io
import json

from rich.console import Console

from configs import load_config
from flows.cli.data_preview import length_line, percentile, preview, render, tokens_with_loss
from flows.cli.main import main

SMALL = ["data.synthetic.num_train=40", "data.synthetic.num_eval=8", "data.synthetic.num_prompts=8"]


def plain_preview(cfg, n=1) -> str:
    out = io.StringIO()
    preview(cfg, n, Console(file=out, width=400, no_color=True))
    return out.getvalue()


def test_percentiles_and_the_length_line():
    assert [percentile(list(range(1, 101)), q) for q in (50, 90, 99)] == [50, 90, 99]
    assert percentile([7], 99) == 7
    assert length_line([10, 20, 30, 200], 96) == "tokens: p50 20, p90 200, p99 200, max 200 (data.max_len 96: 1 row over)"


def test_runs_of_loss_tokens_are_marked_as_spans():
    tokens = [("Q: ", False), ("1+1", False), ("=", True), ("2", True), ("\n", False), ("<eos>", True)]
    assert render(tokens, colour=False).plain == "Q: 1+1⟦=2⟧\n⟦<eos>⟧"
    coloured = render(tokens, colour=True)
    assert coloured.plain == "Q: 1+1=2\n<eos>" and len(coloured.spans) == 2


def test_every_dataset_of_the_preset_is_shown_with_its_loss_tokens():
    cfg = load_config(None, SMALL)
    shown = plain_preview(cfg)
    for name in ("sft_data/train", "sft_data/eval", "pref_data/train", "prm_data/train", "prompts/train", "eval_data/eval"):
        assert f"== {name}: " in shown
    sft = shown.split("== sft_data/train")[1]
    assert "⟦" in sft and "<|end|>" in sft.split("⟦", 1)[1]  # the response and its EOS carry loss
    assert "<|user|>" in sft.split("⟦", 1)[0]  # the templated prompt does not
    prm = shown.split("== prm_data/train")[1].split("==")[0]
    assert prm.count("⟦<|step|>⟧") >= 2 and "⟦" not in prm.replace("⟦<|step|>⟧", "")
    prompts = shown.split("== prompts/train")[1].split("==")[0]
    assert "0 with loss" in prompts and "label:" in prompts


def test_the_marked_tokens_are_the_ones_sft_trains_on():
    cfg = load_config(None, SMALL)
    from stages.data_prep.stage import build_datasets, tokenizer_for

    tokenizer = tokenizer_for(cfg)
    row = build_datasets(cfg, tokenizer)["sft_data"]["train"][0]  # the rendered row, with the ids SFT trains on
    tokens = tokens_with_loss(tokenizer, row["texts"], row["train"])
    trained = "".join(piece for piece, loss in tokens if loss)
    assert trained == row["texts"][-1]  # exactly the response (with EOS)
    assert [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m] == \
        tokenizer(trained, add_special_tokens=False)["input_ids"]


def test_the_cli_shows_a_files_dataset_with_its_template(tmp_path, capsys, monkeypatch):
    from tests.tiny_checkpoint import save_tiny_checkpoint

    model = save_tiny_checkpoint(["What is 1+2?\n1+2=3\nAnswer: 3"] * 4, tmp_path / "model")
    sft, prompts = tmp_path / "sft.jsonl", tmp_path / "prompts.jsonl"
    sft.write_text("".join(json.dumps({"question": f"What is {i}+1?", "response": f"{i + 1}"}) + "\n" for i in range(10)))
    prompts.write_text("".join(json.dumps({"question": f"What is {i}+2?", "answer": str(i + 2)}) + "\n" for i in range(10)))
    monkeypatch.chdir(tmp_path)
    code = main(["data", "preview", "--n", "2", f"model.name_or_path={model}", "data.source=files",
                 f"data.sft={{paths: [{sft}], input_key: question, output_key: response, eval_ratio: 0.2}}",
                 f"data.prompts={{paths: [{prompts}], input_key: question, label_key: answer, eval_ratio: 0.2}}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "== sft_data/train: 8 rows" in out and "What is" in out and out.count("-- row") >= 4
    assert not (tmp_path / ".rlhf").exists()  # a preview writes nothing
