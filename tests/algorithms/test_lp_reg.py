import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from divrl.algorithms import (
    FILTERED_LOG_PROB,
    lp_reg_loss,
    lp_reg_selection,
    minp_log_normalizer,
    policy_loss,
    proxy_log_prob,
    proxy_log_prob_rows,
)


def naive_proxy(logits: torch.Tensor, tokens: torch.Tensor, kappa: float, temperature: float):
    """The proxy as the paper states it: filter probabilities, renormalise, then temper."""
    p = torch.softmax(logits.double(), -1)
    keep = p >= kappa * p.max(-1, keepdim=True).values
    tempered = torch.softmax(logits.double() / temperature, -1)
    z = (tempered * keep).sum(-1)
    proxy = torch.where(keep, tempered / z.unsqueeze(-1), torch.zeros_like(tempered))
    tok = proxy.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return z, tok


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(2, 40),
    st.sampled_from([0.0, 0.02, 0.1, 0.5, 1.0]),
    st.sampled_from([1.0, 0.6, 1.3]),
    st.integers(0, 10_000),
)
def test_proxy_matches_naive_full_vocab_and_chunking(batch, length, vocab, kappa, temp, seed):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(batch, length, vocab, generator=g)
    tokens = torch.randint(0, vocab, (batch, length), generator=g)
    z, tok = naive_proxy(logits, tokens, kappa, temp)
    log_z = minp_log_normalizer(logits, kappa, temp)
    assert torch.allclose(log_z.double().exp(), z, rtol=1e-5)
    got = proxy_log_prob(logits, tokens, kappa, temp)
    kept = tok > 0
    assert torch.allclose(got[kept].double().exp(), tok[kept], rtol=1e-4)
    assert (got[~kept] == FILTERED_LOG_PROB).all()
    for chunk in (1, 2, 7):
        assert torch.equal(proxy_log_prob(logits, tokens, kappa, temp, chunk_size=chunk), got)
        assert torch.equal(minp_log_normalizer(logits, kappa, temp, chunk_size=chunk), log_z)
    rows = proxy_log_prob_rows(logits, kappa, temp)
    # atol: a kept token that holds all the mass has log-prob ~0, where the row-wise path's
    # rounding (e.g. -1.49e-08) is above allclose's default atol of 1e-8
    assert torch.allclose(rows.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), got, atol=1e-6)


def test_proxy_bf16_and_extreme_logits_stay_finite():
    logits = torch.tensor([[[0.0, -1e4, 30.0, 29.0]]], dtype=torch.bfloat16)
    tokens = torch.tensor([[3]])
    assert torch.isfinite(minp_log_normalizer(logits, 0.02)).all()
    assert torch.isfinite(proxy_log_prob(logits, tokens, 0.02)).all()
    with pytest.raises(ValueError, match="kappa"):
        proxy_log_prob(logits, tokens, 1.5)


def crafted_batch():
    # 2 responses x 5 tokens; response 0 has A = -1 (10... candidates), response 1 A = +1.
    lp = torch.tensor(
        [[-0.1, -5.0, -0.2, -4.0, -6.0], [-9.0, -0.1, -0.1, -0.1, -0.1]], requires_grad=True
    )
    proxy = torch.tensor(
        # token (0,1): proxy above lp -> regularised; (0,4): filtered -> selected not kept;
        # (0,3): proxy below lp -> selected, not kept
        [[-0.1, -3.0, -0.2, -4.5, FILTERED_LOG_PROB], [-1.0, -0.1, -0.1, -0.1, -0.1]]
    )
    adv = torch.tensor([-1.0, 1.0])
    mask = torch.ones(2, 5)
    return lp, proxy, adv, mask


def test_lp_reg_regularises_exactly_the_hand_picked_tokens():
    lp, proxy, adv, mask = crafted_batch()
    # 5 negative tokens, rho 0.6 -> k = 3 lowest: (0,4) -6, (0,1) -5, (0,3) -4.
    # (0,4) filtered, (0,3) above its proxy: only (0,1) is regularised.
    loss, metrics = lp_reg_loss(lp, lp.detach(), proxy, adv, mask, rho=0.6)
    assert metrics["lp_reg/num_negative"] == 5
    assert metrics["lp_reg/num_selected"] == 3
    assert metrics["lp_reg/num_regularized"] == 1
    assert metrics["lp_reg/prob_threshold"] == pytest.approx(math.exp(-4.0), rel=1e-6)
    d = -3.0 - -5.0
    penalty = math.exp(d) - d - 1
    # on-policy r = 1: every token's term is -A, plus the penalty on the regularised one
    expected = (5 * 1.0 + 5 * -1.0 + penalty) / 10
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # gradient on the regularised token: (-A*r)' + (1 - e^D) = 1 + 1 - e^2, over 10 tokens
    assert lp.grad[0, 1].item() == pytest.approx((1 + 1 - math.exp(d)) / 10, rel=1e-5)
    assert lp.grad[0, 3].item() == pytest.approx(1 / 10, rel=1e-5)


