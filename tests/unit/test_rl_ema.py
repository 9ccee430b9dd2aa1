"""rl.actor.ema_beta: the policy's moving average (OpenRLHF's --enable_ema / --ema_beta), on a module of a few
parameters whose values are exact in binary, so each expected value is written out by hand."""

from __future__ import annotations

import pytest
import torch

from configs.errors import CheckpointError
from stages.rl.ema import EMA_FILE, PolicyAverage, moving_average


@pytest.mark.parametrize(("beta", "expected"), [
    (0.75, [0.75 * 4 + 0.25 * 8, 0.75 * -2 + 0.25 * 2]),  # [5, -1]
    (0.5, [6.0, 0.0]),
    (0.0, [8.0, 2.0]),  # beta 0: the average is the new weights
    (1.0, [4.0, -2.0]),  # beta 1: the average never moves
])
def test_moving_average_is_beta_times_the_average_plus_the_rest_times_the_weights(beta, expected):
    got = moving_average(torch.tensor([4.0, -2.0]), torch.tensor([8.0, 2.0]), beta)
    assert got.tolist() == expected


class Tied(torch.nn.Module):
    """An embedding tied to the output head (two names, one parameter) and a frozen bias."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        self.head = self.embed
        self.frozen = torch.nn.Parameter(torch.tensor([3.0]), requires_grad=False)


def test_the_average_follows_each_optimizer_step_and_replaces_the_trained_weights_under_every_name():
    model = Tied()
    ema = PolicyAverage(model, beta=0.5, zero3=False, keeps=True)
    assert set(ema.average) == {"embed"}  # trained parameters only, a tied one once
    with torch.no_grad():
        model.embed.copy_(torch.tensor([3.0, 6.0]))
    ema.update(model)  # 0.5 x [1, 2] + 0.5 x [3, 6]
    with torch.no_grad():
        model.embed.copy_(torch.tensor([6.0, 0.0]))
    ema.update(model)  # 0.5 x [2, 4] + 0.5 x [6, 0]
    assert ema.average["embed"].tolist() == [4.0, 2.0]
    state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}  # HF names, tied twice
    out = ema.applied(state, model)
    assert out["embed"].tolist() == out["head"].tolist() == [4.0, 2.0] and out["embed"].dtype == torch.bfloat16
    assert out["embed"] is out["head"]  # still one tensor, as save_pretrained expects of tied weights
    assert out["frozen"].tolist() == [3.0]
    assert model.embed.tolist() == [6.0, 0.0]  # training goes on with its own weights


def test_only_the_keeping_rank_holds_the_average():
    other = PolicyAverage(Tied(), beta=0.5, zero3=False, keeps=False)
    other.update(Tied())
    assert other.average == {}


def test_a_resumed_average_continues_from_the_checkpoint(tmp_path):
    model = Tied()
    saved = PolicyAverage(model, beta=0.5, zero3=False, keeps=True)
    with torch.no_grad():
        model.embed.copy_(torch.tensor([3.0, 6.0]))
    saved.update(model)
    saved.save(tmp_path / "step1", world_size=1)
    resumed = PolicyAverage(model, beta=0.5, zero3=False, keeps=True)  # would start from the weights now: [3, 6]
    resumed.load(tmp_path / "step1")
    assert resumed.average["embed"].tolist() == [2.0, 4.0]
    with pytest.raises(CheckpointError, match=rf"rl.actor.ema_beta: the checkpoint .*step2 has no {EMA_FILE}"):
        resumed.load(tmp_path / "step2")
