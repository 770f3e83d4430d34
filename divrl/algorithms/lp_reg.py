"""Lp-Reg: protect low-probability tokens by regularising toward a min-p proxy of the policy.

Proxy at each position, with ``p = softmax(logits)`` of the rollout policy: keep the tokens
with ``p_v >= kappa * max_v p_v`` and renormalise over them, ``proxy(v) = p_v / Z`` for kept
``v`` (0 otherwise), ``Z = sum of kept p_v``. As in the authors' code, the filter uses the
untempered probabilities and the kept logits are then divided by the temperature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from divrl.algorithms._utils import (
    K3_VALUE_CLAMP,
    as_fp32,
    broadcast_advantages,
    check_same_shape,
    clamp_log_ratio,
    clamped_ratio,
    float_mask,
    k3,
    masked_mean,
    to_float,
)
from divrl.algorithms.aggregation import aggregate
from divrl.algorithms.logits import FILTERED_LOG_PROB, map_rows, validate_logits
from divrl.algorithms.loss_options import LpRegOptions
from divrl.algorithms.policy_loss import clipped_surrogate, register_policy_loss, surrogate_metrics


def _check_kappa(kappa: float) -> None:
    # The bound is declared once, in LpRegOptions; building it validates kappa.
    LpRegOptions(kappa=kappa)


def _kept_and_scaled(rows: torch.Tensor, kappa: float, temperature: float):
    x = rows.float()
    # p_v >= kappa * max p  <=>  logit_v - max logit >= log kappa (kappa = 0 keeps all).
    threshold = x.amax(-1, keepdim=True) + (math.log(kappa) if kappa > 0 else -math.inf)
    keep = x >= threshold
    xt = x / temperature
    lse_all = torch.logsumexp(xt, -1)
    log_z = torch.logsumexp(xt.masked_fill(~keep, -math.inf), -1) - lse_all
    return keep, xt, lse_all, log_z


@torch.no_grad()
def minp_log_normalizer(
    logits: torch.Tensor,
    kappa: float,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """``log Z`` of the min-p proxy at every position (detached).

    ``Z = sum_{v kept} softmax(logits / T)_v`` with ``v`` kept iff
    ``softmax(logits)_v >= kappa * max softmax(logits)`` (filter on untempered probabilities,
    as the authors' code does). ``Z`` is in (0, 1], so ``log Z <= 0``; the max token is
    always kept.

    Args:
        logits: ``[..., vocab]`` logits of the rollout policy (fp32 or bf16).
        kappa: min-p ratio in [0, 1] (paper: 0.02).
        temperature: sampling temperature.
        chunk_size: positions per chunk, so a ``[batch, len, 152064]`` input never needs a
            second full-size fp32 copy.

    Returns:
        ``[...]`` fp32.
    """
    _check_kappa(kappa)
    validate_logits(logits, None, temperature)

    def fn(rows: torch.Tensor) -> torch.Tensor:
        return _kept_and_scaled(rows, kappa, temperature)[3]

    return map_rows(fn, logits, chunk_size=chunk_size)


@torch.no_grad()
def proxy_log_prob(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    kappa: float,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Log-probability of each sampled token under the min-p proxy (detached).

    For a kept token ``log proxy = log softmax(logits / T)[token] - log Z``; a filtered token
    gets :data:`FILTERED_LOG_PROB` (the most negative fp32), which the Lp-Reg selection
    ``lp < proxy`` can never pick and which keeps every loss finite.

    Args:
        logits: ``[..., vocab]`` of the policy whose proxy is wanted (on-policy: the current
            forward; off-policy: the forward that computed the old log-probs).
        tokens: ``[...]`` sampled token ids.
        kappa, temperature, chunk_size: see :func:`minp_log_normalizer`.

    Returns:
        ``[...]`` fp32.
    """
    _check_kappa(kappa)
    validate_logits(logits, tokens, temperature)

    def fn(rows: torch.Tensor, toks: torch.Tensor) -> torch.Tensor:
        keep, xt, lse_all, log_z = _kept_and_scaled(rows, kappa, temperature)
        idx = toks.long().unsqueeze(-1)
        lp = xt.gather(-1, idx).squeeze(-1) - lse_all
        kept = keep.gather(-1, idx).squeeze(-1)
        return torch.where(kept, lp - log_z, torch.full_like(lp, FILTERED_LOG_PROB))

    return map_rows(fn, logits, tokens, chunk_size=chunk_size)


@torch.no_grad()
def proxy_log_prob_rows(
    logits: torch.Tensor, kappa: float, temperature: float = 1.0
) -> torch.Tensor:
    """The whole proxy distribution ``[..., vocab]`` in log space (filtered entries get
    :data:`FILTERED_LOG_PROB`), for the full-vocabulary option of :func:`lp_reg_loss`."""
    _check_kappa(kappa)
    validate_logits(logits, None, temperature)
    keep, xt, lse_all, log_z = _kept_and_scaled(logits, kappa, temperature)
    rows = xt - (lse_all + log_z).unsqueeze(-1)
    return rows.masked_fill(~keep, FILTERED_LOG_PROB)


def _full_vocab_kl(proxy_rows: torch.Tensor, policy_rows: torch.Tensor) -> torch.Tensor:
    """``KL(proxy || pi) = sum_v proxy_v (log proxy_v - log pi_v)`` over kept ``v``."""
    log_q = as_fp32(proxy_rows.detach())
    kept = log_q > FILTERED_LOG_PROB
    q = torch.where(kept, torch.exp(log_q), torch.zeros_like(log_q))
    diff = torch.where(kept, log_q - as_fp32(policy_rows), torch.zeros_like(log_q))
    return (q * diff).sum(-1)


def _select_lowest(
    lp: torch.Tensor, candidates: torch.Tensor, rho: float, min_k: int
) -> tuple[torch.Tensor, float]:
    """The ``k = max(1, floor(rho * N_neg))`` candidates of lowest ``lp`` (none when
    ``k < min_k``) and the probability of the highest of them."""
    num_negative = int(candidates.sum())
    k = max(1, math.floor(rho * num_negative))
    selected = torch.zeros_like(candidates)
    if num_negative == 0 or k < min_k:
        return selected, 0.0
    scores = torch.where(candidates, lp, torch.full_like(lp, math.inf))
    lowest = torch.topk(scores.reshape(-1), k, largest=False)
    selected.view(-1)[lowest.indices] = True
    return selected, to_float(torch.exp(lowest.values.max()))


@dataclass(frozen=True)
class LpRegSelection:
    """Which tokens Lp-Reg acts on (all ``[batch, len]`` bool) and the selection threshold."""

    candidates: torch.Tensor  # valid tokens with a negative advantage
    selected: torch.Tensor  # the rho-share of candidates with the lowest log-prob
    regularized: torch.Tensor  # selected tokens below their proxy log-prob (kept by min-p)
    threshold: float  # probability of the highest selected token (0 when none)


def lp_reg_selection(
    log_prob: torch.Tensor,
    proxy_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rho: float = LpRegOptions.rho,
    min_k: int = LpRegOptions.min_k,
    selected: torch.Tensor | None = None,
) -> LpRegSelection:
    """Steps 1-3 of :func:`lp_reg_loss`: candidates, the selected and regularised tokens.

    Args: as :func:`lp_reg_loss` (``log_prob`` is used detached). Public so that an
    analysis can see the very tokens the loss regularises (``experiments/lp_reg_tokens.py``).
    """
    lp = as_fp32(log_prob).detach()
    adv = broadcast_advantages(advantages, lp)
    candidates = (float_mask(mask, lp) > 0) & (adv < 0)
    if selected is not None:
        selected = selected.to(candidates.device).bool() & candidates
        picked = lp[selected]
        threshold = to_float(torch.exp(picked.max())) if picked.numel() else 0.0
    else:
        selected, threshold = _select_lowest(lp, candidates, rho, min_k)
    regularized = selected & (lp < as_fp32(proxy_log_prob.detach()))
    return LpRegSelection(candidates, selected, regularized, threshold)


#: quantiles of the regime diagnostics (``lp_reg/reg_z_q10`` ...)
REGIME_QUANTILES = (0.1, 0.5, 0.9)


REGIME_SERIES = ("reg_z", "reg_abs_adv", "net_push")


def _summaries(series: torch.Tensor) -> dict[str, float]:
    """``lp_reg/<name>_mean`` and ``_q10/_q50/_q90`` of the rows :data:`REGIME_SERIES` of
    ``series`` ``[4, n]`` (its last row: 1 where the net push is upward), the share and count
    of upward pushes; all 0 when ``n = 0``. One device-to-host copy."""
    n = series.shape[1]
    stats = ("mean", *(f"q{round(q * 100)}" for q in REGIME_QUANTILES))
    if n:
        qs = torch.tensor(REGIME_QUANTILES, dtype=series.dtype, device=series.device)
        table = torch.cat(
            [series[:3].mean(1, keepdim=True), torch.quantile(series[:3], qs, 1).T], 1
        )
        *flat, up = torch.cat([table.flatten(), series[3].sum().reshape(1)]).tolist()
    else:
        flat, up = [0.0] * (len(REGIME_SERIES) * len(stats)), 0.0
    names = [f"lp_reg/{name}_{stat}" for name in REGIME_SERIES for stat in stats]
    out = dict(zip(names, map(float, flat), strict=True))
    out["lp_reg/net_up_share"] = up / n if n else 0.0
    out["lp_reg/num_net_up"] = float(up)
    return out


@torch.no_grad()
def lp_reg_net_push(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    proxy_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    regularized: torch.Tensor,
    beta: float,
    log_normalizer: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Z, |A|, net push)``, each ``[n]``, of the ``n`` regularised tokens (row-major).

    A regularised token's loss ``-A r + beta k3(D)``, ``r = exp(lp - old)``, ``D = proxy -
    lp``, has ``-d loss / d lp = A r + beta (exp(D) - 1)`` (0 for the k3 part where its value
    clamp at 10 is active). With ``A < 0`` this is the net push on the token's log-prob:
    ``-|A| r`` down, ``beta (exp(D) - 1)`` up. On-policy (``r = 1``, ``D = -log Z``) it is
    ``-|A| + beta (1/Z - 1)``: upward iff ``Z < beta / (beta + |A|)``. Off-policy the proxy
    is frozen at the rollout policy's, so the pull grows as ``exp(D) - 1`` while lp falls.

    ``Z`` is the min-p kept mass at the token's position under the policy the proxy came
    from: ``exp(log_normalizer)`` when given, else ``exp(old - proxy)`` (the same for a kept
    token when the proxy and ``old`` come from one forward). Arguments as
    :func:`lp_reg_loss`'s; ``regularized`` is :class:`LpRegSelection`'s mask.
    """
    idx = regularized.reshape(-1).nonzero().squeeze(1)  # one index for every tensor

    def at(t: torch.Tensor) -> torch.Tensor:
        return as_fp32(t.detach()).reshape(-1).index_select(0, idx)

    lp, old, proxy = at(log_prob), at(old_log_prob), at(proxy_log_prob)
    adv = at(broadcast_advantages(advantages, log_prob))
    log_z = at(log_normalizer) if log_normalizer is not None else old - proxy
    d = proxy - lp
    _, ratio = clamped_ratio(lp - old)
    dc = clamp_log_ratio(d)
    pull = torch.expm1(dc)
    pull = torch.where(pull - dc < K3_VALUE_CLAMP, pull, torch.zeros_like(pull))
    return torch.exp(log_z), adv.abs(), adv * ratio + beta * pull


@torch.no_grad()
def lp_reg_regime_metrics(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    proxy_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    regularized: torch.Tensor,
    beta: float,
    log_normalizer: torch.Tensor | None = None,
) -> dict[str, float]:
    """Where the regulariser sits: :func:`lp_reg_net_push`'s push vs pull, summarised.

    Returns (each over the regularised tokens, 0 when there are none; in a trainer, the
    mean over its micro-batches): ``lp_reg/reg_z_*``, ``lp_reg/reg_abs_adv_*``,
    ``lp_reg/net_push_*`` (``_mean``, ``_q10``, ``_q50``, ``_q90``), ``lp_reg/net_up_share``
    (share with an upward net push) and ``lp_reg/num_net_up`` (their count, summed over a
    step like ``lp_reg/num_regularized``, so the step's exact share is the ratio of the two).
    """
    z, abs_adv, net = lp_reg_net_push(
        log_prob, old_log_prob, proxy_log_prob, advantages, regularized, beta, log_normalizer
    )
    return _summaries(torch.stack([z, abs_adv, net, (net > 0).to(net)]))


@register_policy_loss("lp_reg", LpRegOptions)
def lp_reg_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    proxy_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rho: float = LpRegOptions.rho,
    beta: float = LpRegOptions.beta,
    clip_low: float = LpRegOptions.clip_low,
    clip_high: float = LpRegOptions.clip_high,
    agg: str = LpRegOptions.agg,
    min_k: int = LpRegOptions.min_k,
    log_normalizer: torch.Tensor | None = None,
    full_vocab: bool = LpRegOptions.full_vocab,
    proxy_rows: torch.Tensor | None = None,
    policy_rows: torch.Tensor | None = None,
    selected: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Lp-Reg policy loss (the authors' code semantics).

    1. Candidates: valid tokens of the batch passed in with ``A < 0``; ``N_neg`` of them.
    2. ``k = max(1, floor(rho * N_neg))``; the ``k`` candidates with the lowest current
       log-prob (detached) are *selected*. The authors' code skips the whole regulariser
       when ``k <= 1``: that is ``min_k = 2`` (set ``min_k = 1`` for the paper's text).
    3. Selected tokens with ``lp < log proxy`` are *regularised* (this drops filtered tokens,
       and off-policy also tokens already above their proxy probability). Their clipped term
       is replaced by ``-A * r + beta * clamp(exp(D) - D - 1, -10, 10)``, ``D = proxy - lp``
       (the k3 estimator, on the sampled token only, of KL(pi || proxy): for tokens drawn
       from pi, ``E[exp(D) - D - 1] = KL(pi || proxy)`` when the proxy covers pi's support,
       i.e. the reverse of the paper's direction).
    4. Every other token keeps the clipped surrogate with range ``[1 - clip_low,
       1 + clip_high]`` (defaults: lower clip off, upper bound 10).

    Paper vs code: the paper's equation uses the full-vocabulary ``KL(proxy || pi_theta)``
    (the direction the sampled k3 term does not estimate); ``full_vocab=True`` does that, taking ``proxy_rows`` (from :func:`proxy_log_prob_rows`)
    and ``policy_rows`` (log pi_theta rows, carrying the gradient), both ``[batch, len,
    vocab]``, with the same selection.

    Args:
        log_prob, old_log_prob: ``[batch, len]``; on-policy ``old = lp.detach()`` (r = 1).
        proxy_log_prob: ``[batch, len]`` from :func:`proxy_log_prob` (detached).
        advantages: ``[batch]`` or ``[batch, len]``.
        mask: ``[batch, len]``.
        rho: the selected share of negative-advantage tokens (paper: 0.01; 0.005 for 32B).
        beta: penalty weight (paper: 1).
        log_normalizer: optional ``[batch, len]`` ``log Z`` for the ``lp_reg/mean_z`` metric.
        selected: optional ``[batch, len]`` bool, a selection made over a larger population
            than this batch (the trainer's ``algorithm.lp_reg_scope``: a mini-batch or step);
            it replaces step 2 (``rho`` and ``min_k`` were applied to that population), and
            is intersected with this batch's candidates.
        token_weights: optional ``[batch, len]`` or ``[batch, 1]`` detached factors on the
            per-token loss before aggregation (the aggregation's denominators stay the
            mask's): a rollout engine's truncated importance-sampling weights, applied as
            TRL applies them to its per-token loss. They change neither the selection nor
            the metrics.

    Returns:
        ``(loss, metrics)``: the clipped-surrogate metrics plus ``lp_reg/num_negative``,
        ``lp_reg/num_selected``, ``lp_reg/num_regularized``, ``lp_reg/kept_frac`` (share of
        selected tokens that pass the filter), ``lp_reg/prob_threshold`` (probability of
        the k-th lowest selected token), ``lp_reg/penalty``, ``lp_reg/mean_z`` and (sampled-token penalty only) the regime
        diagnostics of :func:`lp_reg_regime_metrics`.
    """
    LpRegOptions(rho=rho, min_k=min_k)  # the bounds declared once, in LpRegOptions
    check_same_shape(log_prob=log_prob, old_log_prob=old_log_prob, proxy_log_prob=proxy_log_prob)
    if full_vocab and (proxy_rows is None or policy_rows is None):
        raise ValueError("full_vocab=True needs proxy_rows and policy_rows ([batch, len, vocab])")

    loss_mat, parts = clipped_surrogate(
        log_prob, old_log_prob, advantages, mask, clip_low, clip_high
    )
    lp = as_fp32(log_prob)
    m = float_mask(mask, lp)
    adv = broadcast_advantages(advantages, lp)
    proxy = as_fp32(proxy_log_prob.detach())
    chosen = lp_reg_selection(lp, proxy, advantages, mask, rho, min_k, selected)
    selected, regularized, threshold = chosen.selected, chosen.regularized, chosen.threshold
    num_negative = int(chosen.candidates.sum())

    _, ratio = clamped_ratio(lp - as_fp32(old_log_prob.detach()))
    # The clamped k3 switches the penalty off where Z < ~0.073 (the authors' clamp).
    penalty = _full_vocab_kl(proxy_rows, policy_rows) if full_vocab else k3(proxy - lp)
    replaced = -adv * ratio + beta * penalty
    loss_mat = torch.where(regularized, replaced, loss_mat)
    if token_weights is not None:
        loss_mat = loss_mat * as_fp32(token_weights.detach())
    loss = aggregate(loss_mat, m, agg)

    num_selected = int(selected.sum())
    num_regularized = int(regularized.sum())
    metrics = {
        "pg/loss": to_float(loss),
        **surrogate_metrics(parts, m),
        "lp_reg/num_negative": float(num_negative),
        "lp_reg/num_selected": float(num_selected),
        "lp_reg/num_regularized": float(num_regularized),
        "lp_reg/kept_frac": num_regularized / num_selected if num_selected else 0.0,
        "lp_reg/prob_threshold": threshold,
        "lp_reg/penalty": to_float(penalty.detach()[regularized].mean())
        if num_regularized
        else 0.0,
    }
    if not full_vocab:  # the push-pull analysis is the sampled-token k3 penalty's
        metrics.update(
            lp_reg_regime_metrics(
                lp, old_log_prob, proxy, advantages, regularized, beta, log_normalizer
            )
        )
    if log_normalizer is not None:
        metrics["lp_reg/mean_z"] = to_float(masked_mean(torch.exp(as_fp32(log_normalizer)), m))
    return loss, metrics
