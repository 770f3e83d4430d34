"""Lp-Reg in verl: the proxy comes from the logits of verl's own forward, through the
engine's logits-processor hook, and the loss equals divrl.algorithms.lp_reg_loss."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import verl.utils.torch_functional as verl_F
from verl.utils import tensordict_utils as tu
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils.padding import no_padding_2_padding

from divrl.algorithms import logit_stats, lp_reg_loss, proxy_log_prob
from divrl.integrations.verl.keys import IS_REFERENCE, LOG_NORMALIZER, PROXY_LOG_PROB
from divrl.integrations.verl.losses import DivRLLoss
from divrl.integrations.verl.rehearsal import join_rehearsal
from divrl.integrations.verl.settings import DivRLVerlSettings
from tests_verl.builders import micro_batches, reference_samples, rollout_rows
from tests_verl.test_losses import actor_config

VOCAB = 50


def engine() -> FSDPEngineWithLMHead:
    """verl's FSDP engine with only what prepare_model_outputs reads (no model, no FSDP)."""
    e = object.__new__(FSDPEngineWithLMHead)
    e.use_ulysses_sp = False
    e.engine_config = SimpleNamespace(
        entropy_checkpointing=False, entropy_from_logits_with_chunking=False
    )
    e.compute_entropy_from_logits = verl_F.entropy_from_logits
    return e


def engine_outputs(loss_fn, micro, logits):
    """The engine's model outputs for packed ``logits`` [nnz, V] (remove-padding path)."""
    labels = torch.roll(micro["input_ids"].values(), -1)
    tu.assign_non_tensor(
        micro, use_remove_padding=True, distillation_use_topk=True, calculate_entropy=True
    )
    output_args = {
        "input_ids_rmpad_rolled": labels,
        "temperature_rmpad": torch.ones(labels.shape[0]),
        "pad_size": 0,
        "temperature_is_one": True,
    }
    return FSDPEngineWithLMHead.prepare_model_outputs(
        engine(), SimpleNamespace(logits=logits.unsqueeze(0)), output_args, micro, loss_fn
    )


def _response(values: torch.Tensor, micro) -> torch.Tensor:
    nested = torch.nested.nested_tensor_from_jagged(values, micro["input_ids"].offsets())
    return no_padding_2_padding(nested, micro)


@pytest.mark.parametrize("kappa", [0.02, 0.3])
def test_lp_reg_loss_equals_divrl_with_the_proxy_of_verls_forward(kappa):
    settings = DivRLVerlSettings(policy_loss="lp_reg", loss_options={"kappa": kappa, "rho": 1.0})
    config = actor_config(clip_ratio_low=1.0, clip_ratio_high=9.0)
    loss_fn = DivRLLoss(config, settings)
    batch = rollout_rows(6, seed=3)
    total = int(batch["response_mask"].values().sum())
    g = torch.Generator().manual_seed(5)
    regularized = 0.0
    for micro in micro_batches(batch, 3):
        nnz = micro["input_ids"].values().shape[0]
        logits = (torch.randn(nnz, VOCAB, generator=g) * 2.0).requires_grad_()
        out = engine_outputs(loss_fn, micro, logits)
        assert PROXY_LOG_PROB in out and LOG_NORMALIZER in out and "entropy" in out
        loss, metrics = loss_fn(model_output=out, data=micro)
        # divrl's own computation on the same logits and tokens
        labels = torch.roll(micro["input_ids"].values(), -1)
        # the log-probs are verl's (its kernel); the proxy is divrl's on the same logits
        lp = no_padding_2_padding(out["log_probs"], micro)
        stats = logit_stats(logits.detach(), labels, 1.0, with_entropy=False, minp_kappa=kappa)
        proxy = _response(stats.proxy_log_prob, micro)
        log_z = _response(stats.log_normalizer, micro)
        # divrl's proxy: the same as proxy_log_prob's on these logits, to rounding
        torch.testing.assert_close(
            stats.proxy_log_prob, proxy_log_prob(logits.detach(), labels, kappa)
        )
        t = micro.select("old_log_probs", "advantages", "response_mask").to_padded_tensor()
        mask = t["response_mask"].to(lp.dtype)
        want, want_metrics = lp_reg_loss(
            lp,
            t["old_log_probs"],
            proxy,
            t["advantages"],
            mask,
            log_normalizer=log_z,
            **settings.policy_options(clip_low=1.0, clip_high=9.0).loss_kwargs(),
        )
        torch.testing.assert_close(loss, want * (float(mask.sum()) / total), rtol=0, atol=0)
        assert metrics["lp_reg/num_selected"].aggregate() == want_metrics["lp_reg/num_selected"]
        regularized += want_metrics["lp_reg/num_regularized"]
        loss.backward()
        assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert regularized > 0  # the regulariser acted somewhere, so the test is not vacuous


