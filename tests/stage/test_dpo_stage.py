"""The dpo stage on tiny data: each objective's first loss is its value at the reference (so the
precomputed reference log-probs equal the training forward's), eval reward metrics per eval step,
an HF checkpoint, and a killed run resuming to the same weights as an uninterrupted one.
(Held-out accuracy on the real preset: flow tests.)"""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from configs import load_config
from stages.common import shared_prompt
from stages.dpo import stage as dpo
from tests.stage.conftest import FAST, Recorder, make_ctx
from tests.stage.resume_runs import assert_same_weights

SHORT = [*FAST, "dpo.micro_batch_size=8", "dpo.max_steps=8", "dpo.eval_every=4",
         "dpo.save_every=2", "dpo.lr=2e-3", "dpo.warmup_ratio=0", "dpo.min_lr_ratio=1.0"]


def run_dpo(prepared, root, extra=(), recorder=None):
    cfg = load_config(None, [*SHORT, *extra])
    ctx = make_ctx("dpo", cfg, root, recorder)
    # the base model stands in for the SFT checkpoint: same format, no SFT run needed here
    return dpo.run(ctx, {"sft_model": prepared["base_model"], "pref_data": prepared["pref_data"]})


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    rec = Recorder()
    return run_dpo(prepared, tmp_path_factory.mktemp("dpo"), recorder=rec), rec


@pytest.mark.slow
def test_dpo_logs_reward_metrics_per_eval_step_and_separates_the_pairs(trained):
    result, rec = trained
    evals = [(s, m) for s, m in rec.rows if "eval/reward_accuracy" in m]
    assert [s for s, _ in evals] == [4, 8]
    assert {"eval/loss", "eval/margin", "eval/chosen_reward", "eval/rejected_reward", "eval/nll"} <= set(evals[-1][1])
    train = [m for _, m in rec.rows if "train/loss" in m][-1]
    assert {"train/reward_accuracy", "train/margin", "train/chosen_reward", "train/nll", "train/lr"} <= set(train)
    # 8 steps from log 2: the implicit reward now prefers the correct solutions
    assert result.metrics["eval/loss"] < math.log(2) - 0.03
    assert result.metrics["eval/margin"] > 0 and result.metrics["eval/reward_accuracy"] > 0.6


@pytest.mark.slow
def test_dpo_checkpoint_loads_with_plain_transformers(trained, prepared):
    result, _ = trained
    model = AutoModelForCausalLM.from_pretrained(result.outputs["dpo_model"])
    base = AutoModelForCausalLM.from_pretrained(prepared["base_model"])
    moved = max(float((a - b).abs().max()) for a, b in zip(model.state_dict().values(), base.state_dict().values()))
    assert moved > 1e-4


