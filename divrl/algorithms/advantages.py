"""Outcome advantages, one per response, from the rewards of a group (a prompt's responses).

Every estimator in :data:`ADVANTAGE_ESTIMATORS` takes ``(rewards, group_ids, **options)``
(``rewards`` ``[N]``, ``group_ids`` ``[N]``: a tensor of ints or any hashables; groups need
not be contiguous) and returns ``(advantages, metrics)``: ``[N]`` fp32 detached advantages
and a dict of Python floats. A new estimator is one function and its options dataclass
(:class:`AdvantageOptions`), registered together with :func:`register_advantage`;
:func:`advantage_options` builds the validated options from a name and overrides, and
:func:`compute_advantages` runs an estimator by name.

Notation: a group ``g`` holds ``n`` responses with rewards ``r_1..r_n``, mean ``m``,
Bessel-corrected std ``s``. A group of one response has ``m = 0`` and ``s = 1`` (verl's
convention: its advantage is its reward) in the estimators that centre on the mean.

Unscorable responses (a NaN reward: a verifier timeout or a crashed worker, see
docs/rewards.md) have no verdict. :func:`compute_advantages` and :func:`group_advantages`
leave them out before the estimator runs, so they enter no group's statistics (nor the
batch's), and give them advantage 0, as TRL does with NaN rewards. A group left with one
scorable response among several (or with fewer than the estimator's options need) has no
baseline: its advantages are 0 too. The estimators themselves see finite rewards only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from divrl.algorithms._utils import Registry, as_fp32
from divrl.algorithms.options import Options, option

ADVANTAGE_SCALES = ("group", "batch", "none")
ADVANTAGE_ESTIMATORS = Registry("advantage estimator")
#: name -> the options dataclass of that estimator (same keys as ADVANTAGE_ESTIMATORS)
ADVANTAGE_OPTIONS: dict[str, type[AdvantageOptions]] = {}

F = TypeVar("F", bound=Callable)
Groups = torch.Tensor | Sequence[Hashable]
_EPS_HELP = "added to the std in the denominator (verl's epsilon)"


@dataclass(frozen=True)
class AdvantageOptions(Options):
    """Base class of an estimator's options (``NAME``: the registered name).

    ``SCALE``: the estimator is the group-centred ``(r - m) / scale`` with TRL's
    ``scale_rewards`` of that name (``group``, ``batch``, ``none``), so a framework that has
    that setting can run it natively; None for the others.
    """

    KIND: ClassVar[str] = "advantage estimator"
    SCALE: ClassVar[str | None] = None

    def kwargs(self) -> dict[str, Any]:
        """The options as keyword arguments of the estimator function."""
        return {name: getattr(self, name) for name in self.names()}

    def group_size_problem(self, n: int) -> str | None:
        """Why groups of ``n`` responses are too small for these options (None: they fit)."""
        return None


def register_advantage(name: str, options: type[AdvantageOptions]) -> Callable[[F], F]:
    """Register an advantage estimator under ``name`` together with its options dataclass."""
    if name != options.NAME:
        raise ValueError(f"{options.__name__}.NAME={options.NAME!r} but the estimator is {name!r}")

    def decorator(fn: F) -> F:
        ADVANTAGE_ESTIMATORS.register(name)(fn)
        ADVANTAGE_OPTIONS[name] = options
        return fn

    return decorator


def advantage_options(name: str, **overrides: Any) -> AdvantageOptions:
    """The validated options of estimator ``name``: its defaults with ``overrides`` applied
    (``ValueError``: unknown estimator, an option it does not take, a value out of bounds)."""
    ADVANTAGE_ESTIMATORS.get_or_raise(name)
    return ADVANTAGE_OPTIONS[name].build(**overrides)  # type: ignore[return-value]


def compute_advantages(
    name: str,
    rewards: torch.Tensor,
    group_ids: Groups,
    options: AdvantageOptions | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Run estimator ``name`` (its default options unless ``options`` are given) on the
    scorable responses; unscorable ones (NaN rewards) get 0 (the module's docstring)."""
    fn = ADVANTAGE_ESTIMATORS.get_or_raise(name)
    opts = options if options is not None else advantage_options(name)
    return _on_scorable(lambda r, g: fn(r, g, **opts.kwargs()), rewards, group_ids, None, opts)


