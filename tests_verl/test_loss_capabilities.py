"""The verl plugin runs a divrl policy loss by what its options declare, never by its name:
a loss registered here with Lp-Reg's needs gets the proxy and trains as Lp-Reg does; one
declaring what the plugin cannot give it is refused at start-up, naming that capability."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from hydra import compose, initialize_config_module

from divrl.algorithms import POLICY_LOSS_OPTIONS, POLICY_LOSSES, lp_reg_loss, register_policy_loss
from divrl.algorithms.loss_options import LpRegOptions, VanillaOptions
from divrl.integrations.verl.keys import PROXY_LOG_PROB
from divrl.integrations.verl.losses import DivRLLoss
from divrl.integrations.verl.settings import DivRLVerlSettings, VerlSettingsError
from divrl.integrations.verl.startup import startup_errors
from tests_verl.builders import micro_batches, rollout_rows
from tests_verl.test_losses import actor_config
from tests_verl.test_lp_reg import VOCAB, engine_outputs


@dataclass(frozen=True)
class ProxyProbeOptions(LpRegOptions):
    """Lp-Reg's options and needs (NEEDS_PROXY, SCOPED_SELECTION) under another name."""

    LOSS: ClassVar[str] = "probe_proxy"


@dataclass(frozen=True)
class EntropyProbeOptions(VanillaOptions):
    """A clipped surrogate that declares it reads each token's entropy."""

    LOSS: ClassVar[str] = "probe_entropy"
    INPUTS: ClassVar[tuple[str, ...]] = ("entropy",)


@dataclass(frozen=True)
class FullLogitsProbeOptions(VanillaOptions):
    """A loss that declares it needs the full-vocabulary rows."""

    LOSS: ClassVar[str] = "probe_full_logits"

    @property
    def needs_full_logits(self) -> bool:
        return True


def _probe_proxy_loss(**kwargs):
    return lp_reg_loss(**kwargs)


def _probe_surrogate(log_prob, old_log_prob, advantages, mask, **_):
    raise AssertionError("a refused loss never runs")


@pytest.fixture
def probes():
    registered = {
        "probe_proxy": (ProxyProbeOptions, _probe_proxy_loss),
        "probe_entropy": (EntropyProbeOptions, _probe_surrogate),
        "probe_full_logits": (FullLogitsProbeOptions, _probe_surrogate),
    }
    for name, (options, fn) in registered.items():
        register_policy_loss(name, options)(fn)
    yield
    for name in registered:
        POLICY_LOSSES.pop(name)
        POLICY_LOSS_OPTIONS.pop(name)


def test_a_loss_with_lp_regs_needs_gets_the_proxy_and_trains_as_lp_reg(probes):
    options = {"kappa": 0.3, "rho": 1.0}
    config = actor_config(clip_ratio_low=1.0, clip_ratio_high=9.0)
    probe = DivRLLoss(config, DivRLVerlSettings(policy_loss="probe_proxy", loss_options=options))
    lp_reg = DivRLLoss(config, DivRLVerlSettings(policy_loss="lp_reg", loss_options=options))
    assert probe.needs_proxy and probe.settings.needs_proxy
    g = torch.Generator().manual_seed(11)
    regularized = 0.0
    for micro in micro_batches(rollout_rows(4, seed=2), 2):
        logits = torch.randn(micro["input_ids"].values().shape[0], VOCAB, generator=g) * 2.0
        out = engine_outputs(probe, micro, logits)
        assert PROXY_LOG_PROB in out  # the logits hook ran for the probe, by its declaration
        ours, metrics = probe(model_output=out, data=micro)
        theirs, _ = lp_reg(model_output=engine_outputs(lp_reg, micro, logits), data=micro)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        regularized += metrics["lp_reg/num_regularized"].aggregate()
    assert regularized > 0


def _config(*overrides: str):
    base = (
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.v1.trainer_mode=divrl_sync",
    )
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*base, *overrides])


def test_the_start_up_gate_refuses_by_capability_and_accepts_what_it_can_give(probes):
    refused = {
        "probe_entropy": "needs the input 'entropy' (declared in EntropyProbeOptions.INPUTS), "
        "which the verl plugin does not provide",
        "probe_full_logits": "needs the full-vocabulary logits of every position",
    }
    for name, why in refused.items():
        errors = startup_errors(_config(f"+divrl.policy_loss={name}"))
        assert len(errors) == 1 and errors[0].startswith(f"divrl.policy_loss={name}: ")
        assert why in errors[0], errors
        with pytest.raises(VerlSettingsError, match=why.split(" (")[0]):
            DivRLVerlSettings(policy_loss=name)
    # the proxy probe passes the gate, and what cannot stand beside a proxy is refused for it
    assert startup_errors(_config("+divrl.policy_loss=probe_proxy")) == []
    (fused,) = startup_errors(
        _config("+divrl.policy_loss=probe_proxy", "actor_rollout_ref.model.use_fused_kernels=True")
    )
    assert "the min-p proxy of divrl.policy_loss=probe_proxy" in fused


@pytest.mark.parametrize("name", ["vanilla", "gspo", "kl_cov", "clip_cov"])
def test_a_registered_loss_without_a_proxy_is_its_own_function_with_verls_keys(name):
    """A divrl loss that needs no proxy: the registered function on the rollout rows with
    verl's clip range, dual clip and aggregation where its options declare them, weighted by
    the micro-batch's share of the mini-batch's tokens; the logits hook stays off."""
    from verl.workers.utils.padding import no_padding_2_padding

    from divrl.algorithms import policy_loss_spec
    from tests_verl.test_losses import padded, sequence_log_probs

    loss_fn = DivRLLoss(actor_config(), DivRLVerlSettings(policy_loss=name))
    assert not loss_fn.needs_proxy
    declared = set(policy_loss_spec(name).options.names())
    verl_keys = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0, "agg": "token-mean"}
    options = {k: v for k, v in verl_keys.items() if k in declared}
    assert loss_fn.options == policy_loss_spec(name).options(**options)
    batch = rollout_rows(6)
    total = int(batch["response_mask"].values().sum())
    for micro in micro_batches(batch, 3):
        _, nested = sequence_log_probs(micro)
        assert loss_fn.logits_outputs(torch.zeros(1, 3, VOCAB), micro) == {}
        lp = no_padding_2_padding(nested, micro)
        t = padded(micro, "old_log_probs", "advantages", "response_mask")
        mask = t["response_mask"].to(lp.dtype)
        torch.manual_seed(0)  # clip_cov picks its tokens at random
        loss, _ = loss_fn(model_output={"log_probs": nested}, data=micro)
        torch.manual_seed(0)
        want, _ = policy_loss_spec(name).fn(
            log_prob=lp,
            old_log_prob=t["old_log_probs"],
            advantages=t["advantages"],
            mask=mask,
            **loss_fn.options.loss_kwargs(),
        )
        torch.testing.assert_close(loss, want * (float(mask.sum()) / total), rtol=1e-6, atol=0)
