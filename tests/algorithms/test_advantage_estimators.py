"""The advantage-estimator registry: each estimator against a hand computation, one calling
convention for all, options validated, the config key and its migration."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from divrl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_OPTIONS,
    advantage_options,
    compute_advantages,
)
from divrl.training.config import load_config
from divrl.training.config_io import ConfigError

# two groups: g0 = [1, 0, 0, 0] (one correct of four), g1 = [1, 1, 0, 0]
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
GROUPS = ["a", "a", "a", "a", "b", "b", "b", "b"]


def run(name, rewards=REWARDS, groups=GROUPS, **options):
    adv, metrics = compute_advantages(name, rewards, groups, advantage_options(name, **options))
    return adv.tolist(), metrics


def test_grpo_and_its_scales_by_hand():
    s0 = math.sqrt(0.75 / 3)  # Bessel std of [1, 0, 0, 0]: sum sq dev 0.75 over 3
    s1 = math.sqrt(1.0 / 3)
    adv, _ = run("grpo", eps=0.0)
    assert adv == pytest.approx(
        [0.75 / s0, -0.25 / s0, -0.25 / s0, -0.25 / s0, 0.5 / s1, 0.5 / s1, -0.5 / s1, -0.5 / s1]
    )
    batch_std = math.sqrt(((REWARDS - 3 / 8) ** 2).sum().item() / 7)
    adv, _ = run("grpo_batch", eps=0.0)
    assert adv == pytest.approx(
        [x / batch_std for x in [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]]
    )
    adv, metrics = run("dr_grpo")
    assert adv == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])
    assert metrics["adv/zero_frac"] == 0.0


def test_rloo_by_hand():
    # r_i minus the mean of the other three: g0 row 0: 1 - 0; row 1: 0 - 1/3
    adv, _ = run("rloo")
    assert adv == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3])
    adv, _ = run("rloo", rewards=torch.tensor([0.7]), groups=[0])
    assert adv == pytest.approx([0.7])  # a group of one keeps its reward


def test_gpg_by_hand():
    # a third group of equal rewards gives no gradient: alpha = 12 / 8 (paper), 12 / 7 (verl:
    # the nonzero rewards are 1 + 2 + 4)
    rewards = torch.cat([REWARDS, torch.ones(4)])
    groups = GROUPS + ["c"] * 4
    centred = [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0]
    adv, metrics = run("gpg", rewards=rewards, groups=groups)
    assert metrics["adv/gpg_alpha"] == pytest.approx(1.5)
    assert adv == pytest.approx([1.5 * c for c in centred])
    adv, _ = run("gpg", rewards=rewards, groups=groups, count="nonzero_reward", f_norm=2.0)
    assert adv == pytest.approx([12 / 7 * c / 2 for c in centred])


def test_passk_analytic_by_hand():
    # k = 2. g0: n = 4, 3 wrong: R = 1 - C(3,2)/C(4,2) = 1/2, s = 1/2;
    #   correct: (1 - R)/s = 1; wrong: (1 - R - C(2,1)/C(3,1))/s = (1/2 - 2/3) * 2 = -1/3.
    # g1: 2 wrong: R = 1 - 1/6 = 5/6, s = sqrt(5/36); correct: (1/6)/s;
    #   wrong: (1/6 - C(1,1)/C(3,1))/s = (1/6 - 1/3)/s
    s1 = math.sqrt(5 / 36)
    adv, metrics = run("grpo_passk", k=2)
    assert adv == pytest.approx(
        [1.0, -1 / 3, -1 / 3, -1 / 3, 1 / 6 / s1, 1 / 6 / s1, -1 / 6 / s1, -1 / 6 / s1], rel=1e-5
    )
    assert metrics["adv/pass_at_k"] == pytest.approx((0.5 * 4 + 5 / 6 * 4) / 8)
    # k = 4: every 4-subset of g1 and of g0 holds a correct response: R = 1, no signal
    adv, _ = run("grpo_passk", k=4)
    assert adv == [0.0] * 8


def test_passk_with_k1_is_grpo_with_the_population_std():
    adv, _ = run("grpo_passk", k=1)
    p0, p1 = 0.25, 0.5
    s0, s1 = math.sqrt(p0 * (1 - p0)), math.sqrt(p1 * (1 - p1))
    expected = [0.75 / s0] + [-0.25 / s0] * 3 + [0.5 / s1] * 2 + [-0.5 / s1] * 2
    assert adv == pytest.approx(expected, rel=1e-5)


def test_passk_best_of_group_is_verls():
    rewards = torch.tensor([0.2, 0.9, 0.5, 1.0, 1.0, 0.0])
    adv, _ = run(
        "grpo_passk", rewards=rewards, groups=[0, 0, 0, 1, 1, 1], form="best_of_group", eps=0.0
    )
    std0 = torch.tensor([0.2, 0.9, 0.5]).std().item()
    std1 = torch.tensor([1.0, 1.0, 0.0]).std().item()
    # the best gets r_max - r_second over the std; a tie at the top gives 0
    assert adv == pytest.approx([0.0, 0.4 / std0, 0.0, 0.0 / std1, 0.0, 0.0])


def test_passk_refuses_small_groups_in_the_estimator_and_the_config():
    with pytest.raises(ValueError, match=r"needs groups of >= 8"):
        run("grpo_passk", k=8)
    with pytest.raises(ConfigError, match=r"raise rollout.n"):
        load_config(None, ["algorithm.advantage=grpo_passk", "algorithm.advantage_options.k=16"])


def test_one_calling_convention_and_options_matching_signatures():
    assert set(ADVANTAGE_ESTIMATORS) >= {
        "grpo",
        "grpo_batch",
        "dr_grpo",
        "rloo",
        "gpg",
        "grpo_passk",
    }
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params[:2]] == ["rewards", "group_ids"], name
        options = ADVANTAGE_OPTIONS[name]
        defaults = {p.name: p.default for p in params[2:]}
        assert defaults == {n: getattr(options, n) for n in options.names()}, name
        adv, metrics = compute_advantages(name, REWARDS, GROUPS)
        assert adv.shape == (8,) and adv.dtype == torch.float32 and not adv.requires_grad
        assert all(isinstance(v, float) for v in metrics.values())


def test_options_validated_naming_the_estimator():
    with pytest.raises(ValueError, match="advantage estimator 'rloo' has no option 'eps'"):
        advantage_options("rloo", eps=1e-6)
    with pytest.raises(ValueError, match="'gpg': count='x' is not one of"):
        advantage_options("gpg", count="x")
    with pytest.raises(ValueError, match=r"k=0 must be in \[1, inf\]"):
        advantage_options("grpo_passk", k=0)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        advantage_options("nope")


def test_config_key_and_the_earlier_adv_scale():
    algo = load_config(None, ["algorithm.advantage=rloo"]).algorithm
    assert algo.advantage == "rloo" and algo.advantage_options == {}
    for scale, name in (("group", "grpo"), ("batch", "grpo_batch"), ("none", "dr_grpo")):
        assert load_config(None, [f"algorithm.adv_scale={scale}"]).algorithm.advantage == name
    with pytest.raises(ConfigError, match="disagree"):
        load_config(None, ["algorithm.adv_scale=none", "algorithm.advantage=rloo"])
    with pytest.raises(ConfigError, match=r"algorithm.advantage_options: .*has no option .k."):
        load_config(None, ["algorithm.advantage_options.k=4"])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=2, max_size=8), st.integers(1, 2))
def test_centred_estimators_sum_to_zero_per_group(bits, k):
    rewards = torch.tensor(bits + bits[::-1], dtype=torch.float32)
    groups = [0] * len(bits) + [1] * len(bits)
    for name in ("grpo", "dr_grpo", "rloo", "gpg", "grpo_batch"):
        adv, _ = compute_advantages(name, rewards, groups)
        assert abs(float(adv[: len(bits)].sum())) < 1e-4, name
    # Pass@k: correct responses never get less than wrong ones of the same group
    adv, _ = compute_advantages("grpo_passk", rewards, groups, advantage_options("grpo_passk", k=k))
    right, wrong = (
        adv[: len(bits)][torch.tensor(bits) == 1],
        adv[: len(bits)][torch.tensor(bits) == 0],
    )
    if len(right) and len(wrong):
        assert float(right.min()) >= float(wrong.max()) - 1e-6
