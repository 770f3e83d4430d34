"""The update stage's loss weighting on a known step, against formulas written out here.

A step of rollouts (from the tiny model) and DPH reference samples (from the session's
store) goes through ``PolicyUpdate.step``; the gradient it hands the optimiser is compared
with the gradient of the formula computed from the model directly, micro-batch by
micro-batch: the DPH weightings (``authors``, ``paper``, ``concat``), token-budget
micro-batches against one big batch, and Lp-Reg's selection scope.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from train_helpers import sevens_reward, tiny_overrides

from divrl.algorithms import policy_loss, reference_divergence_loss, token_log_probs
from divrl.training.config import load_config
from divrl.training.forward import response_logits
from divrl.training.metrics import MetricMeter
from divrl.training.trainer import Trainer

ETA = 0.3


def _trainer(world, out, **overrides) -> Trainer:
    base = {
        "optim.max_grad_norm": 0.0,  # the raw gradient reaches the optimiser
        "optim.weight_decay": 0.0,
        "rollout.max_new_tokens": 8,
        "train.prompts_per_step": 4,
        "rollout.n": 4,
    }
    cfg = load_config(None, tiny_overrides(world, out, **{**base, **overrides}))
    torch.manual_seed(0)
    return Trainer(cfg, reward_fn=sevens_reward)


def _step_gradient(trainer: Trainer, exp, seqs, refs) -> tuple[list[torch.Tensor], MetricMeter]:
    """The gradient ``PolicyUpdate.step`` hands the optimiser (the step itself not taken)."""
    update, grads = trainer.update, []
    params = list(trainer.model.parameters())
    update.optimizer.step = lambda *a, **k: grads.append([p.grad.clone() for p in params])
    meter = MetricMeter()
    trainer.model.train()
    assert update.step(exp, seqs, refs, meter, step=1)
    return grads[0], meter


def _formula_gradient(trainer: Trainer, exp, seqs, refs, mode: str) -> list[torch.Tensor]:
    """The DPH weightings written out: per-kind micro-batch token-means ``l_i`` with
    ``n_i`` tokens; paper: each stream token-meaned over itself; authors: paper with the
    authors' eta (eta x 4 reference / 16 rollouts here: no reference row shares a
    micro-batch with a rollout in their layout); concat: one token-mean over both."""
    update, model = trainer.update, trainer.model
    temp = trainer.config.rollout.temperature
    model.zero_grad(set_to_none=True)
    terms = []  # (kind, l_i, n_i)
    for idx in update.micro_batches(exp, seqs):
        data = exp.model_inputs(idx)
        lp = token_log_probs(response_logits(model, data), data["responses"], temp)
        loss, _ = policy_loss(lp, lp.detach(), exp.advantages[idx], data["response_mask"])
        terms.append(("rollout", loss, float(data["response_mask"].sum())))
    samples = update.reference_samples
    for idx in update.micro_batches(samples, refs) if refs else []:
        data = samples.model_inputs(idx)
        lp = token_log_probs(response_logits(model, data), data["responses"], temp)
        ref = samples.ref_log_probs[idx, : lp.shape[1]]
        loss, _ = reference_divergence_loss(lp, ref, data["response_mask"], "js")
        terms.append(("reference", loss, float(data["response_mask"].sum())))
    eta = {"rollout": 1.0, "reference": ETA * 4 / 16 if mode == "authors" else ETA}
    n_kind = {k: sum(n for kk, _, n in terms if kk == k) for k in eta}
    if mode in ("authors", "paper"):
        total = sum(eta[k] * loss * n / n_kind[k] for k, loss, n in terms)
    else:
        total = sum(eta[k] * loss * n for k, loss, n in terms) / sum(n_kind.values())
    total.backward()
    return [p.grad.clone() for p in model.parameters()]


def _move_off_the_initial_policy(trainer: Trainer) -> None:
    """Perturb the policy: at the initial policy (u = 1) every divergence has zero gradient,
    so the reference stream's weight would not show in the gradient."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def _close(a: list[torch.Tensor], b: list[torch.Tensor], atol: float) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=0.0)


def _dph(world, out, store, mode: str, **extra) -> Trainer:
    return _trainer(
        world,
        out,
        **{
            "algorithm.divergence": "js",
            "algorithm.divergence_coef": ETA,
            "algorithm.divergence_weighting": mode,
            "reference.store": store,
            "reference.per_step": 4,
            # the fixture store was sampled with k=4 and 6 tokens: the weighting does not care
            "reference.allow_store_mismatch": True,
            "train.micro_batch_size": 3,
            # 16 rollouts + 4 reference rows split over 2 GPUs in the authors' layout
            "algorithm.authors_gpus": 2,
            **extra,
        },
    )


@pytest.mark.parametrize("mode", ["authors", "paper", "concat"])
def test_dph_weighting_through_the_update_stage(mode, tiny_world, reference_store, tmp_path):
    trainer = _dph(tiny_world, tmp_path, reference_store, mode)
    exp, _, _ = trainer.experience.make(0)
    _move_off_the_initial_policy(trainer)
    refs = trainer.ref_sampler.take(4)
    seqs = list(range(len(exp)))
    assert len(refs) == 4 and len(exp) >= 4
    got, meter = _step_gradient(trainer, exp, seqs, refs)
    want = _formula_gradient(trainer, exp, seqs, refs, mode)
    _close(got, want, atol=1e-6)
    # the logged effective eta: the reference stream's weight over the rollouts'
    logged = meter.means()["dph/effective_eta"]
    if mode == "authors":
        assert logged == pytest.approx(ETA * 4 / 16)
    elif mode == "paper":
        assert logged == pytest.approx(ETA)


