import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from divrl.algorithms import (
    clip_cov_loss,
    entropy_bonus,
    entropy_from_logits,
    high_entropy_mask,
    high_entropy_policy_loss,
    kl_cov_loss,
    policy_loss,
    token_log_probs,
)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(2, 30), st.integers(0, 10_000))
def test_entropy_and_log_probs_match_naive_and_chunking(batch, length, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    logits = 4 * torch.randn(batch, length, vocab, generator=g)
    tokens = torch.randint(0, vocab, (batch, length), generator=g)
    p = torch.softmax(logits.double(), -1)
    naive_h = -(p * p.log()).sum(-1)
    assert torch.allclose(entropy_from_logits(logits).double(), naive_h, atol=1e-5)
    naive_lp = torch.log_softmax(logits.double() / 0.7, -1).gather(-1, tokens[..., None])[..., 0]
    assert torch.allclose(token_log_probs(logits, tokens, 0.7).double(), naive_lp, atol=1e-5)
    for chunk in (1, 3):
        assert torch.allclose(
            entropy_from_logits(logits, chunk_size=chunk), entropy_from_logits(logits)
        )


def test_chunked_gradients_equal_unchunked():
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 11, dtype=torch.bfloat16, requires_grad=True)
    tokens = torch.randint(0, 11, (2, 7))
    grads = []
    for chunk in (None, 3):
        logits.grad = None
        (
            token_log_probs(logits, tokens, chunk_size=chunk).sum()
            + entropy_from_logits(logits, chunk_size=chunk).sum()
        ).backward()
        grads.append(logits.grad.float().clone())
    assert torch.allclose(grads[0], grads[1])


def test_entropy_of_uniform_and_bonus_sign():
    h = entropy_from_logits(torch.zeros(1, 2, 8))
    assert torch.allclose(h, torch.full((1, 2), math.log(8)))
    loss, metrics = entropy_bonus(h, torch.ones(1, 2), coef=0.5)
    assert loss.item() == pytest.approx(-0.5 * math.log(8))
    assert metrics["entropy/mean"] == pytest.approx(math.log(8))


def test_high_entropy_mask_keeps_top_fraction_of_valid_tokens():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 5.0], [0.8, 0.2, 0.3, 0.7]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # the 5.0 is padding
    keep = high_entropy_mask(entropy, mask, 0.3)  # 7 valid -> ceil(2.1) = 3
    assert keep.tolist() == [[False, True, False, False], [True, False, False, True]]
    lp = torch.zeros(2, 4, requires_grad=True)
    loss, metrics = high_entropy_policy_loss(
        lp, lp.detach(), torch.tensor([1.0, -1.0]), mask, entropy=entropy, top_fraction=0.3
    )
    assert loss.item() == pytest.approx((-1 + 1 + 1) / 3)
    assert metrics["entropy/kept_tokens"] == 3
    loss.backward()
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[0, 1].item() != 0.0


def test_kl_cov_penalises_top_covariance_tokens_without_clipping():
    lp = torch.tensor([[-0.1, -3.0], [-0.2, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -3.0], [-0.2, -2.0]])
    adv = torch.tensor([2.0, -1.0])
    # cov = (A - 0.5)(lp - mean lp): largest for token (0,0) (1.5 * 1.225)
    loss, metrics = kl_cov_loss(lp, old, adv, torch.ones(2, 2), kl_cov_ratio=0.25, ppo_kl_coef=1.0)
    r = math.exp(0.9)  # not clipped at all
    assert loss.item() == pytest.approx((-2 * r + 0.9 - 2 + 1 + 1) / 4, rel=1e-6)
    assert metrics["kl_cov/num_penalized"] == 1


def test_kl_cov_on_policy_has_the_plain_surrogates_gradient():
    # one optimiser step per batch: lp == old, so |lp - old| is 0 and so is its gradient;
    # KL-Cov then trains exactly as the unclipped surrogate -A r (the sparks world's on-policy
    # KL-Cov runs repeated GRPO's numbers to the last digit)
    torch.manual_seed(0)
    base = torch.randn(3, 5)
    adv = torch.tensor([1.5, -0.5, -1.0])
    grads = []
    for ratio in (0.5, 0.0):  # 7 tokens penalised / none
        lp = base.clone().requires_grad_(True)
        loss, metrics = kl_cov_loss(
            lp, lp.detach(), adv, torch.ones(3, 5), kl_cov_ratio=ratio, ppo_kl_coef=1.0
        )
        loss.backward()
        grads.append(lp.grad)
        assert metrics["kl_cov/num_penalized"] == (7 if ratio else 0)
    assert torch.equal(grads[0], grads[1])
    # off-policy (a second optimiser step on the batch) the penalty acts
    lp = (base + 0.1).requires_grad_(True)
    kl_cov_loss(lp, base, adv, torch.ones(3, 5), kl_cov_ratio=0.5)[0].backward()
    plain = (base + 0.1).requires_grad_(True)
    kl_cov_loss(plain, base, adv, torch.ones(3, 5), kl_cov_ratio=0.0)[0].backward()
    assert not torch.equal(lp.grad, plain.grad)


