import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from divrl.algorithms import aggregate, group_advantages

LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 10) / 4),
        ("micro-batch-token-mean", (1 + 2 + 3 + 10) / 4),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 10 / 1) / 2),
        ("seq-mean-token-sum", ((1 + 2 + 3) + 10) / 2),
        ("seq-mean-token-sum-norm", (1 + 2 + 3 + 10) / (2 * 4)),
    ],
)
def test_aggregate_modes_by_hand(mode, expected, device):
    got = aggregate(LOSS.to(device), MASK.to(device), mode)
    assert got.item() == pytest.approx(expected)


def test_aggregate_horizon_and_bf16():
    got = aggregate(LOSS.bfloat16(), MASK, "seq-mean-token-sum-norm", horizon=8)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(16 / 16)


def test_aggregate_empty_mask_is_zero_not_nan():
    for mode in [
        "token-mean",
        "micro-batch-token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    ]:
        assert aggregate(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def test_seq_mean_token_mean_skips_empty_rows():
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    assert aggregate(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(LOSS, MASK, "token-median")


def test_group_advantages_by_hand(device):
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5], device=device)
    ids = torch.tensor([7, 3, 7, 3, 7, 9], device=device)  # groups interleaved, one singleton
    adv = group_advantages(rewards, ids)
    # group 7: rewards 1, 0, 1 -> mean 2/3, std (Bessel) sqrt(1/3)
    std7 = math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    assert adv[0].item() == pytest.approx((1 - 2 / 3) / (std7 + 1e-6), rel=1e-5)
    assert adv[2].item() == pytest.approx((0 - 2 / 3) / (std7 + 1e-6), rel=1e-5)
    # group 3: rewards 0, 1 -> mean 0.5, std sqrt(0.5)
    assert adv[1].item() == pytest.approx(-0.5 / (math.sqrt(0.5) + 1e-6), rel=1e-5)
    # singleton: mean 0, std 1
    assert adv[5].item() == pytest.approx(0.5 / (1 + 1e-6), rel=1e-6)


def test_group_advantages_hashable_ids_and_scales():
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    ids = ["a", "a", ("b", 1), ("b", 1)]
    assert group_advantages(rewards, ids, scale="none").tolist() == [0.5, -0.5, 1.0, -1.0]
    batch = group_advantages(rewards, ids, scale="batch")
    std = rewards.std().item()
    assert batch.tolist() == pytest.approx([0.5 / std, -0.5 / std, 1 / std, -1 / std], rel=1e-5)
    equal = group_advantages(torch.ones(4), ids)
    assert equal.abs().max().item() == 0.0  # equal rewards carry no signal


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="group, batch, none"):
        group_advantages(torch.ones(2), [0, 0], scale="prompt")
    with pytest.raises(ValueError, match="group ids"):
        group_advantages(torch.ones(3), [0, 0])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.floats(-5, 5)), min_size=1, max_size=30),
)
def test_group_advantages_zero_mean_per_group(pairs):
    ids = torch.tensor([g for g, _ in pairs])
    rewards = torch.tensor([r for _, r in pairs]).bfloat16()
    adv = group_advantages(rewards, ids)
    assert torch.isfinite(adv).all()
    for g in ids.unique():
        sel = ids == g
        if sel.sum() > 1:
            assert adv[sel].sum().item() == pytest.approx(0.0, abs=1e-3)
