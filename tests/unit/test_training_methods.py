"""The pure parts of the training methods beside SFT, RL and DPO: rejection sampling's best-of-n filter,
knowledge distillation's divergences and loss, and the teacher-student tokenizer check."""

import json
import math

import pytest
import torch

from stages.kd.losses import forward_kl, kd_loss, reverse_kl, token_nll
from stages.rs.stage import best_of_n


@pytest.mark.parametrize(("rewards", "threshold", "expected"), [
    ([[0.0, 1.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0], [-3.0, -1.0, -2.0, -1.5]], None, [1, 0, 1]),  # ties: the first
    ([[0.0, 1.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0], [-3.0, -1.0, -2.0, -1.5]], 1.0, [1, 0, None]),  # at the threshold: kept
    ([[0.0, 1.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0], [-3.0, -1.0, -2.0, -1.5]], 1.5, [None, 0, None]),
    ([[0.0, 0.0], [0.0, 1.0]], 1.0, [None, 1]),  # 0/1 rewards: only prompts with a correct sample
    ([[float("-inf"), -1e30]], -1e31, [1]),
])
def test_best_of_n_keeps_each_prompts_first_best_sample_at_or_above_the_threshold(rewards, threshold, expected):
    assert best_of_n(torch.tensor(rewards), threshold) == expected


# --- knowledge distillation: the divergences and their mix with the NLL --------------------

LN3 = math.log(3.0)
# p_s = (1/2, 1/2), p_t = (3/4, 1/4):
FORWARD = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)  # KL(t || s) = 0.1308120...
REVERSE = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(2.0)  # KL(s || t) = 0.1438410...


@pytest.mark.parametrize(("divergence", "student", "teacher", "expected"), [
    (forward_kl, [0.0, 0.0], [LN3, 0.0], FORWARD),
    (reverse_kl, [0.0, 0.0], [LN3, 0.0], REVERSE),
    (forward_kl, [5.0, 5.0], [LN3 - 7.0, -7.0], FORWARD),  # a shift of the logits changes no distribution
    (forward_kl, [1.0, 2.0], [1.0, 2.0], 0.0),
    (forward_kl, [1e4, 0.0], [0.0, 1e4], 1e4),  # extreme logits: log-probs of 0 and -1e4, no overflow
    (reverse_kl, [1e4, 0.0], [0.0, 1e4], 1e4),
    (forward_kl, [0.0, -math.inf, 0.0], [LN3, -math.inf, 0.0], FORWARD),  # a token both rule out counts 0 (0 log 0)
    (reverse_kl, [0.0, -math.inf, 0.0], [LN3, -math.inf, 0.0], REVERSE),
    (reverse_kl, [0.0, -math.inf], [0.0, 0.0], math.log(2.0)),  # the student rules out what the teacher allows
    (forward_kl, [0.0, -math.inf], [0.0, 0.0], math.inf),  # ... which the forward KL cannot forgive
])
def test_each_divergence_of_one_token_by_hand(divergence, student, teacher, expected):
    value = divergence(torch.tensor([[student]]), torch.tensor([[teacher]]), torch.tensor([[True]]))
    assert float(value) == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_divergences_average_over_the_response_tokens_only_and_give_finite_gradients_at_extremes():
    student = torch.tensor([[[0.0, 0.0], [1e4, -1e4], [3.0, -2.0]]], requires_grad=True)
    teacher = torch.tensor([[[LN3, 0.0], [-1e4, 1e4], [0.0, 0.0]]])
    mask = torch.tensor([[True, False, True]])  # the middle (prompt) token carries no loss, extreme as it is
    third = 0.5 * math.log(0.5 / (1 / (1 + math.exp(-5.0)))) + 0.5 * math.log(0.5 / (1 / (1 + math.exp(5.0))))
    loss = forward_kl(student, teacher, mask)
    assert float(loss.detach()) == pytest.approx((FORWARD + third) / 2, rel=1e-6)
    loss.backward()
    assert torch.isfinite(student.grad).all() and float(student.grad[0, 1].abs().max()) == 0.0
    assert float(forward_kl(student, teacher, torch.zeros(1, 3, dtype=torch.bool)).detach()) == 0.0  # nothing to average


def test_nll_and_the_kd_mix():
    logits = torch.tensor([[[0.0, LN3], [2.0, 2.0]]])
    labels = torch.tensor([[1, -100]])
    nll = token_nll(logits, labels)
    assert float(nll) == pytest.approx(-math.log(0.75), rel=1e-6)  # p(token 1) = 3/4; the ignored position is out
    assert float(kd_loss(nll, torch.tensor(FORWARD), 0.4)) == pytest.approx(0.6 * -math.log(0.75) + 0.4 * FORWARD, rel=1e-6)
    assert float(kd_loss(nll, torch.tensor(FORWARD), 1.0)) == pytest.approx(FORWARD, rel=1e-6)


# --- knowledge distillation: the teacher shares the student's tokenizer, checked before any stage ---


