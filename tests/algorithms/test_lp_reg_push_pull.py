"""Lp-Reg's regime diagnostics: Z, |A| and the net push on the tokens it regularises."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from divrl.algorithms import lp_reg_loss, lp_reg_regime_metrics, lp_reg_selection


def pytest_approx(value, rel=1e-5, abs=1e-6):
    return pytest.approx(value, rel=rel, abs=abs)


def test_on_policy_hand_case_one_token_pulled_up_one_pushed_down():
    # row 0: two tokens with p = 0.1 and 0.2 at positions whose min-p kept mass is Z = 0.5
    # and 0.8; row 1: a correct answer (A > 0, never a candidate). beta = 1, A = -0.5:
    # net = -0.5 + (1/0.5 - 1) = +0.5 (up) and -0.5 + (1/0.8 - 1) = -0.25 (down).
    lp = torch.log(torch.tensor([[0.1, 0.2], [0.9, 0.9]]))
    log_z = torch.log(torch.tensor([[0.5, 0.8], [1.0, 1.0]]))
    proxy = lp - log_z
    adv = torch.tensor([-0.5, 0.5])
    mask = torch.ones(2, 2)
    _, m = lp_reg_loss(lp, lp, proxy, adv, mask, rho=1.0, min_k=1, beta=1.0, log_normalizer=log_z)
    assert m["lp_reg/num_regularized"] == 2
    assert m["lp_reg/reg_z_mean"] == pytest_approx(0.65)
    assert m["lp_reg/reg_z_q50"] == pytest_approx(0.65)
    assert m["lp_reg/reg_z_q10"] == pytest_approx(0.5 + 0.1 * 0.3)
    assert m["lp_reg/reg_abs_adv_mean"] == pytest_approx(0.5)
    assert m["lp_reg/net_push_mean"] == pytest_approx((0.5 - 0.25) / 2)
    assert m["lp_reg/net_push_q90"] == pytest_approx(-0.25 + 0.9 * 0.75)
    assert m["lp_reg/net_up_share"] == 0.5
    assert m["lp_reg/num_net_up"] == 1
    # without log_normalizer Z comes from old - proxy (the same forward): same values
    _, m2 = lp_reg_loss(lp, lp, proxy, adv, mask, rho=1.0, min_k=1, beta=1.0)
    assert m2["lp_reg/reg_z_mean"] == pytest_approx(0.65)
    # beta = 4 pulls both up: -0.5 + 4 * 0.25 = +0.5
    _, m4 = lp_reg_loss(lp, lp, proxy, adv, mask, rho=1.0, min_k=1, beta=4.0)
    assert m4["lp_reg/net_up_share"] == 1.0


def test_nothing_regularised_logs_zeros():
    lp = torch.log(torch.tensor([[0.5, 0.5]]))
    _, m = lp_reg_loss(lp, lp, lp, torch.tensor([-1.0]), torch.ones(1, 2), rho=1.0, min_k=1)
    assert m["lp_reg/num_regularized"] == 0  # Z = 1: nothing below its proxy
    assert m["lp_reg/net_up_share"] == 0.0 and m["lp_reg/reg_z_mean"] == 0.0


def test_off_policy_pull_grows_as_exp_d_and_the_k3_clamp_switches_it_off():
    # proxy frozen at log 0.4; lp fell to log 0.1: D = log 4, pull = beta * 3; r = 0.1 / 0.2.
    # A second token fell so far (D = log 400) that k3 > 10: the clamp zeroes its pull.
    lp = torch.log(torch.tensor([[0.1, 0.001]]))
    old = torch.log(torch.tensor([[0.2, 0.2]]))
    proxy = torch.log(torch.tensor([[0.4, 0.4]]))
    adv = torch.tensor([-2.0])
    reg = torch.tensor([[True, True]])
    m = lp_reg_regime_metrics(lp, old, proxy, adv, reg, beta=0.5)
    net = [-2.0 * 0.5 + 0.5 * 3.0, -2.0 * 0.005]
    assert m["lp_reg/net_push_mean"] == pytest_approx(sum(net) / 2)
    assert m["lp_reg/net_up_share"] == 0.5
    assert m["lp_reg/reg_z_mean"] == pytest_approx(0.5)  # exp(old - proxy) = 0.2 / 0.4


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.5, 1.0, 4.0]))
def test_net_push_is_minus_the_losss_gradient_on_each_regularised_token(seed, beta):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log(torch.rand(3, 5, generator=g) * 0.9 + 0.05)
    old = lp + 0.3 * torch.randn(3, 5, generator=g)
    proxy = old - torch.log(torch.rand(3, 5, generator=g) * 0.9 + 0.1)  # Z in (0.1, 1)
    adv = torch.randn(3, generator=g)
    mask = torch.ones(3, 5)
    x = lp.clone().requires_grad_(True)
    loss, m = lp_reg_loss(x, old, proxy, adv, mask, rho=1.0, min_k=1, beta=beta, agg="token-mean")
    loss.backward()
    reg = lp_reg_selection(lp, proxy, adv, mask, 1.0, 1).regularized
    if not reg.any():
        return
    net = -x.grad[reg] * mask.sum()  # token-mean: every token's weight is 1 / 15
    assert m["lp_reg/net_up_share"] == int((net > 0).sum()) / net.numel()
    assert m["lp_reg/net_push_mean"] == pytest_approx(float(net.mean()), rel=1e-4, abs=1e-5)
    assert m["lp_reg/num_net_up"] == float((net > 0).sum())


def test_quantiles_follow_torch_quantile_on_many_tokens():
    z = torch.linspace(0.2, 0.9, 11)
    lp = torch.full((1, 11), math.log(0.05))
    m = lp_reg_regime_metrics(
        lp,
        lp,
        lp - torch.log(z)[None],
        torch.tensor([-1.0]),
        torch.ones(1, 11, dtype=torch.bool),
        1.0,
    )
    assert m["lp_reg/reg_z_q10"] == pytest_approx(0.27)
    assert m["lp_reg/reg_z_q90"] == pytest_approx(0.83)
