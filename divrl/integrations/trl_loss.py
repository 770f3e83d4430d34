"""Any registered policy loss inside TRL's ``GRPOTrainer``, by what the loss declares.

A policy loss of :data:`divrl.algorithms.POLICY_LOSSES` declares what it needs on its
options (:class:`divrl.algorithms.loss_options.LossOptions`): ``INPUTS`` (tensors beyond the
log-probs, old log-probs, advantages and mask), ``NEEDS_PROXY``, ``NEEDS_OLD_LOG_PROBS``,
``SCOPED_SELECTION`` and ``needs_full_logits``. This module says which of those TRL's
trainer can give (:data:`TRL_LOSS_INPUTS`), refuses a loss that needs one it cannot
(:func:`trl_capability_problem`, one line naming the capability), resolves the options a
run uses (:func:`resolve_loss_options`: ``clip_low`` / ``clip_high`` / ``agg`` from TRL's
``epsilon`` / ``epsilon_high`` / ``loss_type``) and computes the term the trainer adds to
TRL's loss (:func:`loss_replacement`). Nothing here compares a loss's name.
"""

from __future__ import annotations

from typing import Any

import torch

from divrl.algorithms import policy_loss, policy_loss_spec
from divrl.algorithms.loss_options import LossOptions

__all__ = [
    "REPLACEMENT_LOSS_TYPES",
    "TRL_LOSS_INPUTS",
    "TRL_SETS",
    "loss_replacement",
    "loss_type_scale",
    "resolve_loss_options",
    "trl_capability_problem",
]

#: TRL loss types whose per-token loss is the clipped surrogate the replacement subtracts,
#: with the divrl aggregation that matches TRL's reduction (times :func:`loss_type_scale`)
REPLACEMENT_LOSS_TYPES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "token-mean",
    "dapo": "token-mean",
}

#: loss options TRL's own settings give (divrl's name -> TRL's field), for every loss that
#: declares them: the clipped surrogate the replacement cancels is TRL's, with these values
TRL_SETS = {"clip_low": "epsilon", "clip_high": "epsilon_high", "agg": "loss_type"}

#: the loss inputs (``LossOptions.INPUTS``) the adapter hands a loss, and where they come from
TRL_LOSS_INPUTS = {
    "proxy_log_prob": "the min-p proxy, from the hidden states of a forward TRL runs",
    "log_normalizer": "the proxy's log Z, from the same forward",
    "entropy": "TRL's per-token entropies of the loss forward (compute_entropy=True)",
    "token_weights": "TRL's vLLM importance weights (importance_sampling_ratio), when on",
    "selected": "not given: the loss selects within each micro-batch, on each process",
}


def trl_capability_problem(options: LossOptions) -> str | None:
    """One line naming what the loss of ``options`` needs and TRL's ``GRPOTrainer`` lacks,
    or None when the adapter can run it."""
    label = options.label()
    if options.needs_full_logits:
        return options.FULL_LOGITS_REFUSED or (
            f"{label} needs the full-vocabulary logits of every position, which TRL's "
            "GRPOTrainer does not keep: change its options or run it with `divrl train`"
        )
    missing = [name for name in options.INPUTS if name not in TRL_LOSS_INPUTS]
    if missing:
        return (
            f"{label} takes {missing}, which TRL's GRPOTrainer does not compute (the adapter "
            f"gives {sorted(TRL_LOSS_INPUTS)}): run it with `divrl train`"
        )
    if options.NEEDS_PROXY and "kappa" not in options.names():
        return (
            f"{label} declares NEEDS_PROXY without a kappa option (the proxy's min-p ratio): "
            "add one to its options"
        )
    if "agg" not in options.names():
        return (
            f"{label} has no agg option, which the adapter sets from TRL's loss_type to "
            "reduce the loss as TRL reduces its own: add one to its options"
        )
    return None


