import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from divrl.algorithms import DIVERGENCES, divergence_generator, reference_divergence_loss

KINDS = [("forward_kl", None), ("reverse_kl", None), ("js", None)] + [
    ("alpha", a) for a in (0.2, 0.5, 0.8)
]


def categorical_pair(vocab: int, seed: int, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(scale * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(scale * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
    return p, q


def closed_form(kind: str, alpha: float | None, ref: torch.Tensor, pol: torch.Tensor) -> float:
    if kind == "forward_kl":
        return (ref * (ref / pol).log()).sum().item()
    if kind == "reverse_kl":
        return (pol * (pol / ref).log()).sum().item()
    if kind == "js":
        m = 0.5 * (ref + pol)
        js = 0.5 * (ref * (ref / m).log()).sum() + 0.5 * (pol * (pol / m).log()).sum()
        return 2 * js.item()
    return ((1 - (ref**alpha * pol ** (1 - alpha)).sum()) / (alpha * (1 - alpha))).item()


@pytest.mark.parametrize(("kind", "alpha"), KINDS)
@settings(max_examples=40, deadline=None)
@given(vocab=st.integers(2, 16), seed=st.integers(0, 100_000))
def test_reference_expectation_is_the_divergence(kind, alpha, vocab, seed):
    # E_{v ~ pi_ref}[f(pi_theta(v) / pi_ref(v))] computed exactly over the vocabulary.
    ref, pol = categorical_pair(vocab, seed, scale=0.8)  # ratios stay inside the clamps
    f = divergence_generator(kind, alpha)
    log_u = (pol.log() - ref.log()).float()
    assume(log_u.abs().max() < 2.5)  # inside the forward-KL value clamp (10)
    expectation = (ref * f(log_u).double()).sum().item()
    assert expectation == pytest.approx(closed_form(kind, alpha, ref, pol), rel=2e-4, abs=1e-6)


@pytest.mark.parametrize(("kind", "alpha"), KINDS)
@settings(max_examples=60, deadline=None)
@given(log_u=st.floats(-1e4, 30.0))
def test_generators_zero_at_one_nonnegative_and_finite(kind, alpha, log_u):
    f = divergence_generator(kind, alpha)
    assert f(torch.zeros(1)).item() == 0.0
    value = f(torch.tensor([log_u]))
    assert torch.isfinite(value).all()
    assert value.item() >= -1e-6
    bf16 = f(torch.tensor([log_u], dtype=torch.bfloat16))
    assert bf16.dtype == torch.float32 and torch.isfinite(bf16).all()


def test_alpha_limits_approach_the_kl_generators():
    log_u = torch.linspace(-3, 2.3, 54)  # forward KL unclamped here
    fwd = divergence_generator("forward_kl")(log_u)
    rev = divergence_generator("reverse_kl")(log_u)
    near_one = divergence_generator("alpha", 1 - 1e-3)(log_u)
    near_zero = divergence_generator("alpha", 1e-3)(log_u)
    assert torch.allclose(near_one, fwd, rtol=2e-2, atol=2e-3)
    assert torch.allclose(near_zero, rev, rtol=2e-2, atol=2e-3)


def test_forward_kl_gradient_is_weighted_sft():
    lp = torch.tensor([-0.5, -1.0, -2.0, -3.0], requires_grad=True)
    ref = torch.tensor([-1.0, -1.0, -1.5, -1.0])
    divergence_generator("forward_kl")(lp - ref).sum().backward()
    u = torch.exp(lp.detach() - ref)
    assert torch.allclose(lp.grad, u - 1, atol=1e-6)
    assert lp.grad[1].item() == 0.0  # u = 1: exactly zero at initialisation


def test_js_bounds_and_extremes():
    f = divergence_generator("js")
    assert f(torch.tensor([-1e4])).item() == pytest.approx(math.log(2), rel=1e-6)
    # the 2*JS divergence is bounded by 2 ln 2, reached for disjoint supports
    for seed in range(20):
        ref, pol = categorical_pair(6, seed, scale=4.0)
        log_u = (pol.log() - ref.log()).float()
        assert (ref * f(log_u).double()).sum().item() <= 2 * math.log(2) + 1e-6
    grad_input = torch.tensor([-1e4, 0.0, 5.0], requires_grad=True)
    f(grad_input).sum().backward()
    assert torch.isfinite(grad_input.grad).all()


def test_forward_kl_uses_the_authors_clamps():
    f = divergence_generator("forward_kl")
    assert f(torch.tensor([-1e4])).item() == 10.0  # e^-20 - 1 + 20 = 19 -> 10
    assert f(torch.tensor([3.0])).item() == 10.0  # e^3 - 1 - 3 = 16.1 -> 10
    assert f(torch.tensor([-2.0])).item() == pytest.approx(math.exp(-2) - 1 + 2)


def test_invalid_kind_and_alpha():
    with pytest.raises(ValueError, match=", ".join(sorted(DIVERGENCES))):
        divergence_generator("no_such_divergence")
    for bad in (None, 0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="0 < alpha < 1"):
            divergence_generator("alpha", bad)


def test_reference_divergence_loss_aggregates_masked_values(device):
    lp = torch.tensor([[-1.0, -2.0, -3.0]], device=device, requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0, 0.0]], device=device)
    mask = torch.tensor([[1, 1, 0]], device=device)
    loss, metrics = reference_divergence_loss(lp, ref, mask, "reverse_kl")
    u = math.exp(-1.0)
    assert loss.item() == pytest.approx((0.0 + (u * -1.0 - u + 1)) / 2, rel=1e-6)
    assert metrics["dph/u_mean"] == pytest.approx((1 + u) / 2, rel=1e-6)
    loss.backward()
    assert lp.grad[0, 2].item() == 0.0


def test_every_divergence_is_documented_and_offered_by_name():
    """The help texts list the registry; the docs' table is generated from it."""
    from pathlib import Path

    from divrl.integrations.trl_config import DivRLGRPOConfig
    from divrl.training.config import AlgorithmConfig

    docs = Path(__file__).resolve().parents[2] / "docs"
    config_help = AlgorithmConfig.__dataclass_fields__["divergence"].metadata["help"]
    trl_help = DivRLGRPOConfig.__dataclass_fields__["divergence"].metadata["help"]
    for name, spec in DIVERGENCES.items():
        assert f"{name} ({spec.summary})" in config_help and f"{name} (" in trl_help
    # the docs' table of divergences is generated from the registry (tests/test_registry_tables.py)
    assert "<!-- registry: divergences -->" in (docs / "algorithms.md").read_text()
