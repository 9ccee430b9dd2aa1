"""stages/common/offload.py: a frozen model's weights in host memory between uses, on the compute device for a
block. This machine has no second device: the copy to it is a CPU clone here (`device_copy` patched), distinct
memory standing for the GPU's, so that where each weight's data lives is visible before, in and after the block."""

from __future__ import annotations

import pytest
import torch

from stages.common import offload
from stages.common.offload import FrozenModel

pytestmark = pytest.mark.timeout(60)


class Tied(torch.nn.Module):
    """A linear layer whose weight the output layer shares (as tied embeddings do), and a buffer."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(2, 2)
        self.outer = torch.nn.Linear(2, 2, bias=False)
        self.outer.weight = self.inner.weight
        self.register_buffer("scale", torch.tensor([2.0, 3.0]))

    def forward(self, x):
        return self.outer(self.inner(x)) * self.scale


def model() -> Tied:
    m = Tied()
    with torch.no_grad():
        m.inner.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, -1.0]]))
        m.inner.bias.copy_(torch.tensor([0.5, 0.0]))
    return m


# W = [[1, 2], [0, -1]], b = [0.5, 0], x = [1, 1]: h = W x + b = [3.5, -1]; W h = [3.5 - 2, 1] = [1.5, 1]; times the
# buffer [2, 3]: [3, 3]
EXPECTED = [[3.0, 3.0]]


@pytest.fixture
def device_copies(monkeypatch) -> list[torch.Tensor]:
    """Every copy made for the device: clones, in memory of their own."""
    made: list[torch.Tensor] = []

    def clone(host: torch.Tensor, device: torch.device) -> torch.Tensor:
        made.append(host.clone())
        return made[-1]

    monkeypatch.setattr(offload, "device_copy", clone)
    return made


def data_pointers(m: torch.nn.Module) -> set[int]:
    return {t.data_ptr() for t in [*m.parameters(), *m.buffers()]}


def test_offloaded_weights_go_to_the_device_for_the_block_and_come_back_from_their_host_copies(device_copies):
    held = FrozenModel(model(), "cpu", offload=True)
    hosts = {host.data_ptr() for _, host in held.hosted}
    assert len(held.hosted) == 3 and data_pointers(held.module) == hosts  # the tied weight once, the bias, the buffer
    with held.use() as m:
        assert data_pointers(m) == {t.data_ptr() for t in device_copies} and len(device_copies) == 3
        assert m.outer.weight is m.inner.weight  # still one weight
        with torch.no_grad():
            assert m(torch.ones(1, 2)).tolist() == EXPECTED
    assert held.lent == 1 and data_pointers(held.module) == hosts  # the host copies themselves: nothing copied back
    with held.use() as m:
        assert len(device_copies) == 6  # a fresh copy for every block
    assert held.lent == 2 and held.weights_device == torch.device("cpu")


def test_the_weights_go_back_to_the_host_when_the_block_raises(device_copies):
    held = FrozenModel(model(), "cpu", offload=True)
    hosts = data_pointers(held.module)
    with pytest.raises(RuntimeError, match="scoring failed"), held.use():
        raise RuntimeError("scoring failed")
    assert data_pointers(held.module) == hosts


def test_a_model_not_offloaded_stays_on_its_device_and_is_lent_as_it_is(device_copies):
    held = FrozenModel(model(), "cpu", offload=False)
    with held.use() as m:
        assert m is held.module
        with torch.no_grad():
            assert m(torch.ones(1, 2)).tolist() == EXPECTED
    assert held.lent == 0 and held.hosted == [] and device_copies == []


def test_on_the_cpu_the_device_copy_is_the_host_tensor_itself():
    host = torch.ones(3)
    assert offload.device_copy(host, torch.device("cpu")) is host  # offload costs no copy on a CPU-only machine
