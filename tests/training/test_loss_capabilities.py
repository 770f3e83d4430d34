"""A loss registered in a test file gets from `divrl train` what its options declare
(NEEDS_PROXY: the min-p proxy from the same logits), without being named lp_reg."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl.algorithms import FILTERED_LOG_PROB, POLICY_LOSS_OPTIONS, POLICY_LOSSES, policy_loss
from divrl.algorithms.loss_options import LossOptions
from divrl.algorithms.options import option
from divrl.training.config import load_config
from divrl.training.trainer import Trainer

SEEN: list[dict] = []


@dataclass(frozen=True)
class ProxyUserOptions(LossOptions):
    LOSS: ClassVar[str] = "proxy_user_test"
    NOT_LOSS_ARGS: ClassVar[tuple[str, ...]] = ("kappa",)
    INPUTS: ClassVar[tuple[str, ...]] = ("proxy_log_prob", "log_normalizer")
    NEEDS_PROXY: ClassVar[bool] = True
    kappa: float = option(0.5, "min-p ratio of the proxy", 0.0, 1.0)
    agg: str = option("token-mean", "aggregation")


def proxy_user(log_prob, old_log_prob, advantages, mask, agg="token-mean", **inputs):
    SEEN.append({k: v.detach().clone() for k, v in inputs.items()} | {"lp": log_prob.detach()})
    return policy_loss(log_prob, old_log_prob, advantages, mask, agg=agg)


@pytest.fixture
def registered():
    POLICY_LOSSES.register("proxy_user_test")(proxy_user)
    POLICY_LOSS_OPTIONS["proxy_user_test"] = ProxyUserOptions
    yield
    del POLICY_LOSSES["proxy_user_test"], POLICY_LOSS_OPTIONS["proxy_user_test"]


@pytest.mark.parametrize("off_policy", [False, True])
def test_a_new_loss_declaring_needs_proxy_gets_it(registered, off_policy, tiny_world, tmp_path):
    SEEN.clear()
    extra = {"train.mini_batch_size": 2} if off_policy else {}
    over = tiny_overrides(
        tiny_world,
        tmp_path,
        **{"train.total_steps": 1, "algorithm.policy_loss": "proxy_user_test", **extra},
    )
    Trainer(load_config(None, over), reward_fn=sevens_reward).train()
    assert SEEN and all(set(s) == {"proxy_log_prob", "log_normalizer", "lp"} for s in SEEN)
    # before any update (the first micro-batch) the proxy is the policy's own: a token it
    # keeps has log-prob lp - log Z >= lp (Z <= 1), a filtered one FILTERED_LOG_PROB
    first = SEEN[0]
    kept = first["proxy_log_prob"] > FILTERED_LOG_PROB
    assert kept.any() and (first["proxy_log_prob"][kept] >= first["lp"][kept] - 1e-4).all()
    assert all(torch.isfinite(s["log_normalizer"]).all() for s in SEEN)


@dataclass(frozen=True)
class NoOldOptions(LossOptions):
    LOSS: ClassVar[str] = "no_old_test"
    NEEDS_OLD_LOG_PROBS: ClassVar[bool] = False
    agg: str = option("token-mean", "aggregation")


GAPS: list[float] = []


def no_old(log_prob, old_log_prob, advantages, mask, agg="token-mean"):
    GAPS.append(float((log_prob.detach() - old_log_prob).abs().max()))
    return policy_loss(log_prob, old_log_prob, advantages, mask, agg=agg)


@pytest.mark.parametrize("needs_old", [True, False])
def test_a_loss_that_reads_no_old_log_probs_skips_their_pass(needs_old, tiny_world, tmp_path):
    options = (
        NoOldOptions
        if not needs_old
        else type("NeedsOld", (NoOldOptions,), {"NEEDS_OLD_LOG_PROBS": True})
    )
    POLICY_LOSSES.register("no_old_test")(no_old)
    POLICY_LOSS_OPTIONS["no_old_test"] = options
    try:
        GAPS.clear()
        over = tiny_overrides(
            tiny_world,
            tmp_path,
            **{
                "train.total_steps": 1,
                "train.mini_batch_size": 2,  # off-policy: two optimiser steps on the batch
                "algorithm.policy_loss": "no_old_test",
            },
        )
        Trainer(load_config(None, over), reward_fn=sevens_reward).train()
    finally:
        del POLICY_LOSSES["no_old_test"], POLICY_LOSS_OPTIONS["no_old_test"]
    # with pi_old the second mini-batch's log-probs have moved away from it; without, the
    # loss gets the current policy's (no no-grad pass over the batch was made for it)
    assert (max(GAPS) > 0) == needs_old
