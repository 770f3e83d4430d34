"""divrl's losses inside verl's actor: a registered policy loss and a whole-loss function.

Two ways in, both verl's own extension points:

- ``divrl_vanilla``, registered in verl's policy-loss registry
  (``actor_rollout_ref.actor.policy_loss.loss_mode=divrl_vanilla``): the clipped surrogate
  of :func:`divrl.algorithms.policy_loss` with verl's clip range, dual clip and
  aggregation. A registered loss sees only the log-probs, advantages and mask, which is all
  GRPO, DAPO and Dr.GRPO need.
- :class:`DivRLLoss`, installed with the actor worker's ``set_loss_fn`` in place of verl's
  ``ppo_loss``: it also sees the micro-batch's other keys (the rehearsal rows of DPH-RL and
  their stored log-probs) and, called by the engine as its logits processor, the logits
  (Lp-Reg's min-p proxy, computed under no-grad from the forward verl already runs).

verl normalises every micro-batch's loss by the mini-batch's global token (or sequence)
count and multiplies it by the data-parallel size, so that the accumulated gradient is the
mini-batch mean whatever the micro-batching. divrl's losses aggregate over the tensors they
are given; each is multiplied here by its share of the global count (and by the DPH stream
weight from :func:`divrl.algorithms.micro_batch_weights`), which is how ``divrl train``
weighs its micro-batches.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn, kl_penalty, register_policy_loss
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.utils.padding import no_padding_2_padding

from divrl.algorithms import (
    aggregate,
    micro_batch_weights,
    policy_loss,
    policy_loss_spec,
    reference_divergence_loss,
    stream_weights,
)
from divrl.algorithms.dph_weighting import REFERENCE, ROLLOUT, AuthorsLayout
from divrl.algorithms.loss_options import VanillaOptions
from divrl.integrations.verl import keys
from divrl.integrations.verl.lp_reg_proxy import (
    check_megatron_layout,
    check_megatron_parallel,
    minp_proxy,
    next_token_labels,
)
from divrl.integrations.verl.settings import DivRLVerlSettings

SEQ_MODES = ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _clip_range(config: Any) -> tuple[float, float]:
    base = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else base
    high = config.clip_ratio_high if config.clip_ratio_high is not None else base
    return float(low), float(high)


def vanilla_options(config: Any, agg: str) -> VanillaOptions:
    """divrl's options of the clipped surrogate from verl's actor keys."""
    low, high = _clip_range(config)
    return VanillaOptions(
        clip_low=low, clip_high=high, dual_clip=float(config.get("clip_ratio_c", 3.0)), agg=agg
    )


def global_share(mask: torch.Tensor, agg: str, info: dict) -> float:
    """This micro-batch's share of the mini-batch's count (all ranks), times the DP size.

    ``info`` is verl's ``global_batch_info`` (``dp_size``, ``batch_num_tokens``,
    ``global_batch_size``); without a global count (a lone call outside verl's engine) the
    micro-batch is the whole batch: 1.
    """
    dp = int(info.get("dp_size") or 1)
    if agg == "token-mean":
        total, local = info.get("batch_num_tokens"), float(mask.sum())
    elif agg in SEQ_MODES:
        total, local = info.get("global_batch_size"), float((mask.sum(-1) > 0).sum())
    else:
        raise ValueError(f"loss_agg_mode={agg!r}: divrl's losses take {('token-mean', *SEQ_MODES)}")
    if total is None:
        if dp > 1:
            raise ValueError("verl gave no global batch count with dp_size > 1")
        return 1.0
    return local / float(total) * dp


def _verl_pg_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """divrl's surrogate metrics under the names verl's vanilla loss logs."""
    names = {
        "pg/clip_frac": "actor/pg_clipfrac",
        "pg/approx_kl": "actor/ppo_kl",
        "pg/dual_clip_frac": "actor/pg_clipfrac_lower",
    }
    return {verl: metrics[ours] for ours, verl in names.items() if ours in metrics}


@register_policy_loss("divrl_vanilla")  # type: ignore[arg-type]
def divrl_vanilla_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's policy-loss signature over :func:`divrl.algorithms.policy_loss`.

    Equals ``policy_loss(...) * global_share(...)``: divrl's clipped surrogate aggregated
    over this micro-batch, weighted by its share of verl's global count (and divided by
    ``actor.loss_scale_factor`` instead of the padded length under
    ``seq-mean-token-sum-norm``, as verl's aggregation does: :func:`horizon_scale`).
    """
    if config is None:
        raise ValueError("divrl_vanilla needs verl's actor config (clip_ratio_*, clip_ratio_c)")
    if rollout_is_weights is not None:
        raise ValueError(
            "divrl_vanilla does not apply rollout-correction importance weights: switch "
            "algorithm.rollout_correction off or use loss_mode=vanilla"
        )
    options = vanilla_options(config, loss_agg_mode)
    info = _batch_info(config)
    loss, metrics = policy_loss(
        log_prob, old_log_prob, advantages, response_mask, **options.loss_kwargs()
    )
    share = global_share(response_mask, loss_agg_mode, info)
    share *= horizon_scale(config, loss_agg_mode, response_mask)
    return loss * share, _verl_pg_metrics(metrics)


def _batch_info(config: Any) -> dict:
    return dict(config.global_batch_info)


def horizon_scale(config: Any, agg: str, mask: torch.Tensor) -> float:
    """The factor that turns divrl's ``seq-mean-token-sum-norm`` (divided by the padded
    length ``T`` of the rows given) into verl's under ``actor.loss_scale_factor = L``
    (divided by ``L``): ``T / L``; 1 for the other aggregations or without ``L``.

    verl's ``agg_loss``: ``sum_i sum_t L_it m_it / (B * L)``; divrl's ``aggregate``:
    ``sum_i sum_t L_it m_it / (B * T)``, so verl's = divrl's * ``T / L``.
    """
    factor = getattr(config, "loss_scale_factor", None)
    if agg != "seq-mean-token-sum-norm" or factor is None:
        return 1.0
    return mask.shape[-1] / float(factor)


def _stream_weights(
    stream: torch.Tensor,
    n_roll: int,
    n_ref: int,
    eta: float,
    mode: str,
    layout: AuthorsLayout | None,
) -> tuple[float, float, float]:
    """(rollout weight, reference weight, effective eta) of this micro-batch's two parts.

    ``stream`` holds the mini-batch's ``(N_rollout, N_reference, N_loss_mask)`` tokens (all
    ranks; the first two count ``response_mask``, the tokens the loss averages). The
    weights come from :func:`micro_batch_weights` over a list with the mini-batch's
    per-kind token sums, so they are the very numbers ``divrl train`` computes for a
    micro-batch of each kind with these token counts.
    """
    total_roll, total_ref = (int(v) for v in stream.tolist()[:2])
    kinds = [ROLLOUT, REFERENCE, ROLLOUT, REFERENCE]
    tokens = [n_roll, n_ref, total_roll - n_roll, total_ref - n_ref]
    if min(tokens) < 0:
        raise ValueError(
            f"a micro-batch holds more tokens ({n_roll} rollout, {n_ref} reference) than its "
            f"mini-batch's stream statistics ({total_roll}, {total_ref}): the rows were "
            "regrouped after divrl's rehearsal join (set actor_rollout_ref.actor.shuffle="
            "False)"
        )
    weights = micro_batch_weights(kinds, tokens, eta, mode, layout=layout)
    effective = stream_weights(kinds, tokens, eta, mode, layout=layout).effective_eta
    return weights[0], weights[1], effective


def _batch_temperature(data: Any) -> float:
    """The micro-batch's one sampling temperature (Lp-Reg takes one per batch)."""
    temperature = tu.get(data, key="temperature", default=1.0)
    if isinstance(temperature, torch.Tensor):
        first = temperature.flatten()[0]
        if not bool((temperature == first).all()):
            raise ValueError("Lp-Reg in verl takes one sampling temperature for the batch")
        temperature = first
    return float(temperature)


def verl_policy_term(
    config: Any,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    agg: str,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The user's ``policy_loss.loss_mode`` from verl's registry on the rows given,
    aggregated over them alone (verl's global count switched off for the call), with
    verl's rollout importance weights applied by verl's function when the batch has them.

    The caller weighs the result as ``divrl train`` weighs a micro-batch of its kind.
    """
    fn = get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))
    info = config.global_batch_info
    saved = dict(info)
    info.clear()
    info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None)
    info["loss_scale_factor"] = config.loss_scale_factor
    try:
        loss, metrics = fn(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=mask.bool(),
            loss_agg_mode=agg,
            config=config,
            rollout_is_weights=rollout_is_weights,
        )
    finally:
        info.clear()
        info.update(saved)
    out = {k: float(v) if torch.is_tensor(v) else v for k, v in metrics.items()}
    out["actor/pg_loss"] = float(loss.detach())
    return loss, out


class DivRLLoss:
    """verl's actor loss with divrl's policy loss, DPH-RL rehearsal and Lp-Reg.

    Install it on the actor workers with ``set_loss_fn`` (the trainer of
    :mod:`divrl.integrations.verl.trainer` does). Called as verl calls a loss,
    ``(model_output=, data=, dp_group=)``, it returns ``(loss, metrics)``; called as the
    engine's logits processor, ``(student_logits=, data=)``, it returns Lp-Reg's proxy
    log-prob and log Z per token (under no-grad).

    Per micro-batch: the rollout rows get divrl's policy loss (plus verl's KL and entropy
    terms when its keys switch them on), the rehearsal rows (``divrl_is_reference``) eta
    times :func:`divrl.algorithms.reference_divergence_loss` on their stored log-probs
    (``divrl_ref_log_prob``), each part weighted as ``divrl train`` weighs a micro-batch of
    its kind, times verl's data-parallel size.
    """

    def __init__(
        self, config: Any, settings: DivRLVerlSettings, authors_layout: AuthorsLayout | None = None
    ) -> None:
        self.config, self.settings, self.layout = config, settings, authors_layout
        if settings.dph and settings.divergence_weighting == "authors" and authors_layout is None:
            raise ValueError(
                "divrl.divergence_weighting=authors needs the authors' layout "
                "(DivRLVerlSettings.authors_layout(rollouts, mini_batches))"
            )
        self.agg = config.loss_agg_mode
        if settings.dph and self.agg != "token-mean":
            raise ValueError(
                "DPH-RL in verl takes actor.loss_agg_mode=token-mean (the weightings count "
                f"tokens), got {self.agg!r}"
            )
        # divrl's policy loss (None: the user's verl loss_mode is the policy term), with
        # verl's clip range, dual clip and aggregation where its options declare them
        self.options, self.loss_fn = None, None
        if settings.policy_loss is not None:
            low, high = _clip_range(config)
            dual = float(config.get("clip_ratio_c", 3.0))
            self.options = settings.policy_options(
                clip_low=low, clip_high=high, dual_clip=dual, agg=self.agg
            )
            self.loss_fn = policy_loss_spec(settings.policy_loss).fn
            if self.needs_proxy:
                check_megatron_layout(config)

    @property
    def needs_proxy(self) -> bool:
        """The policy loss declares it needs pi_old's min-p proxy (``NEEDS_PROXY``)."""
        return self.options is not None and self.options.NEEDS_PROXY

    # ------------------------------------------------------------------ logits processor

    @torch.no_grad()
    def logits_outputs(
        self, student_logits: torch.Tensor, data: Any, data_format: str | None = None
    ) -> dict[str, torch.Tensor]:
        """Lp-Reg's proxy log-prob of each next token and log Z, shaped like the logits
        without their vocabulary dimension (FSDP: ``[1, positions]``; Megatron: ``[1,
        positions]`` for ``data_format="thd"``, ``[batch, padded length]`` for ``"bshd"``).

        verl passes the logits already divided by the temperature, in its engine's dtype;
        the min-p filter is on the untempered probabilities (divrl's and the authors'
        convention), which :func:`minp_proxy` applies as a threshold on the tempered ones.
        The proxy walks the logits in chunks of rows (no fp32 copy of the whole tensor).
        """
        if not self.needs_proxy:
            return {}
        if int(tu.get_non_tensor_data(data=data, key="sp_size", default=1)) > 1:
            raise ValueError("Lp-Reg in verl does not support Ulysses sequence parallelism yet")
        if data_format is not None:
            check_megatron_parallel()
        labels = next_token_labels(student_logits, data["input_ids"], data_format)
        proxy, log_z = minp_proxy(
            student_logits.reshape(-1, student_logits.shape[-1]),
            labels.reshape(-1),
            self.options.kappa,
            _batch_temperature(data),
        )
        lead = student_logits.shape[:-1]
        return {keys.PROXY_LOG_PROB: proxy.reshape(lead), keys.LOG_NORMALIZER: log_z.reshape(lead)}

    # ------------------------------------------------------------------ the loss

    def __call__(
        self, model_output=None, data=None, dp_group=None, student_logits=None, data_format=None
    ):
        """verl's loss call, or its logits-processor call: FSDP's ``(student_logits=,
        data=)`` or Megatron's ``(student_logits=, data=, data_format=)``."""
        if student_logits is not None:
            return self.logits_outputs(student_logits, data, data_format)
        return self.loss(model_output, data)

    def loss(self, model_output: dict, data: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """(loss, metrics) of one micro-batch (verl's ``ppo_loss`` contract).

        In the old-log-prob pass (no advantages yet) the engine calls it only because it is
        the logits processor there: that pass gets a zero loss and no metrics.
        """
        if "advantages" not in data.keys():  # noqa: SIM118 (TensorDict keys)
            values = model_output["log_probs"]
            device = (values.values() if values.is_nested else values).device
            return torch.zeros((), device=device), {}
        info = {
            "dp_size": data["dp_size"],
            "batch_num_tokens": data["batch_num_tokens"],
            "global_batch_size": data["global_batch_size"],
        }
        tensors = self._padded(model_output, data)
        mask = tensors["response_mask"]
        is_ref = tensors.get(keys.IS_REFERENCE, torch.zeros(mask.shape[0], dtype=torch.bool)).bool()
        is_ref = is_ref.to(mask.device)
        roll = ~is_ref
        metrics: dict[str, Any] = {}
        total = tensors["log_prob"].sum() * 0.0  # keeps the graph when a part is empty
        if not self.settings.dph:
            if bool(is_ref.any()):
                raise ValueError("the batch holds rehearsal rows but divrl.divergence is unset")
            part, part_metrics = self._rollout_part(tensors, roll)
            share = global_share(mask[roll].float(), self.agg, info)
            return total + part * share, _as_metrics(part_metrics)
        if "divrl_stream" not in tensors:
            raise ValueError(
                f"DPH-RL needs the rehearsal join's {keys.STREAM!r} key in the batch "
                "(divrl.integrations.verl.rehearsal.join_rehearsal)"
            )
        n_roll, n_ref = int(mask[roll].sum()), int(mask[is_ref].sum())
        self._check_counts(tensors[keys.STREAM][0], info)
        # the rehearsal controller's eta of this step, written on every row by the join
        eta = float(tensors[keys.ETA][0]) if keys.ETA in tensors else self.settings.divergence_coef
        w_roll, w_ref, effective = _stream_weights(
            tensors[keys.STREAM][0],
            n_roll,
            n_ref,
            eta,
            self.settings.divergence_weighting,
            self.layout,
        )
        dp = int(info["dp_size"] or 1)
        stream = [int(v) for v in tensors[keys.STREAM][0].tolist()[:2]]
        for rows, weight, part_fn, n_total in (
            (roll, w_roll, self._rollout_part, stream[0]),
            (is_ref, w_ref, self._reference_part, stream[1]),
        ):
            if bool(rows.any()):
                part, part_metrics = part_fn(tensors, rows)
                total = total + part * (weight * dp)
            else:  # the part's metric names, from its terms on this micro-batch masked out
                _, part_metrics = part_fn({**tensors, "response_mask": mask * 0}, rows | True)
            n_tokens = int(mask[rows].sum())
            metrics.update(_token_weighted(part_metrics, n_tokens, n_total, dp))
        metrics["dph/effective_eta"] = effective
        return total, _as_metrics(metrics)

    def _check_counts(self, stream: torch.Tensor, info: dict) -> None:
        verl_total = info.get("batch_num_tokens")
        ours = int(stream[2])  # loss_mask tokens: what verl counts (after rejection
        # sampling verl's response_mask has fewer; the weights use response_mask)
        if verl_total is not None and int(verl_total) != ours:
            raise ValueError(
                f"verl counts {int(verl_total)} loss tokens in this mini-batch but divrl's "
                f"rehearsal join planned {ours}: the rows were regrouped after the join (set "
                "actor_rollout_ref.actor.shuffle=False, and join with the mini-batch and "
                "data-parallel sizes of the update)"
            )

    def _padded(self, model_output: dict, data: Any) -> dict[str, torch.Tensor]:
        out = {"log_prob": no_padding_2_padding(model_output["log_probs"], data)}
        if "entropy" in model_output and model_output["entropy"] is not None:
            out["entropy"] = no_padding_2_padding(model_output["entropy"], data)
        for key in (keys.PROXY_LOG_PROB, keys.LOG_NORMALIZER):
            if key in model_output:
                out[key] = no_padding_2_padding(model_output[key], data)
        fields = ["response_mask", "old_log_probs", "advantages"]
        fields += [
            k
            for k in (
                keys.IS_REFERENCE,
                keys.REF_LOG_PROB,
                keys.STREAM,
                keys.ETA,
                "ref_log_prob",
                "rollout_is_weights",
            )
            if k in data
        ]
        fields += [
            k for k in (keys.PROXY_LOG_PROB, keys.LOG_NORMALIZER) if k in data and k not in out
        ]
        padded = data.select(*fields).to_padded_tensor()
        out.update({k: padded[k] for k in fields})
        out["response_mask"] = out["response_mask"].to(out["log_prob"].dtype)
        return out

    def _rollout_part(self, t: dict, rows: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """divrl's policy loss (+ verl's KL and entropy terms) on the rollout rows."""
        lp, mask = t["log_prob"][rows], t["response_mask"][rows]
        old, adv = t["old_log_probs"][rows], t["advantages"][rows]
        if self.options is not None:
            loss, metrics = self._divrl_policy_term(t, rows)
        else:
            weights = t["rollout_is_weights"][rows] if "rollout_is_weights" in t else None
            loss, metrics = verl_policy_term(self.config, lp, old, adv, mask, self.agg, weights)
        config = self.config
        if config.use_kl_loss:
            kld = kl_penalty(
                logprob=lp, ref_logprob=t["ref_log_prob"][rows], kl_penalty=config.kl_loss_type
            )
            kl = aggregate(kld, mask, self.agg) * horizon_scale(config, self.agg, mask)
            loss = loss + config.kl_loss_coef * kl
            metrics["kl_loss"] = float(kl.detach())
        if config.entropy_coeff and "entropy" in t:
            ent = aggregate(t["entropy"][rows], mask, self.agg)
            ent = ent * horizon_scale(config, self.agg, mask)
            loss = loss - config.entropy_coeff * ent
            metrics["entropy_loss"] = float(ent.detach())
        return loss, metrics

    def _divrl_policy_term(self, t: dict, rows: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """divrl's registered policy loss on the rollout rows, given the inputs its options
        declare (``INPUTS``) among those the plugin has: pi_old's proxy (``NEEDS_PROXY``) and
        verl's rollout importance weights as ``token_weights``."""
        mask = t["response_mask"][rows]
        inputs: dict[str, torch.Tensor] = {}
        if self.needs_proxy:
            if keys.PROXY_LOG_PROB not in t:
                raise ValueError(
                    f"divrl.policy_loss={self.settings.policy_loss} needs the proxy log-probs: "
                    "the engine computes them from its logits when the batch sets "
                    "distillation_use_topk=True (trainer.v1.trainer_mode=divrl_sync does) and "
                    "actor_rollout_ref.model.use_fused_kernels=False (fused kernels never "
                    "materialise the logits); see docs/verl.md"
                )
            inputs["proxy_log_prob"] = t[keys.PROXY_LOG_PROB][rows]
            if keys.LOG_NORMALIZER in t:
                inputs["log_normalizer"] = t[keys.LOG_NORMALIZER][rows]
        if "rollout_is_weights" in t:
            # verl's rollout IS weights on the per-token loss, as its vanilla loss has them
            inputs["token_weights"] = t["rollout_is_weights"][rows]
        loss, metrics = self.loss_fn(
            log_prob=t["log_prob"][rows],
            old_log_prob=t["old_log_probs"][rows],
            advantages=t["advantages"][rows],
            mask=mask,
            **self.options.loss_kwargs(),
            **{k: v for k, v in inputs.items() if k in self.options.INPUTS},
        )
        scale = horizon_scale(self.config, self.agg, mask)  # actor.loss_scale_factor
        # verl's own names for the policy loss too, where verl users' dashboards look
        pg = float(metrics.get("pg/loss", loss.detach())) * scale
        return loss * scale, {**metrics, **_verl_pg_metrics(metrics), "actor/pg_loss": pg}

    def _reference_part(self, t: dict, rows: torch.Tensor) -> tuple[torch.Tensor, dict]:
        s = self.settings
        loss, metrics = reference_divergence_loss(
            t["log_prob"][rows],
            t[keys.REF_LOG_PROB][rows],
            t["response_mask"][rows],
            s.divergence,
            s.divergence_alpha,
            self.agg,
        )
        return loss, metrics


def _token_weighted(metrics: dict[str, Any], n_tokens: int, n_total: int, dp: int) -> dict:
    """One part's per-micro-batch metrics as verl SUM metrics whose aggregate is their mean
    over the mini-batch weighted by the part's tokens.

    With rehearsal rows a micro-batch may hold one part or both, so a part's metrics would
    exist on some micro-batches only, and verl's aggregation over ranks requires every rank
    to log each name the same number of times. Every micro-batch therefore logs every name:
    ``m * n * dp / N`` (``n`` of the mini-batch's ``N`` tokens of the part, all ranks), 0
    where it holds none of the part. verl sums a SUM metric over micro-batches and averages
    it over ranks, which gives ``sum_i m_i n_i / N``. A mini-batch without the part (``N =
    0``) logs none of its names on any rank.
    """
    if n_total <= 0:
        return {}
    share = n_tokens * dp / n_total
    return {
        k: Metric(value=float(v) * share if n_tokens else 0.0, aggregation=AggregationType.SUM)
        for k, v in metrics.items()
    }


def _as_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Per-micro-batch floats, averaged over micro-batches and ranks by verl."""
    return {
        k: v if isinstance(v, Metric) else Metric(value=float(v), aggregation=AggregationType.MEAN)
        for k, v in metrics.items()
    }