def _on_scorable(estimate, rewards, group_ids, scorable, opts) -> tuple[torch.Tensor, dict]:
    """``estimate(rewards, group_ids) -> (adv, metrics)`` on the rows that have a verdict
    (finite reward, and ``scorable`` where given) of groups that keep a baseline; 0 for
    the others. ``[N]`` fp32, detached."""
    r = _rewards(rewards, group_ids)
    keep = torch.isfinite(r)
    if scorable is not None:
        if scorable.numel() != r.shape[0]:
            raise ValueError(f"{r.shape[0]} rewards but {scorable.numel()} scorable flags")
        keep &= scorable.reshape(-1).to(device=r.device, dtype=torch.bool)
    if r.shape[0] == 0 or bool(keep.all()):
        return estimate(r, group_ids)
    idx = _group_index(group_ids, r.device)
    zeros = torch.zeros(int(idx.max()) + 1, device=r.device)
    size = zeros.index_add(0, idx, torch.ones_like(r))[idx]
    count = zeros.index_add(0, idx, keep.float())[idx]
    lost = count < size  # groups that lost responses to unscorable ones
    no_baseline = lost & (count < 2)
    if opts is not None:
        too_small = [opts.group_size_problem(int(c)) is not None for c in count.tolist()]
        no_baseline |= lost & torch.tensor(too_small, dtype=torch.bool, device=r.device)
    rows = (keep & ~no_baseline).nonzero().view(-1)
    adv = torch.zeros_like(r)
    metrics: dict[str, float] = {}
    if rows.numel():
        ids = group_ids.reshape(-1)[rows] if isinstance(group_ids, torch.Tensor) else None
        sub_ids = ids if ids is not None else [group_ids[i] for i in rows.tolist()]
        sub, metrics = estimate(r[rows], sub_ids)
        adv[rows] = sub.to(adv.dtype)
    return adv, {**metrics, **_metrics(adv)}


def advantage_summaries() -> str:
    """``name (one line), ...`` for help texts: the first line of each docstring."""
    parts = []
    for name in sorted(ADVANTAGE_ESTIMATORS):
        doc = (ADVANTAGE_ESTIMATORS[name].__doc__ or "").strip().splitlines()
        parts.append(f"{name} ({doc[0].rstrip('.')})" if doc else name)
    return "; ".join(parts)


# --------------------------------------------------------------------------- group statistics


@dataclass(frozen=True)
class GroupStats:
    """Per-response views of its group: ``index`` ``[N]`` (group 0..G-1), and ``[N]`` tensors
    ``count`` (n), ``mean`` (m), ``std`` (s, Bessel), ``singleton`` (n == 1)."""

    index: torch.Tensor
    count: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    singleton: torch.Tensor


def _group_index(group_ids: Groups, device: torch.device) -> torch.Tensor:
    """Map arbitrary group ids to contiguous integers ``0..G-1``, shape ``[N]``."""
    if isinstance(group_ids, torch.Tensor):
        return torch.unique(group_ids.reshape(-1), return_inverse=True)[1].to(device)
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(g, len(index)) for g in group_ids], device=device)


def _rewards(rewards: torch.Tensor, group_ids: Groups) -> torch.Tensor:
    r = as_fp32(rewards.detach()).reshape(-1)
    if len(group_ids) != r.shape[0]:
        raise ValueError(f"{r.shape[0]} rewards but {len(group_ids)} group ids")
    return r