def checkpoint_files(folder, vocab: dict[str, int], width: int, added=("<|end|>", "<|step|>")):
    """The files the pre-run check reads: config.json, tokenizer.json (a BPE and its added tokens), weights."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": width}))
    tokenizer = {"model": {"type": "BPE", "vocab": vocab},
                 "added_tokens": [{"id": len(vocab) + i, "content": token} for i, token in enumerate(added)]}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize(("teacher_vocab", "width", "problem"), [
    ({"a": 0, "b": 1, "c": 2}, 5, None),
    ({"a": 0, "b": 1, "c": 2}, 8, "its logits cover 8 tokens, the student's 5"),
    ({"a": 0, "b": 1}, 5, "its vocabulary has 4 tokens, the student's 5"),
    ({"a": 0, "c": 1, "b": 2}, 5, "token 'b' has id 2 in it, 1 in the student's"),
])
def test_a_teacher_with_another_tokenizer_stops_the_run_in_one_line(tmp_path, teacher_vocab, width, problem):
    from configs import load_config
    from configs.errors import CheckpointError
    from stages.dag.preflight import check_distillation

    student = checkpoint_files(tmp_path / "student", {"a": 0, "b": 1, "c": 2}, 5)
    teacher = checkpoint_files(tmp_path / "teacher", teacher_vocab, width)
    cfg = load_config(None, [f"model.name_or_path={student}", "kd.enabled=true", "kd.teacher=path",
                             f"kd.teacher_path={teacher}"])
    if problem is None:
        check_distillation(cfg)
        return
    with pytest.raises(CheckpointError) as failed:
        check_distillation(cfg)
    assert str(failed.value) == (f"kd.teacher_path={teacher}: the teacher's tokenizer differs from the student's "
                                 f"(model.name_or_path={student}): {problem}; distil a teacher that shares the "
                                 "student's tokenizer and vocabulary")
    check_distillation(load_config(None, [f"model.name_or_path={student}"]))  # kd off: nothing checked


def test_the_step_placeholder_data_prep_adds_to_the_students_tokenizer_is_no_mismatch(tmp_path):
    """A teacher this pipeline trained from the same hub model has `prm.placeholder_token` (data prep added it
    and grew the embeddings); the student's model does not have it yet."""
    from configs import load_config
    from stages.dag.preflight import check_distillation

    student = checkpoint_files(tmp_path / "student", {"a": 0, "b": 1, "c": 2}, 4, added=("<|end|>",))
    teacher = checkpoint_files(tmp_path / "teacher", {"a": 0, "b": 1, "c": 2}, 5)
    check_distillation(load_config(None, [f"model.name_or_path={student}", "kd.enabled=true", "kd.teacher=path",
                                          f"kd.teacher_path={teacher}"]))


# --- conditional SFT: the reward in the prompt --------------------------------------------


def test_a_prompt_carries_its_score_with_one_decimal_and_other_braces_stay():
    from stages.common.conditioning import condition

    assert condition("<|user|>\nCompute 2+3\n<|assistant|>\n", "{prompt}<rm_score>: {reward}\n", 1.26) == \
        "<|user|>\nCompute 2+3\n<|assistant|>\n<rm_score>: 1.3\n"
    assert condition("a {x} b", "score {reward} | {prompt}", -0.04) == "score -0.0 | a {x} b"


def test_scores_are_normalized_with_the_training_rows_mean_and_std():
    from stages.csft.stage import normalized

    train, other = normalized(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 0.0]))  # mean 2, sample std 1
    assert train.tolist() == [-1.0, 0.0, 1.0] and other.tolist() == [2.0, -2.0]
    train, other = normalized(torch.tensor([5.0, 5.0]), torch.tensor([6.0]))  # no spread: shifted only
    assert train.tolist() == [0.0, 0.0] and other.tolist() == [1.0]


def test_conditional_sft_without_a_reward_model_stops_the_run_in_one_line(tmp_path):
    from configs.errors import ConfigError
    from configs.schema import PipelineConfig
    from stages.dag.preflight import check_conditional_sft

    files = {"source": "files", "sft": {"paths": ["x.jsonl"]}, "prompts": {"paths": ["y.jsonl"]}}
    cfg = PipelineConfig.model_validate({"data": files, "csft": {"enabled": True}})
    with pytest.raises(ConfigError) as failed:
        check_conditional_sft(cfg)
    assert str(failed.value) == (
        "csft.enabled: conditional SFT scores the SFT data with a reward model, and this pipeline has none "
        "(reward.rm_paths is empty and, without data.preference, the rm stage trains none); set reward.rm_paths, "
        "data.preference or inputs.reward_model")
    check_conditional_sft(PipelineConfig.model_validate({"data": files, "csft": {"enabled": True},
                                                         "reward": {"rm_paths": ["/rm"]}}))
    check_conditional_sft(PipelineConfig.model_validate({"csft": {"enabled": True}}))  # the synthetic task has pairs
    check_conditional_sft(PipelineConfig.model_validate({"data": files}))  # csft off