def test_clip_cov_cuts_only_eligible_tokens_and_is_reproducible():
    lp = torch.tensor([[0.0, -4.0, 0.0, -4.0]], requires_grad=True)
    adv = torch.tensor([[3.0, 3.0, -3.0, -3.0]])
    mask = torch.ones(1, 4)
    # cov: A - 0 times lp - (-2): token 0: 3*2 = 6 (> ub), token 1: 3*-2 = -6, token 2: -6,
    # token 3: -3*-2 = 6. Shift lp so one token lands in (1, 5).
    lp2 = torch.tensor([[-1.0, -4.0, -2.5, -2.5]], requires_grad=True)  # mean -2.5
    loss, metrics = clip_cov_loss(lp2, lp2.detach(), adv, mask, clip_ratio=0.5)
    # cov: 3*1.5 = 4.5 (eligible), 3*-1.5, -3*0, -3*0 -> one eligible, floor(0.5*4) = 2 cut max
    assert metrics["clip_cov/num_eligible"] == 1 and metrics["clip_cov/num_cut"] == 1
    loss.backward()
    assert lp2.grad[0, 0].item() == 0.0 and lp2.grad[0, 1].item() != 0.0
    plain, _ = policy_loss(lp, lp.detach(), adv, mask)
    same, m2 = clip_cov_loss(lp, lp.detach(), adv, mask, clip_ratio=0.5, clip_cov_lb=100.0)
    assert m2["clip_cov/num_cut"] == 0 and same.item() == pytest.approx(plain.item())
    a = clip_cov_loss(lp2, lp2.detach(), adv, mask, generator=torch.Generator().manual_seed(1))[0]
    b = clip_cov_loss(lp2, lp2.detach(), adv, mask, generator=torch.Generator().manual_seed(1))[0]
    assert a.item() == b.item()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(2, 30), st.integers(0, 10_000))
def test_logit_stats_one_pass_equals_the_separate_functions(batch, length, vocab, seed):
    from divrl.algorithms import logit_stats, minp_log_normalizer, proxy_log_prob

    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(batch, length, vocab, generator=g)).requires_grad_()
    tokens = torch.randint(0, vocab, (batch, length), generator=g)
    for chunk in (None, 2):
        stats = logit_stats(logits, tokens, 0.8, chunk_size=chunk, minp_kappa=0.1)
        assert torch.allclose(stats.log_prob, token_log_probs(logits, tokens, 0.8), atol=1e-5)
        assert torch.allclose(
            stats.entropy, entropy_from_logits(logits, temperature=0.8), atol=1e-5
        )
        assert torch.allclose(
            stats.proxy_log_prob, proxy_log_prob(logits, tokens, 0.1, 0.8), atol=1e-5
        )
        assert torch.allclose(
            stats.log_normalizer, minp_log_normalizer(logits, 0.1, 0.8), atol=1e-5
        )
        assert not stats.proxy_log_prob.requires_grad
    # gradients of log-prob + entropy agree with the separate functions
    logits.grad = None
    (
        logit_stats(logits, tokens, chunk_size=2).log_prob.sum()
        + logit_stats(logits, tokens, chunk_size=4).entropy.sum()
    ).backward()
    fused = logits.grad.clone()
    logits.grad = None
    (token_log_probs(logits, tokens).sum() + entropy_from_logits(logits).sum()).backward()
    assert torch.allclose(fused, logits.grad, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 9),
    st.integers(2, 40),
    st.sampled_from([1.0, 0.7, 1.5]),
    st.sampled_from([None, 1, 4]),
    st.integers(0, 10_000),
)
def test_analytic_backward_matches_autograd(rows, vocab, temp, chunk, seed):
    from divrl.algorithms import logit_stats

    g = torch.Generator().manual_seed(seed)
    base = 3 * torch.randn(rows, vocab, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, vocab, (rows,), generator=g)
    up_lp = torch.randn(rows, generator=g, dtype=torch.float64)
    up_h = torch.randn(rows, generator=g, dtype=torch.float64)
    # reference: plain autograd in float64
    ref_in = base.clone().requires_grad_()
    logp = torch.log_softmax(ref_in / temp, -1)
    ref_lp = logp.gather(-1, tokens[:, None])[:, 0]
    ref_h = -(logp.exp() * logp).sum(-1)
    (ref_lp * up_lp + ref_h * up_h).sum().backward()
    ours_in = base.float().requires_grad_()
    stats = logit_stats(ours_in, tokens, temp, chunk_size=chunk)
    (stats.log_prob * up_lp.float() + stats.entropy * up_h.float()).sum().backward()
    assert torch.allclose(stats.log_prob.double(), ref_lp, atol=1e-5)
    assert torch.allclose(stats.entropy.double(), ref_h, atol=1e-4)
    assert torch.allclose(ours_in.grad.double(), ref_in.grad, atol=1e-4)
    # log-prob only (no entropy gradient requested)
    only = base.float().requires_grad_()
    logit_stats(only, tokens, temp, chunk_size=chunk, with_entropy=False).log_prob.sum().backward()
    ref_in.grad = None
    torch.log_softmax(ref_in / temp, -1).gather(-1, tokens[:, None]).sum().backward()
    assert torch.allclose(only.grad.double(), ref_in.grad, atol=1e-5)