def group_stats(r: torch.Tensor, group_ids: Groups) -> GroupStats:
    """The group statistics of rewards ``r`` ``[N]`` (N >= 1), gathered back to ``[N]``."""
    idx = _group_index(group_ids, r.device)
    num_groups = int(idx.max()) + 1
    zeros = torch.zeros(num_groups, device=r.device)
    count = zeros.index_add(0, idx, torch.ones_like(r))
    mean = zeros.index_add(0, idx, r) / count
    sq_dev = zeros.index_add(0, idx, (r - mean[idx]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp_min(1.0))
    return GroupStats(idx, count[idx], mean[idx], std[idx], count[idx] == 1)


def _centred(r: torch.Tensor, stats: GroupStats) -> torch.Tensor:
    """``r - m`` with a singleton group's mean taken as 0."""
    return r - torch.where(stats.singleton, torch.zeros_like(r), stats.mean)


def _metrics(adv: torch.Tensor) -> dict[str, float]:
    if adv.numel() == 0:
        return {"adv/mean": 0.0, "adv/zero_frac": 0.0}
    return {
        "adv/mean": float(adv.mean()),
        "adv/zero_frac": float((adv == 0).float().mean()),
    }


# --------------------------------------------------------------------------- GRPO and scales


@dataclass(frozen=True)
class GRPOOptions(AdvantageOptions):
    NAME: ClassVar[str] = "grpo"
    SCALE: ClassVar[str | None] = "group"
    eps: float = option(1e-6, _EPS_HELP, 0.0)


@dataclass(frozen=True)
class GRPOBatchOptions(AdvantageOptions):
    NAME: ClassVar[str] = "grpo_batch"
    SCALE: ClassVar[str | None] = "batch"
    eps: float = option(1e-6, _EPS_HELP, 0.0)


@dataclass(frozen=True)
class DrGRPOOptions(AdvantageOptions):
    NAME: ClassVar[str] = "dr_grpo"
    SCALE: ClassVar[str | None] = "none"


@register_advantage("grpo", GRPOOptions)
def grpo_advantages(
    rewards: torch.Tensor, group_ids: Groups, eps: float = GRPOOptions.eps
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO: the group's mean subtracted, divided by the group's std.

    ``A_i = (r_i - m_g) / (s_g + eps)`` (Bessel's std, as verl; a singleton: ``A = r``).
    """
    return _scaled(rewards, group_ids, "group", eps)


@register_advantage("grpo_batch", GRPOBatchOptions)
def grpo_batch_advantages(
    rewards: torch.Tensor, group_ids: Groups, eps: float = GRPOBatchOptions.eps
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO centred per group, divided by the std of the whole batch (TRL's scale_rewards=batch).

    ``A_i = (r_i - m_g) / (std(r_1..r_N) + eps)`` (Bessel's std over all N rewards; 1 when
    N = 1).
    """
    return _scaled(rewards, group_ids, "batch", eps)


@register_advantage("dr_grpo", DrGRPOOptions)
def dr_grpo_advantages(
    rewards: torch.Tensor, group_ids: Groups
) -> tuple[torch.Tensor, dict[str, float]]:
    """Dr. GRPO: the group's mean subtracted, no std division.

    ``A_i = r_i - m_g`` (verl's ``norm_adv_by_std_in_grpo=False``, TRL's
    ``scale_rewards="none"``).
    """
    return _scaled(rewards, group_ids, "none", 0.0)


def _scaled(
    rewards: torch.Tensor, group_ids: Groups, scale: str, eps: float
) -> tuple[torch.Tensor, dict[str, float]]:
    adv = _group_scaled(rewards, group_ids, scale, eps)
    return adv, _metrics(adv)


def group_advantages(
    rewards: torch.Tensor,
    group_ids: Groups,
    scale: str = "group",
    eps: float = 1e-6,
    scorable: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO outcome advantages with a scale: ``group`` (:func:`grpo_advantages`), ``batch``
    (:func:`grpo_batch_advantages`), ``none`` (:func:`dr_grpo_advantages`); ``[N]`` fp32,
    detached (the advantages only, no metrics). ``scorable``: ``[N]`` bool, false for a
    response without a verdict (default: every finite reward); such responses are out of
    every statistic and get 0 (the module's docstring)."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(ADVANTAGE_SCALES)}")
    adv, _ = _on_scorable(
        lambda r, g: (_group_scaled(r, g, scale, eps), {}), rewards, group_ids, scorable, None
    )
    return adv


def _group_scaled(rewards: torch.Tensor, group_ids: Groups, scale: str, eps: float) -> torch.Tensor:
    r = _rewards(rewards, group_ids)
    if r.shape[0] == 0:
        return r.clone()
    stats = group_stats(r, group_ids)
    centred = _centred(r, stats)
    if scale == "group":
        std = torch.where(stats.singleton, torch.ones_like(r), stats.std)
        return centred / (std + eps)
    if scale == "batch":
        batch_std = r.std(unbiased=True) if r.shape[0] > 1 else torch.ones((), device=r.device)
        return centred / (batch_std + eps)
    return centred


# --------------------------------------------------------------------------- RLOO, GPG


@dataclass(frozen=True)
class RLOOOptions(AdvantageOptions):
    NAME: ClassVar[str] = "rloo"


@register_advantage("rloo", RLOOOptions)
def rloo_advantages(
    rewards: torch.Tensor, group_ids: Groups
) -> tuple[torch.Tensor, dict[str, float]]:
    """RLOO: each reward minus the mean of the other responses of its group.

    ``A_i = r_i - (sum_g r - r_i) / (n - 1) = n / (n - 1) * (r_i - m_g)`` (verl's ``rloo``);
    a singleton group gets ``A = r``.
    """
    r = _rewards(rewards, group_ids)
    if r.shape[0] == 0:
        return r.clone(), _metrics(r)
    stats = group_stats(r, group_ids)
    factor = stats.count / (stats.count - 1).clamp_min(1.0)
    adv = torch.where(stats.singleton, r, factor * (r - stats.mean))
    return adv, _metrics(adv)


@dataclass(frozen=True)
class GPGOptions(AdvantageOptions):
    NAME: ClassVar[str] = "gpg"
    count: str = option(
        "informative",
        "the M of alpha = N / M: 'informative' counts the responses of groups whose rewards "
        "are not all equal (the GPG paper's), 'nonzero_reward' the responses with a nonzero "
        "reward (verl's compute_gpg_outcome_advantage)",
        choices=("informative", "nonzero_reward"),
    )
    f_norm: float = option(1.0, "divisor of every advantage (verl's f_norm)", 0.0, low_open=True)


@register_advantage("gpg", GPGOptions)
def gpg_advantages(
    rewards: torch.Tensor,
    group_ids: Groups,
    count: str = GPGOptions.count,
    f_norm: float = GPGOptions.f_norm,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG: the group-centred reward, scaled up by the batch's share of useful responses.

    ``A_i = alpha * (r_i - m_g) / f_norm`` with ``alpha = N / max(M, 1)``: ``M`` the
    responses of groups whose rewards are not all equal (``count=informative``, the GPG
    paper's correction for the groups that give no gradient) or with a nonzero reward
    (``count=nonzero_reward``, verl's). No std division. Metric ``adv/gpg_alpha``.
    """
    r = _rewards(rewards, group_ids)
    if r.shape[0] == 0:
        return r.clone(), {**_metrics(r), "adv/gpg_alpha": 1.0}
    stats = group_stats(r, group_ids)
    useful = (stats.std > 0) & ~stats.singleton if count == "informative" else r != 0
    alpha = r.shape[0] / max(int(useful.sum()), 1)
    adv = alpha * _centred(r, stats) / f_norm
    return adv, {**_metrics(adv), "adv/gpg_alpha": float(alpha)}


# --------------------------------------------------------------------------- Pass@k


@dataclass(frozen=True)
class PassKOptions(AdvantageOptions):
    NAME: ClassVar[str] = "grpo_passk"
    k: int = option(4, "the k of the Pass@k objective (<= the group size)", 1)
    threshold: float = option(
        0.5, "a response counts as correct when its reward >= threshold (analytic form)"
    )
    form: str = option(
        "analytic",
        "'analytic': the Pass@k Training paper's closed form; 'best_of_group': verl's "
        "grpo_passk (only the group's best response gets r_max - r_second, over the std)",
        choices=("analytic", "best_of_group"),
    )
    eps: float = option(1e-6, _EPS_HELP, 0.0)

    def group_size_problem(self, n: int) -> str | None:
        need = self.k if self.form == "analytic" else 2
        if n >= need:
            return None
        return f"advantage estimator 'grpo_passk' ({self.form}) needs groups of >= {need} responses"


def _comb_ratio(top: torch.Tensor, bottom: torch.Tensor, k: int) -> torch.Tensor:
    """``C(top, k) / C(bottom, k)`` elementwise (0 where top < k), in float64."""
    out = torch.empty_like(top, dtype=torch.float64)
    for i, (a, b) in enumerate(zip(top.tolist(), bottom.tolist(), strict=True)):
        out[i] = math.comb(int(a), k) / math.comb(int(b), k) if b >= k else 0.0
    return out


@register_advantage("grpo_passk", PassKOptions)
def passk_advantages(
    rewards: torch.Tensor,
    group_ids: Groups,
    k: int = PassKOptions.k,
    threshold: float = PassKOptions.threshold,
    form: str = PassKOptions.form,
    eps: float = PassKOptions.eps,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Pass@k: the advantage of a response under the objective "one of k draws is correct".

    ``form=analytic`` (Chen et al. 2025, "Pass@k Training for Adaptively Balancing
    Exploration and Exploitation", eqs. 13-15): a group of ``n`` responses, ``n_neg`` of
    them wrong (``reward < threshold``); the group's Pass@k reward
    ``R = 1 - C(n_neg, k) / C(n, k)``, ``s = sqrt(R (1 - R))``; a correct response gets
    ``(1 - R) / s``, a wrong one ``(1 - R - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) / s``;
    a group with ``s = 0`` (every k-subset passes, or none) gets 0. Every group needs
    ``n >= k``.

    ``form=best_of_group`` (verl's ``grpo_passk``, after arXiv 2503.19595): only the
    group's highest reward gets ``(r_max - r_second) / (s_g + eps)``, the rest 0 (``k`` is
    the group size there; the option is not read). Every group needs ``n >= 2``.
    """
    r = _rewards(rewards, group_ids)
    if r.shape[0] == 0:
        return r.clone(), _metrics(r)
    stats = group_stats(r, group_ids)
    need = k if form == "analytic" else 2
    if int(stats.count.min()) < need:
        raise ValueError(
            f"advantage estimator 'grpo_passk' ({form}) needs groups of >= {need} responses, "
            f"got a group of {int(stats.count.min())}: raise rollout.n or lower its k"
        )
    if form == "best_of_group":
        adv = torch.zeros_like(r)
        for g in range(int(stats.index.max()) + 1):
            rows = (stats.index == g).nonzero().view(-1)
            top = torch.topk(r[rows], 2)
            best = rows[top.indices[0]]
            adv[best] = (top.values[0] - top.values[1]) / (stats.std[best] + eps)
        return adv, _metrics(adv)
    wrong = (r < threshold).float()
    zeros = torch.zeros(int(stats.index.max()) + 1, device=r.device)
    n_neg = zeros.index_add(0, stats.index, wrong)[stats.index]
    n = stats.count
    pass_k = 1.0 - _comb_ratio(n_neg, n, k)
    std = torch.sqrt(pass_k * (1.0 - pass_k))
    cond = _comb_ratio((n_neg - 1).clamp_min(0), n - 1, k - 1)
    value = torch.where(wrong > 0, 1.0 - pass_k - cond, 1.0 - pass_k)
    adv = torch.where(std > 0, value / std.clamp_min(1e-12), torch.zeros_like(value)).float()
    return adv, {**_metrics(adv), "adv/pass_at_k": float(pass_k.mean())}