def resolve_loss_options(
    name: str, given: dict[str, Any], trl_values: dict[str, Any]
) -> LossOptions:
    """The validated options of policy loss ``name``: ``given`` (the config's
    ``loss_options``), plus each of :data:`TRL_SETS` the loss declares, valued from TRL's
    settings (``trl_values``, keyed by divrl's names).

    Raises:
        ValueError: an unknown loss; an option of :data:`TRL_SETS` in ``given``; an option the
            loss does not take or a value out of bounds (the loss's own message); a capability
            TRL lacks (:func:`trl_capability_problem`).
    """
    from divrl.algorithms import policy_loss_options

    spec = policy_loss_spec(name)  # ValueError listing the registered losses
    taken = sorted(set(given) & set(TRL_SETS))
    if taken:
        raise ValueError(
            f"loss_options {taken}: set them through TRL's "
            f"{[TRL_SETS[k] for k in taken]} (the {name} loss reads them from there)"
        )
    declared = set(spec.options.names())
    from_trl = {k: v for k, v in trl_values.items() if k in declared}
    own = [n for n in spec.options.names() if n not in TRL_SETS]
    try:
        options = policy_loss_options(name, **given, **from_trl)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"loss_options: {exc} ({name}'s options here: {own})") from exc
    problem = trl_capability_problem(options)
    if problem is not None:
        raise ValueError(f"policy_loss={name!r}: {problem}")
    return options


def loss_type_scale(trainer: Any, mask: torch.Tensor, num_items_in_batch: torch.Tensor) -> float:
    """The factor that turns a divrl aggregation (:data:`REPLACEMENT_LOSS_TYPES`) of the
    micro-batch ``mask`` into TRL's reduction of ``trainer.loss_type``, gradient
    accumulation included (TRL's ``_compute_loss``; ``num_items_in_batch`` is the batch's
    key of that name, read by ``dapo``)."""
    rows = mask.shape[0]
    ga = float(trainer.current_gradient_accumulation_steps)
    loss_type = trainer.loss_type
    if loss_type == "grpo":  # divrl leaves out empty rows, TRL counts them as 0
        return float((mask.sum(-1) > 0).sum()) / rows / ga
    if loss_type == "bnpo":
        return 1.0 / ga
    if loss_type == "dr_grpo":
        return float(mask.sum()) / (rows * trainer.max_completion_length) / ga
    # dapo: token sum over the accumulated global batch's token count
    normalizer = num_items_in_batch.clamp(min=1.0) / trainer.accelerator.num_processes
    normalizer = normalizer * ga / trainer.args.steps_per_generation
    return float(mask.sum() / normalizer)


def loss_replacement(
    options: LossOptions,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    available: dict[str, torch.Tensor | None],
    trl_clip: tuple[float, float],
    scale: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``scale * (L_loss - L_clipped)``: the term that turns TRL's loss into the loss of
    ``options``.

    ``L_loss`` is the registered loss (``options.LOSS``) on ``[B, K]`` ``log_probs`` (with
    grad), ``old_log_probs``, ``advantages`` (``[B]``) and ``mask``, with its options as
    keyword arguments and the ``available`` inputs its ``INPUTS`` name (None ones left out);
    ``L_clipped`` is divrl's clipped surrogate with TRL's epsilons (``trl_clip``: its
    ``epsilon_low``, ``epsilon_high``), the options' ``agg`` and
    the same ``token_weights``: TRL's per-token loss, reduced as TRL reduces it when
    multiplied by ``scale`` (:func:`loss_type_scale`). So TRL's loss plus the result is
    ``scale * L_loss`` (plus TRL's other terms: the KL to a reference model, the entropy
    bonus). Returns it and the loss's metrics.
    """
    spec = policy_loss_spec(options.LOSS)
    inputs = {k: available[k] for k in options.INPUTS if available.get(k) is not None}
    value, metrics = spec.fn(
        log_prob=log_probs,
        old_log_prob=old_log_probs,
        advantages=advantages,
        mask=mask,
        **options.loss_kwargs(),
        **inputs,
    )
    clipped, _ = policy_loss(
        log_probs,
        old_log_probs,
        advantages,
        mask,
        clip_low=trl_clip[0],
        clip_high=trl_clip[1],
        agg=options.agg,
        token_weights=available.get("token_weights"),
    )
    return (value - clipped) * scale, dict(metrics)
