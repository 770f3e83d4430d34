"""divrl train logs Lp-Reg's regime diagnostics (Z, |A|, the net push) of the very tokens
its loss regularised: the step's values equal a hand computation from the loss's inputs."""

import dataclasses
import math

import pytest
from train_helpers import sevens_reward, tiny_overrides

from divrl.algorithms import lp_reg_selection
from divrl.training.config import load_config
from divrl.training.trainer import Trainer


def hand_regime(kw: dict) -> list[tuple[float, float, float]]:
    """(Z, |A|, net push) of each regularised token, one token at a time."""
    lp, old, proxy, adv = kw["log_prob"], kw["old_log_prob"], kw["proxy_log_prob"], kw["advantages"]
    reg = lp_reg_selection(
        lp, proxy, adv, kw["mask"], kw["rho"], kw["min_k"], kw.get("selected")
    ).regularized
    out = []
    for i, j in reg.nonzero().tolist():
        a = float(adv[i] if adv.dim() == 1 else adv[i, j])
        d = float(proxy[i, j] - lp[i, j].detach())
        pull = math.expm1(d) if math.expm1(d) - d < 10 else 0.0
        net = a * math.exp(float(lp[i, j].detach() - old[i, j])) + kw["beta"] * pull
        z = math.exp(float(kw["log_normalizer"][i, j]))
        out.append((z, abs(a), net))
    return out


def test_the_step_logs_the_regularised_tokens_z_advantage_and_net_push(tiny_world, tmp_path):
    cfg = load_config(
        None,
        tiny_overrides(
            tiny_world,
            tmp_path,
            **{
                "train.total_steps": 1,
                "algorithm.policy_loss": "lp_reg",
                # the tiny model is near uniform: a high min-p ratio gives Z < 1, and every
                # negative token selected gives many regularised tokens of both signs
                "algorithm.loss_options.rho": 1.0,
                "algorithm.loss_options.kappa": 0.9,
                "algorithm.loss_options.beta": 0.5,
            },
        ),
    )
    trainer = Trainer(cfg, reward_fn=sevens_reward)
    calls = []
    spec = trainer.update.loss_spec

    def spy(**kw):
        loss, metrics = spec.fn(**kw)
        calls.append((kw, float(kw["mask"].sum())))
        return loss, metrics

    trainer.update.loss_spec = dataclasses.replace(spec, fn=spy)
    logged = trainer.train()[-1]
    per_call = [(hand_regime(kw), w) for kw, w in calls]
    tokens = [t for toks, _ in per_call for t in toks]
    assert tokens, "the step regularised no token: the test needs some"
    ups = sum(net > 0 for _, _, net in tokens)
    assert 0 < ups < len(tokens), (ups, len(tokens))  # pushed up and down both
    assert logged["lp_reg/num_net_up"] == ups
    assert logged["lp_reg/num_regularized"] == len(tokens)

    def weighted(stat):  # the meter's token-weighted mean of per-micro-batch values
        total = sum(w for _, w in per_call)
        return sum(w * (stat(t) if t else 0.0) for t, w in per_call) / total

    assert logged["lp_reg/net_up_share"] == pytest.approx(
        weighted(lambda t: sum(n > 0 for *_, n in t) / len(t)), abs=1e-9
    )
    assert logged["lp_reg/reg_z_mean"] == pytest.approx(
        weighted(lambda t: sum(z for z, *_ in t) / len(t)), rel=1e-5
    )
    assert logged["lp_reg/reg_abs_adv_mean"] == pytest.approx(
        weighted(lambda t: sum(a for _, a, _ in t) / len(t)), rel=1e-5
    )
    assert logged["lp_reg/net_push_mean"] == pytest.approx(
        weighted(lambda t: sum(n for *_, n in t) / len(t)), rel=1e-4, abs=1e-6
    )
