"""The plugin's losses equal divrl.algorithms' on the same tensors, through verl's objects
(nested TensorDict batches, verl's micro-batching and padding, verl's loss registry)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig
from verl.workers.utils.padding import no_padding_2_padding

from divrl.algorithms import (
    AuthorsLayout,
    micro_batch_weights,
    policy_loss,
    reference_divergence_loss,
)
from divrl.integrations.verl.keys import IS_REFERENCE, REF_LOG_PROB, STREAM
from divrl.integrations.verl.losses import DivRLLoss, divrl_vanilla_policy_loss
from divrl.integrations.verl.rehearsal import join_rehearsal
from divrl.integrations.verl.settings import DivRLVerlSettings
from tests_verl.builders import (
    micro_batches,
    reference_samples,
    rollout_rows,
    sequence_log_probs,
)


def actor_config(**overrides) -> ActorConfig:
    from verl.utils.config import omega_conf_to_dataclass

    base = {
        "_target_": "verl.workers.config.FSDPActorConfig",
        "strategy": "fsdp2",
        "ppo_mini_batch_size": 4,
        "ppo_micro_batch_size_per_gpu": 2,
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 3.0,
        "loss_agg_mode": "token-mean",
        "use_kl_loss": False,
        "entropy_coeff": 0.0,
        "rollout_n": 1,
    }
    base.update(overrides)
    return omega_conf_to_dataclass(OmegaConf.create(base))


def padded(micro, *keys):
    return micro.select(*keys).to_padded_tensor()


def test_the_entry_point_registers_divrl_vanilla():
    # verl imported the plugin when it started: no divrl import here before the lookup
    assert get_policy_loss_fn("divrl_vanilla") is divrl_vanilla_policy_loss


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_divrl_vanilla_equals_divrl_policy_loss_and_verl_vanilla(agg):
    config = actor_config(loss_agg_mode=agg)
    batch = rollout_rows(8)
    total_tokens = int(batch["response_mask"].values().sum())
    for micro in micro_batches(batch, 2):
        _, nested = sequence_log_probs(micro)
        lp = no_padding_2_padding(nested, micro)
        t = padded(micro, "old_log_probs", "advantages", "response_mask")
        mask = t["response_mask"].bool()
        config.global_batch_info.update(
            dp_size=1, batch_num_tokens=total_tokens, global_batch_size=len(batch)
        )
        args = (t["old_log_probs"], lp, t["advantages"], mask)
        ours, metrics = get_policy_loss_fn("divrl_vanilla")(*args, agg, config)
        theirs, _ = get_policy_loss_fn("vanilla")(*args, agg, config)
        expected, _ = policy_loss(
            lp,
            t["old_log_probs"],
            t["advantages"],
            mask,
            clip_low=0.2,
            clip_high=0.28,
            dual_clip=3.0,
            agg=agg,
        )
        count = float(mask.sum()) if agg == "token-mean" else float((mask.sum(-1) > 0).sum())
        share = count / (total_tokens if agg == "token-mean" else len(batch))
        assert torch.equal(ours, expected * share)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
        assert set(metrics) == {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}


def _expected_dph(micros, lps, settings, layout, rollout_term=None):
    """divrl train's computation: every micro-batch's two parts as micro-batches of their
    kind, weighted by micro_batch_weights over the whole mini-batch's list
    (``rollout_term(lp, t, rows)``: the rollout part's loss, divrl's policy_loss if None)."""
    parts, losses = [], []
    for micro, lp in zip(micros, lps, strict=True):
        keys = ["old_log_probs", "advantages", "response_mask", IS_REFERENCE, REF_LOG_PROB]
        keys += [k for k in ("rollout_is_weights",) if k in micro]
        t = padded(micro, *keys)
        ref = t[IS_REFERENCE].bool()
        mask = t["response_mask"].to(lp.dtype)
        for kind, rows in (("rollout", ~ref), ("reference", ref)):
            if not rows.any():
                continue
            if kind == "rollout" and rollout_term is not None:
                loss = rollout_term(lp, t, rows)
            elif kind == "rollout":
                loss, _ = policy_loss(
                    lp[rows],
                    t["old_log_probs"][rows],
                    t["advantages"][rows],
                    mask[rows],
                    clip_low=0.2,
                    clip_high=0.28,
                    dual_clip=3.0,
                )
            else:
                loss, _ = reference_divergence_loss(
                    lp[rows],
                    t[REF_LOG_PROB][rows],
                    mask[rows],
                    settings.divergence,
                    settings.divergence_alpha,
                )
            parts.append((kind, int(mask[rows].sum())))
            losses.append(loss)
    weights = micro_batch_weights(
        [k for k, _ in parts],
        [n for _, n in parts],
        settings.divergence_coef,
        settings.divergence_weighting,
        layout=layout,
    )
    out, i = [], 0
    for micro in micros:
        ref = padded(micro, IS_REFERENCE)[IS_REFERENCE].bool()
        total = 0.0
        for present in (bool((~ref).any()), bool(ref.any())):
            if present:
                total = total + losses[i] * weights[i]
                i += 1
        out.append(total)
    return out


@pytest.mark.parametrize("weighting", ["authors", "paper", "concat"])
@pytest.mark.parametrize(
    ("divergence", "alpha"), [("forward_kl", None), ("js", None), ("alpha", 0.5)]
)
def test_dph_loss_equals_divrl_on_the_same_tensors(weighting, divergence, alpha):
    settings = DivRLVerlSettings(
        divergence=divergence,
        divergence_alpha=alpha,
        divergence_coef=0.2,
        divergence_weighting=weighting,
        reference_store="unused",
        reference_per_step=4,
        authors_gpus=2,
        authors_micro_batch_size=2,
    )
    layout = settings.authors_layout(rollouts=8, mini_batches=1)
    joined, _ = join_rehearsal(rollout_rows(8), reference_samples(4), micro_batch_size=2)
    loss_fn = DivRLLoss(actor_config(), settings, layout)
    micros = micro_batches(joined, 3)  # 12 rows in 4 micro-batches, one of them mixed
    lps, outputs = [], []
    for seed, micro in enumerate(micros):
        _, nested = sequence_log_probs(micro, seed)
        lps.append(no_padding_2_padding(nested, micro))
        outputs.append(loss_fn(model_output={"log_probs": nested}, data=micro, dp_group=None))
    expected = _expected_dph(micros, lps, settings, layout)
    for (loss, metrics), want in zip(outputs, expected, strict=True):
        assert torch.equal(loss, want)
        assert "dph/effective_eta" in metrics
    assert any("dph/divergence" in m for _, m in outputs)
    sum(loss for loss, _ in outputs).backward()  # the graph reaches the log-probs


def test_grpo_through_the_whole_loss_equals_divrl_policy_loss():
    loss_fn = DivRLLoss(actor_config(), DivRLVerlSettings())
    batch = rollout_rows(6)
    total = int(batch["response_mask"].values().sum())
    for micro in micro_batches(batch, 2):
        _, nested = sequence_log_probs(micro)
        lp = no_padding_2_padding(nested, micro)
        t = padded(micro, "old_log_probs", "advantages", "response_mask")
        mask = t["response_mask"].to(lp.dtype)
        loss, _ = loss_fn(model_output={"log_probs": nested}, data=micro)
        want, _ = policy_loss(
            lp,
            t["old_log_probs"],
            t["advantages"],
            mask,
            clip_low=0.2,
            clip_high=0.28,
            dual_clip=3.0,
        )
        assert torch.equal(loss, want * (float(mask.sum()) / total))


def test_the_dph_loss_refuses_a_regrouped_batch():
    settings = DivRLVerlSettings(
        divergence="js",
        divergence_coef=0.2,
        divergence_weighting="paper",
        reference_store="unused",
        reference_per_step=2,
    )
    joined, _ = join_rehearsal(rollout_rows(4), reference_samples(2), micro_batch_size=2)
    (micro,) = micro_batches(joined, 6)
    # a mini-batch of other rows than the join planned: verl's token count differs
    tu.assign_non_tensor(micro, batch_num_tokens=int(micro["batch_num_tokens"]) + 1)
    _, nested = sequence_log_probs(micro)
    with pytest.raises(ValueError, match="regrouped after the join"):
        DivRLLoss(actor_config(), settings)(model_output={"log_probs": nested}, data=micro)


def test_the_authors_weighting_needs_the_layout():
    settings = DivRLVerlSettings(
        divergence="js", divergence_coef=0.2, reference_store="unused", reference_per_step=8
    )
    with pytest.raises(ValueError, match="authors' layout"):
        DivRLLoss(actor_config(), settings)
    assert isinstance(settings.authors_layout(rollouts=16, mini_batches=1), AuthorsLayout)
    bad = DivRLVerlSettings(
        divergence="js",
        divergence_coef=0.2,
        reference_store="unused",
        reference_per_step=8,
        authors_gpus=0,
    )
    with pytest.raises(ValueError, match=r"divrl\.authors_"):
        bad.authors_layout(rollouts=16, mini_batches=1)


def test_dph_composes_the_users_loss_mode_and_verls_importance_weights():
    """DPH-RL's rollout term is verl's registered loss (here gspo) with verl's rollout
    importance weights, aggregated over the micro-batch's rollout rows and weighted as
    divrl train weighs them; the rehearsal rows get weight 1 and their divergence."""
    settings = DivRLVerlSettings(
        divergence="js",
        divergence_coef=0.2,
        divergence_weighting="paper",
        reference_store="unused",
        reference_per_step=4,
    )
    batch = rollout_rows(8)
    r = batch["response_mask"]
    g = torch.Generator().manual_seed(5)
    weights = 0.5 + torch.rand(int(r.offsets()[-1]), generator=g)
    batch["rollout_is_weights"] = torch.nested.nested_tensor_from_jagged(weights, r.offsets())
    joined, layout = join_rehearsal(batch, reference_samples(4), micro_batch_size=2)
    config = actor_config(policy_loss={"loss_mode": "gspo"})
    loss_fn = DivRLLoss(config, settings)
    micros = micro_batches(joined, 3)
    gspo = get_policy_loss_fn("gspo")

    def verls_gspo(lp, t, rows):
        local = actor_config(policy_loss={"loss_mode": "gspo"})
        local.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None)
        loss, _ = gspo(
            old_log_prob=t["old_log_probs"][rows],
            log_prob=lp[rows],
            advantages=t["advantages"][rows],
            response_mask=t["response_mask"][rows].bool(),
            loss_agg_mode="token-mean",
            config=local,
            rollout_is_weights=t["rollout_is_weights"][rows],
        )
        return loss

    lps, outputs = [], []
    for seed, micro in enumerate(micros):
        _, nested = sequence_log_probs(micro, seed)
        lps.append(no_padding_2_padding(nested, micro))
        outputs.append(loss_fn(model_output={"log_probs": nested}, data=micro)[0])
    expected = _expected_dph(micros, lps, settings, None, rollout_term=verls_gspo)
    for ours, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(ours, want, rtol=1e-6, atol=1e-7)
    # the weights are applied: without them the rollout part differs
    unweighted = DivRLLoss(config, settings)
    plain = joined.exclude("rollout_is_weights")
    (first,) = micro_batches(plain, 12)
    (with_w,) = micro_batches(joined, 12)
    _, nested = sequence_log_probs(first, 0)
    a = unweighted(model_output={"log_probs": nested}, data=first)[0]
    b = loss_fn(model_output={"log_probs": nested}, data=with_w)[0]
    assert not torch.allclose(a, b)
    assert config.global_batch_info.get("batch_num_tokens") is None  # restored after the call
    assert layout.rows == 12


def test_dph_after_rejection_sampling_counts_what_verl_counts():
    """verl's rejection sampling zeroes rejected tokens in response_mask but not in
    loss_mask, and verl's global count reads loss_mask: the join's count check reads
    loss_mask too, the stream weights response_mask (the tokens the loss averages)."""
    settings = DivRLVerlSettings(
        divergence="js",
        divergence_coef=0.2,
        divergence_weighting="paper",
        reference_store="unused",
        reference_per_step=2,
    )
    batch = rollout_rows(4)
    r = batch["response_mask"]
    kept = r.values().clone()
    kept[r.offsets()[0] : r.offsets()[1]] = 0  # the first row rejected
    batch["response_mask"] = torch.nested.nested_tensor_from_jagged(kept, r.offsets())
    joined, _ = join_rehearsal(batch, reference_samples(2), micro_batch_size=2)
    (micro,) = micro_batches(joined, 6)  # verl's count: loss_mask tokens
    stream = padded(micro, STREAM)[STREAM][0].tolist()
    assert stream[2] == int(micro["batch_num_tokens"]) > stream[0] + stream[1]
    _, nested = sequence_log_probs(micro)
    loss, metrics = DivRLLoss(actor_config(), settings)(
        model_output={"log_probs": nested}, data=micro
    )
    assert torch.isfinite(loss) and "dph/effective_eta" in metrics


def _rank_micro_batches(joined, dp: int, micro_batch_size: int):
    """Each rank's rows (verl hands rank r the r-th contiguous chunk) cut into micro-batches,
    with verl's global count of the mini-batch's loss tokens."""
    n = len(joined) // dp
    total = int(joined["loss_mask"].values().sum())
    ranks = []
    for r in range(dp):
        rows = tu.index_select_tensor_dict(joined, list(range(r * n, (r + 1) * n)))
        micro = micro_batches(rows, micro_batch_size, dp_size=dp)
        for m in micro:
            tu.assign_non_tensor(m, batch_num_tokens=total)
        ranks.append(micro)
    return ranks


def test_dph_metrics_aggregate_over_ranks_as_token_weighted_means():
    """Micro-batches of one row each: some hold only rollout rows, some only rehearsal rows.
    Every micro-batch logs every name (verl's aggregation over ranks needs as many values
    from each rank), and verl's aggregation gives the means over the part's tokens."""
    from verl.utils.metric import Metric
    from verl.utils.py_functional import append_to_dict

    settings = DivRLVerlSettings(
        divergence="js",
        divergence_coef=0.2,
        divergence_weighting="paper",
        reference_store="unused",
        reference_per_step=3,
    )
    joined, _ = join_rehearsal(rollout_rows(8), reference_samples(3), dp_size=2)
    loss_fn = DivRLLoss(actor_config(), settings)
    per_rank, names = [], set()
    u_sum = u_count = loss_sum = roll_count = 0.0
    for r, micros in enumerate(_rank_micro_batches(joined, dp=2, micro_batch_size=1)):
        gathered: dict = {}
        for i, micro in enumerate(micros):
            _, nested = sequence_log_probs(micro, seed=10 * r + i)
            _, metrics = loss_fn(model_output={"log_probs": nested}, data=micro, dp_group=None)
            names.add(frozenset(metrics))
            append_to_dict(gathered, metrics)
            # the same quantities from the tensors, token by token
            lp = no_padding_2_padding(nested, micro).detach()
            t = padded(micro, "old_log_probs", "advantages", "response_mask", IS_REFERENCE)
            t[REF_LOG_PROB] = padded(micro, REF_LOG_PROB)[REF_LOG_PROB]
            mask = t["response_mask"].bool()
            ref = t[IS_REFERENCE].bool()[:, None] & mask
            roll = ~t[IS_REFERENCE].bool()[:, None] & mask
            u_sum += float(torch.exp(lp - t[REF_LOG_PROB])[ref].sum())
            u_count += float(ref.sum())
            adv, ratio = t["advantages"], torch.exp(lp - t["old_log_probs"])
            clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
            per_token = torch.where(adv < 0, torch.minimum(clipped, -adv * 3.0), clipped)
            loss_sum += float(per_token[roll].sum())
            roll_count += float(roll.sum())
        per_rank.append(gathered)
    assert len(names) == 1  # the same names from every micro-batch of every rank
    aggregated = {k: Metric.aggregate_dp([g[k] for g in per_rank]) for k in per_rank[0]}
    assert aggregated["dph/u_mean"] == pytest.approx(u_sum / u_count, rel=1e-5)
    # the dual-clip PPO loss of the actor config (clip 0.2 / 0.28, c = 3) per rollout token
    assert aggregated["actor/pg_loss"] == pytest.approx(loss_sum / roll_count, rel=1e-4)


def test_divrl_vanilla_divides_by_the_loss_scale_factor_as_verl_vanilla_does():
    """seq-mean-token-sum-norm with actor.loss_scale_factor: verl divides by the factor, not
    by the micro-batch's padded length; so does divrl_vanilla."""
    agg, factor = "seq-mean-token-sum-norm", 40
    config = actor_config(loss_agg_mode=agg, loss_scale_factor=factor)
    batch = rollout_rows(8)
    for micro in micro_batches(batch, 2):
        _, nested = sequence_log_probs(micro)
        lp = no_padding_2_padding(nested, micro)
        t = padded(micro, "old_log_probs", "advantages", "response_mask")
        mask = t["response_mask"].bool()
        config.global_batch_info.update(
            dp_size=1, batch_num_tokens=None, global_batch_size=len(batch)
        )
        config.global_batch_info["loss_scale_factor"] = factor
        args = (t["old_log_probs"], lp, t["advantages"], mask)
        ours, _ = get_policy_loss_fn("divrl_vanilla")(*args, agg, config)
        theirs, _ = get_policy_loss_fn("vanilla")(*args, agg, config)
        assert mask.shape[-1] < factor  # the padded length is not the factor
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
