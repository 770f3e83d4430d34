"""Rollout importance-sampling correction: the weights by hand, and `divrl train` with a
stand-in engine whose log-probs are the policy's shifted by a known amount."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl.algorithms import lp_reg_loss, policy_loss, rollout_is_weights
from divrl.rollout import register_engine, unregister_engine
from divrl.rollout.hf import HFEngine
from divrl.training.config import load_config
from divrl.training.config_io import ConfigError
from divrl.training.trainer import Trainer

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]])
# sampler log-probs: ratios exp(old - rollout) = e^1, e^-1, e^0.2 | e^0.5, e^0.5, e^9 (pad)
ROLLOUT = torch.tensor([[-2.0, -1.0, -0.7], [-1.5, -1.5, -12.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_token_level_truncation_by_hand():
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, "token", threshold=2.0)
    e = math.exp
    expected = [2.0, e(-1.0), e(0.2), e(0.5), e(0.5), 0.0]
    assert w.view(-1).tolist() == pytest.approx(expected, rel=1e-6)
    assert m["rollout/is_weight_mean"] == pytest.approx(sum(expected) / 5, rel=1e-6)
    assert m["rollout/is_clipped_frac"] == pytest.approx(1 / 5)  # e^1 > 2 only; pad left out
    assert m["rollout/is_ratio_max"] == pytest.approx(e(1.0), rel=1e-6)


def test_sequence_level_and_masking_by_hand():
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", threshold=2.0)
    # row 0: exp(1 - 1 + 0.2) = e^0.2 for every token; row 1: exp(1.0) capped at 2
    assert w.view(-1).tolist() == pytest.approx([math.exp(0.2)] * 3 + [2.0, 2.0, 0.0], rel=1e-6)
    assert m["rollout/is_clipped_frac"] == pytest.approx(2 / 5)
    # IcePop bound 1.5: e^1, e^-1 and e^0.5 (1.65) lie outside [1/1.5, 1.5]; e^0.2 inside
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, None, rs_threshold=1.5)
    assert w.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert m["rollout/rs_masked_frac"] == pytest.approx(4 / 5)


def test_weights_compose_with_lp_reg_and_the_clipped_surrogate():
    # divrl train hands both losses the same per-token factor, as the TRL adapter hands TRL's
    torch.manual_seed(0)
    lp = torch.randn(2, 3) - 1.0
    adv = torch.tensor([-1.0, 1.0])
    w, _ = rollout_is_weights(OLD, ROLLOUT, MASK, "token", threshold=2.0)
    base = {"log_prob": lp, "old_log_prob": OLD, "advantages": adv, "mask": MASK}
    # the clipped surrogate: token-mean of w_t * L_t, L_t from a single-token call each
    weighted, _ = policy_loss(**base, token_weights=w)
    hand = sum(
        float(w[i, j])
        * float(
            policy_loss(
                lp[i : i + 1, j : j + 1], OLD[i : i + 1, j : j + 1], adv[i : i + 1], MASK[:1, :1]
            )[0]
        )
        for i in range(2)
        for j in range(3)
        if MASK[i, j]
    )
    assert float(weighted) == pytest.approx(hand / 5, rel=1e-5)
    # Lp-Reg (its selection spans the batch): a constant factor scales the whole loss,
    # regularised tokens included, and a zero weight removes a token's term
    lp_reg = {"proxy_log_prob": lp + 0.3, "rho": 0.5, "min_k": 1, **base}
    plain, metrics = lp_reg_loss(**lp_reg)
    assert metrics["lp_reg/num_regularized"] > 0
    scaled, _ = lp_reg_loss(**lp_reg, token_weights=torch.full_like(lp, 1.7))
    assert float(scaled) == pytest.approx(1.7 * float(plain), rel=1e-5)
    zero, _ = lp_reg_loss(**lp_reg, token_weights=torch.zeros_like(lp))
    assert float(zero) == 0.0


class ShiftedEngine(HFEngine):
    """The hf engine whose reported log-probs are the sampled tokens' minus SHIFT: the
    trainer's ratio pi_old / mu is exp(SHIFT) on every token."""

    SHIFT = 0.5

    def generate(self, prompt_ids, params, seeds=None):
        out = super().generate(prompt_ids, params, seeds)
        out.log_probs = [[lp - self.SHIFT for lp in row] for row in out.log_probs]
        return out


@pytest.fixture
def shifted_engine():
    @register_engine("shifted_test", uses_model=False, summary="hf with shifted log-probs")
    def build(context, options):
        return ShiftedEngine(context.model, context.tokenizer, full_weights=context.full_weights)

    yield "shifted_test"
    unregister_engine("shifted_test")


def _first_step(world, out, **overrides):
    cfg = load_config(None, tiny_overrides(world, out, **{"train.total_steps": 1, **overrides}))
    return cfg, Trainer(cfg, reward_fn=sevens_reward).train()[0]


def test_train_reweighs_a_separate_samplers_tokens(tiny_world, tmp_path, shifted_engine):
    cfg, on = _first_step(tiny_world, tmp_path / "on", **{"rollout.engine": shifted_engine})
    assert cfg.algorithm.rollout_is == "token"  # auto: the engine samples with its own kernels
    assert on["rollout/is_weight_mean"] == pytest.approx(math.exp(0.5), rel=1e-4)
    assert on["rollout/is_clipped_frac"] == 0.0
    cfg, off = _first_step(
        tiny_world,
        tmp_path / "off",
        **{"rollout.engine": shifted_engine, "algorithm.rollout_is": None},
    )
    assert "rollout/is_weight_mean" not in off
    # on-policy, the same samples: the policy loss is exp(0.5) times the uncorrected one
    assert on["pg/loss"] == pytest.approx(math.exp(0.5) * off["pg/loss"], rel=1e-4)

    # masking every token (ratio e^0.5 > 1.5) leaves the policy loss nothing
    _, masked = _first_step(
        tiny_world,
        tmp_path / "masked",
        **{"rollout.engine": shifted_engine, "algorithm.rollout_rs_threshold": 1.5},
    )
    assert masked["rollout/rs_masked_frac"] == 1.0 and masked["pg/loss"] == 0.0
    assert masked["actor/grad_norm"] == 0.0


def test_train_reweighs_lp_regs_term_too(tiny_world, tmp_path, shifted_engine):
    # Lp-Reg (regularised tokens included) carries the same per-token weight, as in the TRL
    # adapter; rho 0.5 and kappa 0.8 so that tokens are regularised (12 here) in the tiny
    # model's flat distributions
    lp_reg = {
        "rollout.engine": shifted_engine,
        "algorithm.policy_loss": "lp_reg",
        "algorithm.loss_options.rho": 0.5,
        "algorithm.loss_options.min_k": 1,
        "algorithm.loss_options.kappa": 0.8,
    }
    _, on = _first_step(tiny_world, tmp_path / "on", **lp_reg)
    _, off = _first_step(tiny_world, tmp_path / "off", **lp_reg, **{"algorithm.rollout_is": None})
    assert on["lp_reg/num_regularized"] > 0
    assert on["pg/loss"] == pytest.approx(math.exp(0.5) * off["pg/loss"], rel=1e-4)


def test_correction_is_off_for_the_policys_own_engine_and_refused_without_weights(tiny_world):
    over = tiny_overrides(tiny_world, "/tmp/unused")
    assert load_config(None, [*over, "rollout.engine=hf"]).algorithm.rollout_is is None
    with pytest.raises(ConfigError, match="takes no per-token weights"):
        load_config(None, [*over, "algorithm.policy_loss=gspo", "algorithm.rollout_is=token"])
