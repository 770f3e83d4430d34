"""Every loss stays finite (value and gradient) for finite extreme inputs, in fp32 and bf16."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from divrl.algorithms import (
    DIVERGENCES,
    POLICY_LOSSES,
    divergence_generator,
    entropy_from_logits,
    kl_estimate,
    proxy_log_prob,
    reference_divergence_loss,
)

EXTREME = st.sampled_from([-1e4, -50.0, -20.0, -1.0, -1e-6, 0.0])


def extreme_tensor(draw_values, dtype):
    return torch.tensor(draw_values, dtype=torch.float32).reshape(2, 3).to(dtype)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
@settings(max_examples=25, deadline=None)
@given(
    st.lists(EXTREME, min_size=6, max_size=6),
    st.lists(EXTREME, min_size=6, max_size=6),
    st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_policy_losses_finite(name, lp_values, old_values, dtype):
    lp = extreme_tensor(lp_values, dtype).requires_grad_()
    old = extreme_tensor(old_values, dtype)
    adv = torch.tensor([1.5, -2.0], dtype=dtype)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    kwargs = {}
    if name == "lp_reg":
        kwargs = {"proxy_log_prob": torch.zeros(2, 3), "rho": 1.0}
    if name == "high_entropy":
        kwargs = {"entropy": torch.rand(2, 3)}
    fn = POLICY_LOSSES[name]
    if name == "lp_reg":
        loss, metrics = fn(lp, old, kwargs.pop("proxy_log_prob"), adv, mask, **kwargs)
    else:
        loss, metrics = fn(lp, old, adv, mask, **kwargs)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert torch.isfinite(lp.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("kind", sorted(DIVERGENCES))  # every registered one
@settings(max_examples=25, deadline=None)
@given(st.lists(EXTREME, min_size=6, max_size=6), st.lists(EXTREME, min_size=6, max_size=6))
def test_divergence_and_kl_finite(kind, lp_values, ref_values):
    for dtype in (torch.float32, torch.bfloat16):
        lp = extreme_tensor(lp_values, dtype).requires_grad_()
        ref = extreme_tensor(ref_values, dtype)
        loss, _ = reference_divergence_loss(lp, ref, torch.ones(2, 3), kind, alpha=0.5)
        loss = loss + sum(kl_estimate(lp, ref, e).sum() for e in ("k1", "k2", "k3"))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert torch.isfinite(divergence_generator(kind, 0.5)(torch.tensor([1e4]))).all()


def test_underflowing_probabilities_in_logits():
    logits = torch.tensor([[[0.0, -1e4, -1e4, 80.0]]], requires_grad=True)
    tokens = torch.tensor([[1]])
    h = entropy_from_logits(logits)
    h.sum().backward()
    assert torch.isfinite(h).all() and torch.isfinite(logits.grad).all()
    assert torch.isfinite(proxy_log_prob(logits, tokens, 0.02)).all()
