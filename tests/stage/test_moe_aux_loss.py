"""The MoE router's load-balancing loss in each stage's training loss (`<stage>.aux_loss_coef`), on a
tiny Mixtral: the stage's loss with coefficient c is its loss without plus c times the router loss,
which is HF's own `aux_loss` of the same batch (so HF's `router_aux_loss_coef` never counts too); a
dense model with a coefficient is a one-line error, from preflight and from the stage."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from configs import ConfigError, load_config
from stages.dag import preflight
from stages.data.tokenization import pad_batch
from stages.dpo import stage as dpo
from stages.rl.workers import token_log_probs
from stages.rm import stage as reward_model
from stages.sft import stage as sft
from tests.model_families import save_family_checkpoint
from tests.stage.conftest import make_ctx
from tests.tiny_checkpoint import save_tiny_checkpoint

CORPUS = ["What is 3 plus 4? Answer: 7", "What is 10 plus 2? Answer: 12"] * 4
COEF = 0.25


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    return save_family_checkpoint("mixtral", tmp_path_factory.mktemp("mixtral"), CORPUS)


@pytest.fixture(scope="module")
def model(mixtral_dir):
    model = AutoModelForCausalLM.from_pretrained(mixtral_dir)
    assert model.config.router_aux_loss_coef > 0  # HF's own coefficient, which must not be added as well
    return model


ROWS = [([5, 6, 7, 8, 9, 10], [-100, -100, -100, 8, 9, 10]), ([11, 12, 13, 14], [-100, -100, 13, 14])]


def hf_aux_loss(model, batch) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_router_logits=True).aux_loss


def test_sft_loss_adds_coef_times_the_router_loss(model):
    batch = pad_batch(ROWS, 0)  # right padding: the router loss counts only the attended tokens
    plain, plain_logs, _ = sft.lm_loss(model, batch)
    with_aux, logs, _ = sft.lm_loss(model, batch, COEF)
    aux = hf_aux_loss(model, batch)
    assert plain_logs == {} and logs == {"aux_loss": aux.item()}
    assert torch.equal(with_aux, plain + COEF * aux)
    router = next(p for n, p in model.named_parameters() if "gate.weight" in n)
    assert torch.autograd.grad(with_aux - plain, router)[0].abs().sum() > 0  # the router learns from it


def test_reward_model_loss_adds_coef_times_the_router_loss(mixtral_dir, model):
    rm = reward_model.LastTokenReward(AutoModelForSequenceClassification.from_pretrained(mixtral_dir, num_labels=1))
    batch = reward_model.pair_batch([([5, 6, 7, 8], [5, 6, 9], 0.0)], 0)
    plain, _, _ = reward_model.bt_loss(rm, batch)
    with_aux, logs, _ = reward_model.bt_loss(rm, batch, COEF)
    aux = hf_aux_loss(model, batch)  # the same backbone weights route the same way
    assert logs["aux_loss"] == aux.item()
    assert torch.equal(with_aux, plain + COEF * aux)


@pytest.mark.parametrize("loss", ["sigmoid", "kto"])
def test_dpo_loss_adds_coef_times_the_router_loss(model, loss):
    pairs = [(([5, 6, 7], [8, 9]), ([5, 6, 7], [10, 11, 12])), (([13, 14], [15]), ([13, 14], [16, 17]))]
    losses = {}
    for coef in (0.0, COEF):
        d = load_config(None, [f"dpo.loss={loss}", f"dpo.aux_loss_coef={coef}"]).dpo
        objective = (dpo.KTOObjective(d, pairs, 0, 1) if loss == "kto"
                     else dpo.PairObjective(d, pairs, 0, shared_prompt=False))
        ref = torch.zeros(len(objective.sequences))
        batch = objective.collate(ref, list(range(objective.n_rows)))
        losses[coef] = objective.loss(model, batch)[:2]
    (plain, _), (with_aux, logs) = losses[0.0], losses[COEF]
    aux = hf_aux_loss(model, batch)  # the trained sequences' batch (KTO's KL pass runs without gradient)
    assert logs["aux_loss"] == aux.item()
    assert torch.equal(with_aux, plain + COEF * aux)


def test_a_router_loss_takes_dpo_pairs_as_padded_rows():
    """HF's MoE forward computes its router loss with the attention mask as [B, T]: a shared-prompt
    row's 4D mask cannot go in."""
    pairs = [(([5, 6, 7], [8, 9]), ([5, 6, 7], [10, 11, 12]))]
    for coef, shared in ((0.0, True), (COEF, False)):
        d = load_config(None, [f"dpo.aux_loss_coef={coef}"]).dpo
        assert dpo.PairObjective(d, pairs, 0, shared_prompt=True).shared_prompt == shared


def test_rl_policy_log_probs_report_the_router_loss(model):
    batch = pad_batch(ROWS, 0)
    aux: list = []
    log_probs = token_log_probs(model, batch, 1.0, aux=aux)
    assert torch.equal(log_probs, token_log_probs(model, batch, 1.0))
    assert aux[0].item() == hf_aux_loss(model, batch).item()


def test_a_router_loss_on_a_dense_model_is_one_line_from_preflight_and_the_stage(tmp_path):
    dense = save_tiny_checkpoint(CORPUS, tmp_path / "dense")
    cfg = load_config(None, [f"model.name_or_path={dense}", "sft.aux_loss_coef=0.01"])
    message = (r"^sft\.aux_loss_coef=0\.01: model_type 'llama' is a dense model \(its config\.json has no "
               r"num_local_experts or num_experts\), so it has no router loss; set sft\.aux_loss_coef=0$")
    with pytest.raises(ConfigError, match=message):
        preflight.check_inputs(cfg)
    with pytest.raises(ConfigError, match=message):  # before any training
        sft.run(make_ctx("sft", cfg, tmp_path / "run"), {"base_model": dense, "sft_data": tmp_path / "no_data"})
    assert not (tmp_path / "run" / "output" / "sft_model").exists()


def test_the_critic_takes_no_router_loss():
    with pytest.raises(ConfigError, match=r"critic.aux_loss_coef: the value loss takes no router loss"):
        load_config(None, ["rl.critic.aux_loss_coef=0.01"])
