"""Lp-Reg without its regulariser is the vanilla clipped loss: on-policy (one optimiser step
per batch, as the Lp-Reg presets run) the ratio is 1, so Lp-Reg's wide clip range (1.0 /
9.0) has no effect either, and the `grpo_math` preset, which differs from `lp_reg` only in
the loss, the clip range and where Lp-Reg selects (the selection keys, which the vanilla loss
does not read), is the ablation of the regulariser."""

from __future__ import annotations

from pathlib import Path

import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl.training.config import load_config
from divrl.training.metrics import MetricMeter
from divrl.training.trainer import Trainer

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "toy" / "countdown"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "loss_options":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_grpo_math_differs_from_lp_reg_only_in_the_loss_and_clip_range():
    lp = _flat(load_config(CONFIGS / "lp_reg.yaml").to_dict())
    grpo = _flat(load_config(CONFIGS / "grpo_math.yaml").to_dict())
    differ = {k for k in lp if lp[k] != grpo[k]}
    assert differ == {
        "algorithm.policy_loss",
        "algorithm.loss_options",
        "algorithm.clip_low",
        "algorithm.clip_high",
        "algorithm.lp_reg_scope",
        "algorithm.lp_reg_balance_batch",
        "algorithm.lp_reg_group_size",
        "algorithm.lp_reg_micro_batch_tokens",
        "logging.output_dir",
    }
    assert load_config(CONFIGS / "lp_reg.yaml").train.on_policy


def _gradient(world, out, **extra) -> list[torch.Tensor]:
    overrides = {
        "optim.max_grad_norm": 0.0,
        "rollout.max_new_tokens": 8,
        "train.prompts_per_step": 4,
        "rollout.n": 4,
        **extra,
    }
    torch.manual_seed(0)
    trainer = Trainer(
        load_config(None, tiny_overrides(world, out, **overrides)), reward_fn=sevens_reward
    )
    exp, _, _ = trainer.experience.make(0)
    params, grads = list(trainer.model.parameters()), []
    trainer.update.optimizer.step = lambda *a, **k: grads.append([p.grad.clone() for p in params])
    trainer.model.train()
    assert trainer.update.step(exp, list(range(len(exp))), [], MetricMeter(), step=1)
    return grads[0]


def test_on_policy_lp_reg_without_selection_is_vanilla_whatever_the_clip(tiny_world, tmp_path):
    # rho = 0: k = 1 < min_k = 2, nothing selected, nothing regularised
    lp_reg = _gradient(
        tiny_world,
        tmp_path / "a",
        **{
            "algorithm.policy_loss": "lp_reg",
            "algorithm.loss_options.rho": 0.0,
            "algorithm.clip_low": 1.0,
            "algorithm.clip_high": 9.0,
        },
    )
    vanilla = _gradient(tiny_world, tmp_path / "b", **{"algorithm.policy_loss": "vanilla"})
    for a, b in zip(lp_reg, vanilla, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0.0)
    assert max(float(g.abs().max()) for g in vanilla) > 1e-4
