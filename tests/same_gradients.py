"""Two ways of computing one loss (padded rows against packed or shared ones) give the same loss and
the same gradients on identical weights."""

from __future__ import annotations

import pytest


def loss_and_grads(make_model, loss_fn, way) -> tuple[float, list]:
    model = make_model()
    loss = loss_fn(model, way)
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_same_loss_and_grads(make_model, loss_fn, reference, other, tol: float = 1e-5) -> None:
    """`loss_fn(model, way)` computed `reference`'s way and `other`'s on fresh models of `make_model`."""
    ref_loss, ref_grads = loss_and_grads(make_model, loss_fn, reference)
    loss, grads = loss_and_grads(make_model, loss_fn, other)
    assert loss == pytest.approx(ref_loss, abs=tol)
    assert len(grads) == len(ref_grads) > 0
    assert max(float((a - b).abs().max()) for a, b in zip(grads, ref_grads)) < tol
    assert any(float(g.abs().max()) > 1e-4 for g in ref_grads)  # a gradient that could differ