def test_lp_reg_without_the_logits_hook_says_how_to_switch_it_on():
    loss_fn = DivRLLoss(actor_config(), DivRLVerlSettings(policy_loss="lp_reg"))
    (micro,) = micro_batches(rollout_rows(2), 2)
    lp = torch.nested.nested_tensor_from_jagged(
        -torch.rand(micro["input_ids"].values().shape[0]), micro["input_ids"].offsets()
    )
    with pytest.raises(ValueError, match="distillation_use_topk"):
        loss_fn(model_output={"log_probs": lp}, data=micro)


def test_the_vanilla_loss_adds_no_logits_outputs():
    (micro,) = micro_batches(rollout_rows(2), 2)
    assert (
        DivRLLoss(actor_config(), DivRLVerlSettings()).logits_outputs(torch.zeros(1, 3, 4), micro)
        == {}
    )


def test_pi_olds_proxy_from_the_old_log_prob_pass_gives_the_same_loss():
    """divrl_sync's Lp-Reg: the old-log-prob pass computes the proxy through the logits hook
    (its loss call returns zero: no advantages yet), the proxy is cut to the responses in
    the queue, and the update (hook off) reads it: the same loss as the proxy from the
    update's own logits when the weights have not moved."""
    from divrl.integrations.verl.trainer import proxy_to_responses
    from tests_verl.test_trainer import MemoryQueue

    settings = DivRLVerlSettings(policy_loss="lp_reg", loss_options={"kappa": 0.3, "rho": 1.0})
    loss_fn = DivRLLoss(actor_config(clip_ratio_low=1.0, clip_ratio_high=9.0), settings)
    batch = rollout_rows(4, seed=7)
    keys = [f"u{i}" for i in range(4)]
    queue = MemoryQueue()
    queue.kv_batch_put(keys, "train", fields=batch)
    old_pass = batch.exclude("advantages", "old_log_probs")
    (micro,) = micro_batches(old_pass, 4)
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(micro["input_ids"].values().shape[0], VOCAB, generator=g) * 2
    out = engine_outputs(loss_fn, micro, logits)
    loss, metrics = loss_fn(model_output=out, data=micro)
    assert float(loss) == 0.0 and metrics == {}
    from tensordict import TensorDict

    queue.kv_batch_put(
        keys, "train", fields=TensorDict({k: out[k] for k in (PROXY_LOG_PROB, LOG_NORMALIZER)}, [4])
    )
    meta = type("Meta", (), {"keys": keys, "partition_id": "train"})()
    proxy_to_responses(queue, meta)
    update = queue.kv_batch_get(keys, "train")
    (with_old,) = micro_batches(update, 4)
    (hooked,) = micro_batches(batch.clone(), 4)
    own = engine_outputs(loss_fn, hooked, logits)
    plain = {"log_probs": own["log_probs"]}
    from_old, _ = loss_fn(model_output=plain, data=with_old)
    from_own, own_metrics = loss_fn(model_output=own, data=hooked)
    assert torch.equal(from_old, from_own)
    assert own_metrics["lp_reg/num_regularized"].aggregate() > 0  # the proxy mattered


def test_lp_reg_with_rehearsal_logs_every_name_on_every_micro_batch():
    """A micro-batch of rehearsal rows alone logs Lp-Reg's names too (as 0: it holds none of
    the rollout tokens), so verl's aggregation over ranks finds them on every rank."""
    settings = DivRLVerlSettings(
        policy_loss="lp_reg",
        loss_options={"rho": 1.0},
        divergence="js",
        divergence_coef=0.2,
        divergence_weighting="paper",
        reference_store="unused",
        reference_per_step=2,
    )
    loss_fn = DivRLLoss(actor_config(clip_ratio_low=1.0, clip_ratio_high=9.0), settings)
    joined, _ = join_rehearsal(rollout_rows(4, seed=3), reference_samples(2))
    g = torch.Generator().manual_seed(5)
    names, reference_only = set(), 0
    for micro in micro_batches(joined, 1):
        nnz = micro["input_ids"].values().shape[0]
        out = engine_outputs(loss_fn, micro, torch.randn(nnz, VOCAB, generator=g))
        loss, metrics = loss_fn(model_output=out, data=micro)
        assert torch.isfinite(loss)
        names.add(frozenset(metrics))
        if bool(micro[IS_REFERENCE].all()):
            reference_only += 1
            assert metrics["lp_reg/num_selected"].aggregate() == 0.0
            assert metrics["dph/u_mean"].aggregate() > 0.0
    assert reference_only == 2 and len(names) == 1
    assert {"lp_reg/num_selected", "dph/u_mean", "actor/pg_clipfrac", "actor/pg_loss"} <= next(
        iter(names)
    )


