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


def test_unscorable_responses_are_out_of_the_baseline_by_hand():
    nan = float("nan")
    # group 0: 1, unscorable, 0, 0 -> baseline over 1, 0, 0: mean 1/3, std sqrt(1/3)
    # group 1: 1, unscorable -> one scorable response, no baseline: advantage 0
    rewards = torch.tensor([1.0, nan, 0.0, 0.0, 1.0, nan])
    ids = [0, 0, 0, 0, 1, 1]
    adv = group_advantages(rewards, ids)
    s = math.sqrt(1 / 3) + 1e-6
    assert adv.tolist() == pytest.approx([(2 / 3) / s, 0.0, -(1 / 3) / s, -(1 / 3) / s, 0, 0])
    # the same through the mask: the unscorable rows' rewards (here 0) are not read
    mask = ~torch.isnan(rewards)
    masked = group_advantages(torch.nan_to_num(rewards, nan=0.0), ids, scorable=mask)
    assert masked.tolist() == adv.tolist()
    # scored 0 instead, the unscorable response would get -0.25 / 0.5 and lower the baseline
    as_zero = group_advantages(torch.nan_to_num(rewards), ids)
    assert as_zero[:2].tolist() == pytest.approx([0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)])
    # batch scale: the std of the scorable rewards 1, 0, 0, 1 only
    batch = group_advantages(rewards, ids, scale="batch")
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item() + 1e-6
    assert batch.tolist() == pytest.approx([(2 / 3) / std, 0, -(1 / 3) / std, -(1 / 3) / std, 0, 0])
    with pytest.raises(ValueError, match="scorable flags"):
        group_advantages(rewards, ids, scorable=mask[:3])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.floats(-5, 5), st.booleans()), min_size=1, max_size=24
    ),
)
def test_unscorable_rows_change_nothing_for_the_others(rows):
    """Property: with unscorable rows, every scorable row's advantage equals the one it gets
    in the batch without them (where its group keeps two or more), and theirs is 0."""
    ids = [g for g, _, _ in rows]
    rewards = torch.tensor([r if ok else float("nan") for _, r, ok in rows])
    adv = group_advantages(rewards, ids)
    kept = [i for i, (_, _, ok) in enumerate(rows) if ok]
    assert all(adv[i].item() == 0.0 for i in range(len(rows)) if i not in kept)
    if not kept:
        return
    alone = group_advantages(rewards[kept], [ids[i] for i in kept])
    kept_ids = [ids[i] for i in kept]
    for j, i in enumerate(kept):
        if kept_ids.count(ids[i]) > 1:  # (alone, a group of one has verl's rule: A = r)
            assert adv[i].item() == pytest.approx(alone[j].item(), abs=1e-4)
        elif ids.count(ids[i]) > 1:  # the only scorable one of several: no baseline
            assert adv[i].item() == 0.0