@pytest.mark.parametrize(("overrides", "expected", "shared_prompt"), [
    ([], math.log(2), False),  # DPO: -log sigmoid(0)
    ([], math.log(2), True),  # the same pairs, one row each
    (["dpo.label_smoothing=0.2"], math.log(2), True),  # cDPO is symmetric at margin 0
    (["dpo.loss=ipo", "dpo.beta=0.5"], 1.0, True),  # (0 - 1 / (2 * 0.5))^2
    (["dpo.loss=kto", "dpo.desirable_weight=1.5", "dpo.undesirable_weight=1.5"], 0.75, False),  # 1.5 * (1 - sigmoid(0))
])
def test_objective_at_the_reference(prepared, overrides, expected, shared_prompt):
    """With policy == reference the precomputed reference log-probs must equal the training forward's,
    so each objective's loss is its value at margin 0 (and KTO's KL reference point is 0)."""
    from stages.common import checkpoint
    from stages.data.prepared import read_split

    d = load_config(None, ["dpo.nll_loss_coef=0", *overrides]).dpo  # the NLL term is not 0 at the reference
    tok = checkpoint.load_tokenizer(prepared["base_model"])
    model = AutoModelForCausalLM.from_pretrained(prepared["base_model"]).eval()
    pairs = dpo.encode_pairs(tok, read_split(prepared["pref_data"], "train")[:6])
    objective = (dpo.KTOObjective(d, pairs, tok.pad_token_id, world=1) if d.loss == "kto"
                 else dpo.PairObjective(d, pairs, tok.pad_token_id, shared_prompt))
    assert getattr(objective, "shared_prompt", False) == shared_prompt
    with torch.no_grad():
        ref = dpo.reference_logps(model, objective.sequences, batch_size=4, pad_id=tok.pad_token_id, rank=0, world=1)
        loss, logs, _ = objective.loss(model, objective.collate(ref, list(range(objective.n_rows))))
    assert float(loss) == pytest.approx(expected, abs=1e-5)
    if d.loss == "kto":
        # fp32 sums over ~20 tokens, batched 4 at a time vs all at once: ~1e-6 apart (as the loss above)
        assert logs["kl"] == pytest.approx(0.0, abs=1e-5)
    else:
        assert logs["margin"] == pytest.approx(0.0, abs=1e-6) and logs["nll"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_shared_prompt_row_scores_and_trains_as_two_padded_rows(prepared, attention):
    """The rows of one prompt as one row (prompt once, each response masked from the others) give each
    response the log-prob, token count and gradient of its own padded row."""
    from stages.common import checkpoint
    from stages.data.prepared import read_split

    tok = checkpoint.load_tokenizer(prepared["base_model"])
    model = AutoModelForCausalLM.from_pretrained(prepared["base_model"], attn_implementation=attention)
    pairs = dpo.encode_pairs(tok, read_split(prepared["pref_data"], "train")[:7])
    prompt = pairs[0][0][0]
    pairs.append(((prompt, pairs[1][0][1]), (prompt, pairs[2][1][1])))  # a second pair of the first prompt
    assert len({len(c[1]) + len(r[1]) for c, r in pairs}) > 1  # rows of different lengths: pads in the shared rows
    batch = dpo.sequence_batch([c for c, _ in pairs] + [r for _, r in pairs], tok.pad_token_id)
    rows = shared_prompt.layout(batch["input_ids"], batch["attention_mask"], batch["response_mask"].argmax(-1))
    assert rows.input_ids.shape[0] == len(pairs) - 1  # both pairs of the first prompt in one row
    results = []
    for shared in (False, True):
        model.zero_grad()
        sums, counts = dpo.response_logps(model, batch, shared=shared)
        (sums * torch.linspace(0.5, 1.5, len(sums))).sum().backward()  # a different weight per sequence
        results.append((sums.detach(), counts, [p.grad.clone() for p in model.parameters()]))
    (padded, padded_counts, padded_grads), (shared, shared_counts, shared_grads) = results
    assert shared.tolist() == pytest.approx(padded.tolist(), abs=1e-4)
    assert shared_counts.tolist() == padded_counts.tolist() == [len(s[1]) for s in [c for c, _ in pairs] + [r for _, r in pairs]]
    assert max(float((a - b).abs().max()) for a, b in zip(shared_grads, padded_grads)) < 1e-4


def test_pairs_that_do_not_share_a_prompt_or_have_an_empty_response_keep_two_rows():
    d = load_config(None, []).dpo
    shared = ((([1, 2], [3]), ([1, 2], [4, 5])),)
    assert dpo.PairObjective(d, list(shared), 0, shared_prompt=True).shared_prompt
    assert not dpo.PairObjective(d, list(shared), 0, shared_prompt=False).shared_prompt
    assert not dpo.PairObjective(d, [*shared, (([1, 2], [3]), ([1, 9], [4]))], 0, shared_prompt=True).shared_prompt
    assert not dpo.PairObjective(d, [*shared, (([1, 2], [3]), ([1, 2], []))], 0, shared_prompt=True).shared_prompt


@pytest.mark.slow
def test_killed_run_resumes_from_last_checkpoint_and_matches_uninterrupted(prepared, trained, tmp_path, capsys):
    with pytest.raises(KeyboardInterrupt):
        run_dpo(prepared, tmp_path, recorder=Recorder(fail_at=4))  # dies at step 4's eval, before its save
    reference_file = tmp_path / "work" / dpo.REFERENCE_FILE
    assert reference_file.is_file()
    written = reference_file.stat().st_mtime_ns
    result = run_dpo(prepared, tmp_path)
    assert "[dpo] resumed from step 2/8" in capsys.readouterr().out
    assert result.metrics["resumed_from_step"] == 2
    assert reference_file.stat().st_mtime_ns == written  # reused, not recomputed from the trained weights
    assert_same_weights(trained[0].outputs["dpo_model"], result.outputs["dpo_model"])  # bit for bit


def test_loss_options_are_checked_against_the_loss():
    from configs.errors import ConfigError

    with pytest.raises(ConfigError, match="label_smoothing"):
        load_config(None, ["dpo.loss=ipo", "dpo.label_smoothing=0.1"])
    with pytest.raises(ConfigError, match="desirable_weight"):
        load_config(None, ["dpo.desirable_weight=2"])


def test_reference_logps_match_an_independent_hf_forward(prepared):
    """The precompute's summed response log-probs equal a plain HF forward's, sequence by sequence."""
    from stages.common import checkpoint
    from stages.data.prepared import read_split

    tok = checkpoint.load_tokenizer(prepared["base_model"])
    model = AutoModelForCausalLM.from_pretrained(prepared["base_model"]).eval()
    pairs = dpo.encode_pairs(tok, read_split(prepared["pref_data"], "eval")[:5])
    seqs = [c for c, _ in pairs] + [r for _, r in pairs]
    with torch.no_grad():
        ours = dpo.reference_logps(model, seqs, batch_size=3, pad_id=tok.pad_token_id, rank=0, world=1)
        for value, (prompt, response) in zip(ours, seqs):
            ids = torch.tensor([prompt + response])
            logps = model(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            assert float(value) == pytest.approx(float(logps[len(prompt) - 1 :].sum()), abs=1e-4)
        # only the rows a run draws are scored: pair 3's chosen and rejected sequences
        partial = dpo.scored_reference(model, dpo.PairObjective(None, pairs, tok.pad_token_id), [3], 4,
                                       tok.pad_token_id, rank=0, world=1)
    assert torch.isnan(partial).tolist() == [i not in (3, 8) for i in range(10)]
    assert partial[[3, 8]].tolist() == pytest.approx(ours[[3, 8]].tolist(), abs=1e-5)


def test_reference_is_computed_for_exactly_the_rows_the_run_draws():
    from stages.common.trainer import SampleStream

    d = load_config(None, ["dpo.max_steps=3", "dpo.micro_batch_size=4", "dpo.grad_accum_steps=2"]).dpo
    rows = dpo.rows_trained_on(100, d, world=2, seed=5)
    drawn = {i for r in range(2) for g in range(3 * 2) for i in SampleStream(100, 4, r, 2, 5).micro_batch(g)}
    assert rows == sorted(drawn) and len(rows) == 48
    assert dpo.rows_trained_on(40, d, world=2, seed=5) == list(range(40))  # more draws than rows: all of them



# --- iterative (online) DPO ----------------------------------------------------------------

ITERATIVE = ["dpo.iterative.rounds=2", "dpo.max_steps=4", "dpo.eval_every=1", "dpo.save_every=2",
             "dpo.iterative.prompts_per_round=8", "dpo.iterative.samples_per_prompt=4", "dpo.iterative.max_new_tokens=12"]


def run_iterative(prepared, root, length_reward, recorder=None):
    cfg = load_config(None, [*SHORT, *ITERATIVE, f"reward.func_path={length_reward}"])
    ctx = make_ctx("dpo", cfg, root, recorder)
    return dpo.run(ctx, {"sft_model": prepared["base_model"], "pref_data": prepared["pref_data"],
                         "prompts": prepared["prompts"]})


@pytest.fixture(scope="module")
def iterative(prepared, length_reward, tmp_path_factory):
    rec, root = Recorder(), tmp_path_factory.mktemp("iterative")
    return run_iterative(prepared, root, length_reward, rec), rec, root


def test_best_worst_pairs_by_hand():
    from stages.dpo.iterative import best_worst_pairs

    rewards = torch.tensor([[0.0, 1.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0], [3.0, -1.0, 3.0, -1.0]])
    assert best_worst_pairs(rewards) == [(1, 0), None, (0, 1)]


@pytest.mark.slow
def test_each_round_pairs_the_policys_best_and_worst_samples(iterative, prepared):
    from stages.common import checkpoint

    result, rec, root = iterative
    rounds = [(s, m) for s, m in rec.rows if "round/pairs" in m]
    assert [s for s, _ in rounds] == [0, 2]  # two rounds, max_steps 4 split in two
    assert all(m["round/prompts"] == 8 and 0 < m["round/pairs"] <= 8 for _, m in rounds)
    assert all(m["round/best_reward_mean"] > m["round/reward_mean"] for _, m in rounds)
    tokenizer = checkpoint.load_tokenizer(prepared["base_model"])
    for r in range(2):
        saved = torch.load(root / "work" / "rounds" / f"round{r}.pt")
        assert len(saved["pairs"]) == rounds[r][1]["round/pairs"]
        for (prompt, chosen), (prompt2, rejected) in saved["pairs"]:
            assert prompt == prompt2
            # the length reward: the chosen response is the longer text
            assert len(tokenizer.decode(chosen, skip_special_tokens=True)) > len(tokenizer.decode(rejected, skip_special_tokens=True))
    assert {"eval/reward_accuracy", "eval/margin"} <= set(rec.rows[-1][1])
    assert AutoModelForCausalLM.from_pretrained(result.outputs["dpo_model"]) is not None


@pytest.mark.slow
def test_first_rounds_reference_is_the_starting_policy(iterative, prepared):
    """Round 0's reference log-probs are the SFT (here: base) model's, from an independent HF forward."""
    _, _, root = iterative
    saved = torch.load(root / "work" / "rounds" / "round0.pt")
    model = AutoModelForCausalLM.from_pretrained(prepared["base_model"]).eval()
    chosen = [c for c, _ in saved["pairs"]]
    with torch.no_grad():  # each sequence alone, unpadded: the sum of its response tokens' log-probs
        for value, (prompt, response) in zip(saved["ref"][: len(chosen)], chosen):
            ids = torch.tensor([prompt + response])
            logps = model(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            assert float(value) == pytest.approx(float(logps[len(prompt) - 1 :].sum()), abs=1e-4)


@pytest.mark.slow
def test_killed_iterative_run_resumes_on_the_saved_round(prepared, length_reward, iterative, tmp_path, capsys):
    with pytest.raises(KeyboardInterrupt):
        run_iterative(prepared, tmp_path, length_reward, Recorder(fail_at=3))  # round 2 made at step 2, saved at 2
    round_file = tmp_path / "work" / "rounds" / "round1.pt"
    written = round_file.stat().st_mtime_ns
    capsys.readouterr()
    result = run_iterative(prepared, tmp_path, length_reward)
    out = capsys.readouterr().out
    assert "[dpo] resumed from step 2/4" in out and "round 2/2" not in out  # the round is reloaded, not resampled
    assert round_file.stat().st_mtime_ns == written
    assert_same_weights(iterative[0].outputs["dpo_model"], result.outputs["dpo_model"])  # bit for bit