def test_the_weightings_differ_on_the_same_step(tiny_world, reference_store, tmp_path):
    grads = {}
    for mode in ("authors", "paper"):
        trainer = _dph(tiny_world, tmp_path / mode, reference_store, mode)
        exp, _, _ = trainer.experience.make(0)
        _move_off_the_initial_policy(trainer)
        grads[mode], _ = _step_gradient(trainer, exp, list(range(len(exp))), [0, 1, 2, 3])
    assert any(not torch.allclose(a, b) for a, b in zip(*grads.values(), strict=True))


@pytest.mark.parametrize("divergence", [None, "js"])
def test_token_budget_micro_batches_give_the_gradient_of_one_batch(
    divergence, tiny_world, reference_store, tmp_path
):
    """Token-mean weighting is exact: packing by tokens changes only the memory. With
    reference samples under `paper` (each stream token-meaned over itself) the same."""
    dph = {}
    if divergence:
        dph = {
            "algorithm.divergence": divergence,
            "algorithm.divergence_coef": ETA,
            "algorithm.divergence_weighting": "paper",
            "reference.store": reference_store,
            "reference.per_step": 4,
            "reference.allow_store_mismatch": True,  # (k and lengths differ: irrelevant here)
        }
    one = _trainer(tiny_world, tmp_path / "one", **dph, **{"train.micro_batch_size": 64})
    exp, _, _ = one.experience.make(0)
    seqs = list(range(len(exp)))
    refs = [0, 1, 2, 3] if divergence else []
    budget = _trainer(tiny_world, tmp_path / "tok", **dph, **{"train.micro_batch_tokens": 30})
    plan = budget.update.micro_batches(exp, seqs)
    lengths = (exp.prompt_lengths + exp.response_lengths).tolist()
    assert len(plan) > 2 and sorted(i for mb in plan for i in mb) == seqs
    assert all(sum(lengths[i] for i in mb) <= 30 or len(mb) == 1 for mb in plan)
    want, _ = _step_gradient(one, exp, seqs, refs)
    got, _ = _step_gradient(budget, exp, seqs, refs)
    _close(got, want, atol=1e-5)


def _lp_reg(world, out, **extra) -> Trainer:
    options = {"algorithm.policy_loss": "lp_reg", "algorithm.loss_options.rho": 0.3}
    return _trainer(world, out, **options, **extra)


def _count_selected(trainer: Trainer) -> list[float]:
    """Record the loss's ``lp_reg/num_selected`` of every micro-batch."""
    counts, spec = [], trainer.update.loss_spec

    def spy(**kwargs):
        loss, metrics = spec.fn(**kwargs)
        counts.append(metrics["lp_reg/num_selected"])
        return loss, metrics

    trainer.update.loss_spec = dataclasses.replace(spec, fn=spy)
    return counts


def test_lp_reg_scope_mini_batch_selects_over_the_whole_mini_batch(tiny_world, tmp_path):
    """Selection over the mini-batch with micro-batches of 2 = the authors' per-micro-batch
    selection when one micro-batch holds the whole mini-batch (same tokens, same gradient);
    per-micro-batch selection with micro-batches of 2 selects a different set."""
    whole = _lp_reg(tiny_world, tmp_path / "a", **{"train.micro_batch_size": 64})
    exp, _, _ = whole.experience.make(0)
    seqs = list(range(len(exp)))
    whole_counts = _count_selected(whole)
    want, m_want = _step_gradient(whole, exp, seqs, [])
    assert len(whole_counts) == 1 and whole_counts[0] >= 2
    scoped = _lp_reg(
        tiny_world,
        tmp_path / "b",
        **{"train.micro_batch_size": 2, "algorithm.lp_reg_scope": "mini_batch"},
    )
    scoped_counts = _count_selected(scoped)
    got, m_got = _step_gradient(scoped, exp, seqs, [])
    _close(got, want, atol=1e-5)
    assert len(scoped_counts) == len(seqs) // 2
    assert sum(scoped_counts) == whole_counts[0] == int(exp.lp_reg_selected.sum())
    assert m_got.means()["lp_reg/population_negative"] == m_want.means()["lp_reg/num_negative"]
    # token counts are the step's totals, summed over its micro-batches (not a mean)
    for key in ("lp_reg/num_selected", "lp_reg/num_negative", "lp_reg/num_regularized"):
        assert m_got.means()[key] == m_want.means()[key], key
    assert m_got.means()["lp_reg/num_selected"] == whole_counts[0]
    exp.lp_reg_selected = None
    local = _lp_reg(tiny_world, tmp_path / "c", **{"train.micro_batch_size": 2})
    local_counts = _count_selected(local)
    _step_gradient(local, exp, seqs, [])
    assert sum(local_counts) != whole_counts[0]


def test_lp_reg_scope_step_selects_over_the_whole_step(tiny_world, tmp_path):
    """Off-policy (2 mini-batches): the `step` population is every rollout of the step, the
    `mini_batch` one the mini-batch's; the selection covers only the mini-batch's rows."""
    counts = {}
    for scope in ("step", "mini_batch"):
        trainer = _lp_reg(
            tiny_world,
            tmp_path / scope,
            **{"train.mini_batch_size": 2, "algorithm.lp_reg_scope": scope},
        )
        exp, _, _ = trainer.experience.make(0)
        trainer.update.precompute(exp)
        first = list(range(len(exp) // 2))
        _, meter = _step_gradient(trainer, exp, first, [])
        counts[scope] = meter.means()["lp_reg/population_negative"]
        negative = (exp.response_mask > 0) & (exp.advantages < 0).view(-1, 1)
        want = negative if scope == "step" else negative[first]
        assert counts[scope] == int(want.sum())
        assert not exp.lp_reg_selected[len(first) :].any()  # only the mini-batch's rows
    assert counts["step"] > counts["mini_batch"]