def test_lp_reg_selection_names_the_tokens_the_loss_counts():
    lp, proxy, adv, mask = crafted_batch()
    chosen = lp_reg_selection(lp, proxy, adv, mask, rho=0.6)
    # candidates: the 5 tokens of the A < 0 response; selected: its 3 lowest; regularised:
    # (0,1) alone ((0,4) is filtered, (0,3) lies above its proxy)
    assert chosen.candidates.tolist() == [[True] * 5, [False] * 5]
    assert chosen.selected.nonzero().tolist() == [[0, 1], [0, 3], [0, 4]]
    assert chosen.regularized.nonzero().tolist() == [[0, 1]]
    assert chosen.threshold == pytest.approx(math.exp(-4.0), rel=1e-6)
    # a selection made over a larger population is intersected with this batch's candidates
    given = torch.zeros(2, 5, dtype=torch.bool)
    given[0, 1] = given[1, 0] = True
    scoped = lp_reg_selection(lp, proxy, adv, mask, selected=given)
    assert scoped.selected.nonzero().tolist() == [[0, 1]]
    assert scoped.threshold == pytest.approx(math.exp(-5.0), rel=1e-6)


def test_lp_reg_reduces_to_policy_loss_when_nothing_is_selected():
    lp, proxy, adv, mask = crafted_batch()
    old = lp.detach() + 0.3 * torch.randn(2, 5, generator=torch.Generator().manual_seed(0))
    # rho * N_neg < 2: the authors' code skips the regulariser (min_k = 2)
    loss, metrics = lp_reg_loss(lp, old, proxy, adv, mask, rho=0.01)
    ref, _ = policy_loss(lp, old, adv, mask, clip_low=1.0, clip_high=9.0)
    assert metrics["lp_reg/num_selected"] == 0
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    # rho = 0 selects nothing whatever min_k is
    loss0, _ = lp_reg_loss(lp, old, proxy, adv, mask, rho=0.0, min_k=1)
    assert loss0.item() == pytest.approx(ref.item(), rel=1e-6)
    # the paper's text (min_k = 1) regularises the single lowest token when it passes the filter
    _, m1 = lp_reg_loss(lp, lp.detach(), proxy.clone().fill_(0.0), adv, mask, rho=0.01, min_k=1)
    assert m1["lp_reg/num_regularized"] == 1


def test_lp_reg_full_vocab_option():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 6, requires_grad=True)
    tokens = torch.randint(0, 6, (2, 5))
    policy_rows = torch.log_softmax(logits, -1)
    lp = policy_rows.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    proxy_rows = proxy_log_prob_rows(logits.detach(), 0.05)
    proxy = proxy_log_prob(logits.detach(), tokens, 0.05)
    adv = torch.tensor([-1.0, -1.0])
    loss, metrics = lp_reg_loss(
        lp,
        lp.detach(),
        proxy,
        adv,
        torch.ones(2, 5),
        rho=0.5,
        full_vocab=True,
        proxy_rows=proxy_rows,
        policy_rows=policy_rows,
    )
    assert metrics["lp_reg/num_regularized"] >= 1
    loss.backward()
    assert torch.isfinite(logits.grad).all()
    with pytest.raises(ValueError, match="proxy_rows"):
        lp_reg_loss(lp, lp.detach(), proxy, adv, torch.ones(2, 5), full_vocab=True)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([torch.float32, torch.bfloat16]))
def test_lp_reg_finite_for_extreme_inputs(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    lp = (
        torch.where(
            torch.rand(3, 8, generator=g) < 0.3,
            torch.full((3, 8), -1e4),
            -torch.rand(3, 8, generator=g),
        )
        .to(dtype)
        .requires_grad_()
    )
    proxy = torch.where(
        torch.rand(3, 8, generator=g) < 0.3,
        torch.full((3, 8), FILTERED_LOG_PROB),
        -3 * torch.rand(3, 8, generator=g),
    )
    adv = torch.randn(3, generator=g)
    loss, metrics = lp_reg_loss(
        lp, lp.detach().float() - 1.0, proxy, adv, torch.ones(3, 8), rho=0.5
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 12),
    st.sampled_from([0.01, 0.1, 0.3, 0.9]),
    st.integers(1, 3),
    st.integers(0, 10_000),
)
def test_lp_reg_selection_properties(batch, length, rho, min_k, seed):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(batch, length, generator=g) * 5
    proxy = lp + torch.randn(batch, length, generator=g)
    adv = torch.randn(batch, generator=g)
    mask = (torch.rand(batch, length, generator=g) > 0.2).float()
    chosen = lp_reg_selection(lp, proxy, adv, mask, rho=rho, min_k=min_k)
    cand, sel, reg = chosen.candidates, chosen.selected, chosen.regularized
    assert torch.equal(cand, (mask > 0) & (adv < 0).unsqueeze(1))
    n = int(cand.sum())
    k = max(1, math.floor(rho * n))
    assert int(sel.sum()) == (k if n and k >= min_k else 0)
    assert not (sel & ~cand).any() and not (reg & ~sel).any()
    assert torch.equal(reg, sel & (lp < proxy))
    if sel.any() and (cand & ~sel).any():  # the selected are the lowest candidates
        assert lp[sel].max() <= lp[cand & ~sel].min()
        assert chosen.threshold == pytest.approx(math.exp(float(lp[sel].max())), rel=1e-6)