def test_lp_reg_takes_verls_rollout_importance_weights_on_its_per_token_loss():
    """With verl's rollout IS correction the batch carries ``rollout_is_weights``: Lp-Reg's
    per-token loss is multiplied by them before aggregation, as verl's vanilla loss is."""
    settings = DivRLVerlSettings(policy_loss="lp_reg", loss_options={"rho": 1.0})
    loss_fn = DivRLLoss(actor_config(clip_ratio_low=1.0, clip_ratio_high=9.0), settings)
    batch = rollout_rows(4, seed=3)
    r = batch["response_mask"]
    g = torch.Generator().manual_seed(7)
    weights = 0.5 + torch.rand(r.values().shape[0], generator=g)
    batch["rollout_is_weights"] = torch.nested.nested_tensor_from_jagged(weights, r.offsets())
    total = int(r.values().sum())
    (micro,) = micro_batches(batch, 4)
    nnz = micro["input_ids"].values().shape[0]
    out = engine_outputs(loss_fn, micro, torch.randn(nnz, VOCAB, generator=g) * 2.0)
    loss, _ = loss_fn(model_output=out, data=micro)
    lp = no_padding_2_padding(out["log_probs"], micro)
    keys = ("old_log_probs", "advantages", "response_mask", "rollout_is_weights")
    t = micro.select(*keys).to_padded_tensor()
    mask = t["response_mask"].to(lp.dtype)
    kwargs = settings.policy_options(clip_low=1.0, clip_high=9.0).loss_kwargs()
    args = (lp, t["old_log_probs"], no_padding_2_padding(out[PROXY_LOG_PROB], micro))
    want, _ = lp_reg_loss(
        *args, t["advantages"], mask, token_weights=t["rollout_is_weights"], **kwargs
    )
    unweighted, _ = lp_reg_loss(*args, t["advantages"], mask, **kwargs)
    scale = float(mask.sum()) / total
    torch.testing.assert_close(loss, want * scale, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(loss, unweighted * scale)


def test_lp_reg_divides_by_the_loss_scale_factor_not_the_padded_length():
    """seq-mean-token-sum-norm with actor.loss_scale_factor = L: the loss is lp_reg_loss on
    the rows padded to L (its horizon), as verl's aggregation divides by L."""
    agg, factor = "seq-mean-token-sum-norm", 40
    settings = DivRLVerlSettings(policy_loss="lp_reg", loss_options={"rho": 1.0, "min_k": 1})
    config = actor_config(
        clip_ratio_low=1.0, clip_ratio_high=9.0, loss_agg_mode=agg, loss_scale_factor=factor
    )
    loss_fn = DivRLLoss(config, settings)
    batch = rollout_rows(6, seed=3)
    g = torch.Generator().manual_seed(5)
    for micro in micro_batches(batch, 3):
        nnz = micro["input_ids"].values().shape[0]
        out = engine_outputs(loss_fn, micro, torch.randn(nnz, VOCAB, generator=g) * 2.0)
        loss, metrics = loss_fn(model_output=out, data=micro)
        width = lambda x: torch.nn.functional.pad(x, (0, factor - x.shape[-1]))  # noqa: E731
        t = micro.select("old_log_probs", "advantages", "response_mask").to_padded_tensor()
        assert t["response_mask"].shape[-1] < factor
        want, _ = lp_reg_loss(
            width(no_padding_2_padding(out["log_probs"], micro)),
            width(t["old_log_probs"]),
            width(no_padding_2_padding(out[PROXY_LOG_PROB], micro)),
            width(t["advantages"]),
            width(t["response_mask"].float()),
            **settings.policy_options(clip_low=1.0, clip_high=9.0, agg=agg).loss_kwargs(),
        )
        share = len(micro) / len(batch)  # verl's seq-mean over the mini-batch's rows
        torch.testing.assert_close(loss, want * share, rtol=1e-6, atol=0)
        assert metrics["actor/pg_loss"].aggregate() == pytest.approx(float(want), rel=1e-6)
