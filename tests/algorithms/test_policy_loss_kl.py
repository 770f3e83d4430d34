import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from divrl.algorithms import get_policy_loss, gspo_loss, kl_estimate, policy_loss


def test_policy_loss_by_hand(device):
    # ratios e^0.5 (clipped above for A>0), e^-0.5 (clipped below for A<0), 1
    old = torch.zeros(2, 3, device=device)
    lp = torch.tensor([[0.5, 0.0, 0.0], [-0.5, 0.1, 0.0]], device=device, requires_grad=True)
    adv = torch.tensor([1.0, -2.0], device=device)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], device=device)
    loss, metrics = policy_loss(lp, old, adv, mask)
    r = math.exp(0.1)
    per_token = [-1.2, -1.0, max(2 * math.exp(-0.5), 2 * 0.8), max(2 * r, 2 * min(r, 1.2)), 2.0]
    assert loss.item() == pytest.approx(sum(per_token) / 5, rel=1e-5)
    # token 0 (A>0, r>1.2) and token 3 (A<0, r<0.8) are clipped
    assert metrics["pg/clip_frac"] == pytest.approx(2 / 5)
    assert metrics["pg/approx_kl"] == pytest.approx(-(0.5 - 0.5 + 0.1) / 5, abs=1e-6)
    loss.backward()
    # clipped tokens get no gradient; the unclipped A<0 token gets -A*r/5
    assert lp.grad[0, 0].item() == 0.0
    assert lp.grad[1, 0].item() == 0.0
    assert lp.grad[1, 1].item() == pytest.approx(2 * r / 5, rel=1e-5)
    assert lp.grad[0, 2].item() == 0.0  # masked


def test_dual_clip_caps_negative_advantage_loss():
    lp = torch.tensor([[3.0]])
    old = torch.zeros(1, 1)
    loss, metrics = policy_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 1), dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0)
    assert metrics["pg/dual_clip_frac"] == 1.0
    plain, _ = policy_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 1))
    assert plain.item() == pytest.approx(math.exp(3.0), rel=1e-5)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 1), dual_clip=0.5)


def test_clip_higher_is_asymmetric():
    old = torch.zeros(1, 1)
    lp = torch.tensor([[math.log(1.25)]])
    grpo, _ = policy_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.2)
    dapo, _ = policy_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.28)
    assert grpo.item() == pytest.approx(-1.2)
    assert dapo.item() == pytest.approx(-1.25)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 10_000))
def test_token_and_sequence_advantages_agree(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(batch, length, generator=g)
    old = lp + 0.3 * torch.randn(batch, length, generator=g)
    adv = torch.randn(batch, generator=g)
    mask = (torch.rand(batch, length, generator=g) > 0.3).int()
    a, _ = policy_loss(lp, old, adv, mask)
    b, _ = policy_loss(lp, old, adv[:, None].expand(batch, length), mask)
    assert a.item() == pytest.approx(b.item(), rel=1e-6, abs=1e-7)


def test_registry_and_gspo():
    assert get_policy_loss("vanilla") is policy_loss
    with pytest.raises(ValueError, match="vanilla"):
        get_policy_loss("ppo2")
    lp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    loss, _ = gspo_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert lp.grad[0].tolist() == pytest.approx([-0.5, -0.5])  # seq-mean-token-mean


def test_kl_estimators_by_hand():
    lp = torch.tensor([[0.0, -1.0, -30.0]])
    ref = torch.tensor([[0.0, 0.0, 0.0]])
    assert kl_estimate(lp, ref, "k1")[0].tolist() == pytest.approx([0.0, -1.0, -30.0])
    assert kl_estimate(lp, ref, "k2")[0].tolist() == pytest.approx([0.0, 0.5, 450.0])
    k3 = kl_estimate(lp, ref, "k3")
    assert k3[0, 0].item() == 0.0
    assert k3[0, 1].item() == pytest.approx(math.e - 1 - 1, rel=1e-6)
    assert k3[0, 2].item() == 10.0  # log-ratio clamped to 20, value clamped to 10
    assert kl_estimate(ref, lp, "k3")[0, 2].item() == 10.0  # e^-20 + 20 - 1 = 19, clamped
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(lp, ref, "k4")


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 12), st.integers(0, 10_000))
def test_k3_is_unbiased_and_nonnegative(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    # moderate logits keep q/p below the value clamp (10), where k3 is exactly unbiased
    p = torch.softmax(0.7 * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(0.7 * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
    assume((q / p).max() < 12)  # k3 stays below its value clamp (10)
    k3 = kl_estimate(p.log().float()[None], q.log().float()[None], "k3")[0].double()
    assert (k3 >= 0).all()
    # E_{x ~ p}[k3] = KL(p || q)
    assert (p * k3).sum().item() == pytest.approx(
        (p * (p / q).log()).sum().item(), rel=1e-4, abs=1e-6
    )
