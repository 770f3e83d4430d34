"""Lp-Reg's selection within fixed groups of sequences (``algorithm.lp_reg_scope: group``):
groups of N consecutive rows select exactly what per-micro-batch selection selects with
micro-batches of the same N rows, and the group size is checked against the processes."""

from __future__ import annotations

import pytest
import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl.training.config import ConfigError, check_divisibility, load_config
from divrl.training.metrics import MetricMeter
from divrl.training.trainer import Trainer


def _lp_reg(world, out, **extra) -> Trainer:
    overrides = {
        "optim.max_grad_norm": 0.0,
        "optim.weight_decay": 0.0,
        "rollout.max_new_tokens": 8,
        "train.prompts_per_step": 4,
        "rollout.n": 4,
        "train.length_bucketing": False,  # micro-batches of consecutive rows
        "algorithm.policy_loss": "lp_reg",
        "algorithm.loss_options.rho": 0.3,
        **extra,
    }
    torch.manual_seed(0)
    return Trainer(
        load_config(None, tiny_overrides(world, out, **overrides)), reward_fn=sevens_reward
    )


def _step(trainer: Trainer, exp) -> tuple[list[torch.Tensor], list[float], MetricMeter]:
    params, grads, selected = list(trainer.model.parameters()), [], []
    trainer.update.optimizer.step = lambda *a, **k: grads.append([p.grad.clone() for p in params])
    fn = trainer.update.loss_spec.fn

    def spy(**kwargs):
        loss, metrics = fn(**kwargs)
        selected.append(metrics["lp_reg/num_selected"])
        return loss, metrics

    trainer.update.loss_spec = type(trainer.update.loss_spec)(
        **{**trainer.update.loss_spec.__dict__, "fn": spy}
    )
    meter = MetricMeter()
    trainer.model.train()
    assert trainer.update.step(exp, list(range(len(exp))), [], meter, step=1)
    return grads[0], selected, meter


def test_groups_select_as_micro_batches_of_the_same_rows(tiny_world, tmp_path):
    micro = _lp_reg(tiny_world, tmp_path / "micro", **{"train.micro_batch_size": 4})
    exp, _, _ = micro.experience.make(0)
    want, want_selected, _ = _step(micro, exp)
    grouped = _lp_reg(
        tiny_world,
        tmp_path / "group",
        **{
            "train.micro_batch_size": 16,  # one micro-batch: the groups alone decide
            "algorithm.lp_reg_scope": "group",
            "algorithm.lp_reg_group_size": 4,
        },
    )
    got, got_selected, meter = _step(grouped, exp)
    assert sum(got_selected) == sum(want_selected) == int(exp.lp_reg_selected.sum()) > 0
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0.0)
    # the mean population per group: the negative-advantage tokens of 4 rows
    negative = (exp.response_mask > 0) & (exp.advantages < 0).view(-1, 1)
    per_group = [float(negative[i : i + 4].sum()) for i in range(0, len(exp), 4)]
    assert meter.means()["lp_reg/population_negative"] == pytest.approx(
        sum(per_group) / len(per_group)
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.lp_reg_scope=group"], "go together"),
        (["algorithm.lp_reg_group_size=4"], "go together"),
        (["algorithm.lp_reg_scope=group", "algorithm.lp_reg_group_size=0"], ">= 1|> 0|positive"),
    ],
)
def test_group_settings_are_checked(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["algorithm.policy_loss=lp_reg", *overrides])


def test_a_group_never_spans_two_processes():
    cfg = load_config(
        None,
        [
            "algorithm.policy_loss=lp_reg",
            "algorithm.lp_reg_scope=group",
            "algorithm.lp_reg_group_size=8",
            "train.prompts_per_step=4",
            "rollout.n=4",
        ],
    )
    check_divisibility(cfg, 1)  # 16 rows: two groups of 8
    check_divisibility(cfg, 2)  # 8 rows per process: one group each, the same two groups
    with pytest.raises(ValueError, match="lp_reg_group_size=8 must divide"):
        check_divisibility(cfg, 4)  # 4 rows per process
