"""Typed options of the registered policy losses: one frozen dataclass per loss.

Each loss declares the scalar options it takes (clip range, aggregation, its own knobs) as a
dataclass with the loss's defaults and bounds, validated once when the options are built.
The loss function's keyword defaults are read from the same dataclass, so a default lives in
one place. Tensors a loss needs (``proxy_log_prob``, ``entropy``, a ``generator``) are inputs,
not options.

``dual_clip`` is an option only of the losses that implement it (those built on the plain
clipped surrogate: ``vanilla``, ``high_entropy``, ``clip_cov``); the others list it in
``REFUSED`` with the reason, and asking for it is an error that says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from divrl.algorithms.aggregation import AGGREGATIONS
from divrl.algorithms.options import Options, option

_opt = option  # the fields below predate the public name


@dataclass(frozen=True)
class LossOptions(Options):
    """Base class of a policy loss's options: bounds and choices checked from the field
    metadata (:class:`divrl.algorithms.options.Options`), the aggregation name checked.

    Subclasses set ``LOSS`` (the registered name) and may set ``REFUSED`` (option name ->
    why this loss does not take it) and ``NOT_LOSS_ARGS`` (options the trainer uses around
    the loss, e.g. Lp-Reg's ``kappa`` for the proxy, which are not keyword arguments of the
    loss function). ``INPUTS`` names the tensors the loss takes beyond ``log_prob``,
    ``old_log_prob``, ``advantages`` and ``mask`` (a trainer passes those it has;
    ``token_weights``: per-token factors such as rollout importance weights).

    What the loss needs from a trainer is declared here, and the trainers (``divrl
    train``, the TRL adapter) branch on these declarations, never on the loss's name:

    - ``NEEDS_PROXY``: the min-p proxy log-probs and log normaliser of the sampled tokens,
      computed from the logits with the options' ``kappa`` (inputs ``proxy_log_prob``,
      ``log_normalizer``);
    - ``SCOPED_SELECTION``: the loss selects a share of tokens (options ``rho``, ``min_k``)
      and takes a ``selected`` mask chosen over a wider population
      (``algorithm.lp_reg_scope``) instead of each micro-batch;
    - ``NEEDS_OLD_LOG_PROBS``: the ratio to pi_old (False: the loss reads only ``log_prob``,
      and ``divrl train`` hands it the current policy's log-probs as ``old_log_prob``);
    - :attr:`needs_full_logits`: ``[batch, len, vocab]`` rows no trainer computes (refused
      with :attr:`FULL_LOGITS_REFUSED`).
    """

    KIND: ClassVar[str] = "policy loss"
    LOSS: ClassVar[str] = ""
    REFUSED: ClassVar[dict[str, str]] = {}
    NOT_LOSS_ARGS: ClassVar[tuple[str, ...]] = ()
    INPUTS: ClassVar[tuple[str, ...]] = ()
    NEEDS_PROXY: ClassVar[bool] = False
    SCOPED_SELECTION: ClassVar[bool] = False
    NEEDS_OLD_LOG_PROBS: ClassVar[bool] = True
    FULL_LOGITS_REFUSED: ClassVar[str] = ""

    @classmethod
    def label(cls) -> str:
        return f"policy loss {cls.LOSS!r}"

    @property
    def needs_full_logits(self) -> bool:
        """These options need the full-vocabulary logits of every position."""
        return False

    @property
    def takes_token_weights(self) -> bool:
        """The loss multiplies its per-token loss by ``token_weights`` before aggregation."""
        return "token_weights" in self.INPUTS

    def __post_init__(self) -> None:
        super().__post_init__()
        agg = getattr(self, "agg", None)
        if agg is not None and agg not in AGGREGATIONS:
            raise ValueError(
                f"policy loss {self.LOSS!r}: agg={agg!r} is not an aggregation mode; valid: "
                + ", ".join(sorted(AGGREGATIONS))
            )

    def loss_kwargs(self) -> dict[str, Any]:
        """The options as keyword arguments of the loss function."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in self.NOT_LOSS_ARGS
        }


_CLIP_LOW_HELP = "ratio clip below: r >= 1 - clip_low (1.0 switches the lower clip off)"
_CLIP_HIGH_HELP = "ratio clip above: r <= 1 + clip_high"
_DUAL_CLIP_HELP = "dual-clip constant c for A < 0: L = min(L, -A c) (verl's clip_ratio_c: 3)"
_AGG_HELP = "loss aggregation mode (verl names)"


@dataclass(frozen=True)
class ClippedSurrogateOptions(LossOptions):
    """The options of the plain clipped surrogate (PPO's, with verl's dual clip), shared by
    the losses built on it (``vanilla``, ``high_entropy``, ``clip_cov``): their fields come
    first, then the loss's own."""

    clip_low: float = _opt(0.2, _CLIP_LOW_HELP, 0.0, 1.0)
    clip_high: float = _opt(0.2, _CLIP_HIGH_HELP, 0.0)
    dual_clip: float | None = _opt(None, _DUAL_CLIP_HELP)
    agg: str = _opt("token-mean", _AGG_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(
                f"policy loss {self.LOSS!r}: dual_clip={self.dual_clip} must be > 1 (verl's "
                "default is 3) or null (off)"
            )


@dataclass(frozen=True)
class VanillaOptions(ClippedSurrogateOptions):
    """PPO / GRPO / DAPO clipped surrogate (GRPO 0.2/0.2; DAPO clip-higher 0.2/0.28)."""

    LOSS: ClassVar[str] = "vanilla"
    INPUTS: ClassVar[tuple[str, ...]] = ("token_weights",)


@dataclass(frozen=True)
class GSPOOptions(LossOptions):
    """GSPO: its own clip range (3e-4 / 4e-4, the GSPO paper's; the Lp-Reg authors' verl copy
    defaults to 3e-4 both sides, Lp-Reg-dev ``core_algos.py:433-440``) and sequence-level
    aggregation (``seq-mean-token-mean``, which that copy forces, ``core_algos.py:486``)."""

    LOSS: ClassVar[str] = "gspo"
    REFUSED: ClassVar[dict[str, str]] = {
        "dual_clip": "GSPO clips a sequence-level ratio; neither the GSPO paper nor verl's "
        "gspo loss applies a dual clip",
    }
    clip_low: float = _opt(3e-4, _CLIP_LOW_HELP, 0.0, 1.0)
    clip_high: float = _opt(4e-4, _CLIP_HIGH_HELP, 0.0)
    agg: str = _opt("seq-mean-token-mean", _AGG_HELP)


#: why the trainers refuse LpRegOptions(full_vocab=True): only lp_reg_loss itself takes it
FULL_VOCAB_REFUSED = (
    "policy loss 'lp_reg': full_vocab=true (the paper's full-vocabulary KL(proxy || pi)) "
    "needs [batch, len, vocab] proxy and policy rows that neither `divrl train` nor the TRL "
    "adapter computes; it is an option of divrl.algorithms.lp_reg_loss called directly: "
    "leave it false"
)


@dataclass(frozen=True)
class LpRegOptions(LossOptions):
    """Lp-Reg (the authors' code semantics; see :func:`divrl.algorithms.lp_reg_loss`)."""

    LOSS: ClassVar[str] = "lp_reg"
    REFUSED: ClassVar[dict[str, str]] = {
        "dual_clip": "the Lp-Reg authors' scripts set clip_ratio_c=10 but their losses never "
        "apply it (the dual-clip lines are commented out), and the regularised tokens replace "
        "the clipped term; divrl refuses it rather than invent a semantics",
    }
    NOT_LOSS_ARGS: ClassVar[tuple[str, ...]] = ("kappa",)
    INPUTS: ClassVar[tuple[str, ...]] = (
        "proxy_log_prob",
        "log_normalizer",
        "selected",
        "token_weights",
    )
    NEEDS_PROXY: ClassVar[bool] = True
    SCOPED_SELECTION: ClassVar[bool] = True
    FULL_LOGITS_REFUSED: ClassVar[str] = FULL_VOCAB_REFUSED
    rho: float = _opt(0.01, "share of negative-advantage tokens selected (32B: 0.005)", 0.0, 1.0)
    beta: float = _opt(1.0, "weight of the k3 penalty toward the proxy", 0.0)
    kappa: float = _opt(0.02, "min-p ratio of the proxy: keep p_v >= kappa * max p", 0.0, 1.0)
    clip_low: float = _opt(1.0, _CLIP_LOW_HELP, 0.0, 1.0)
    clip_high: float = _opt(9.0, _CLIP_HIGH_HELP, 0.0)
    agg: str = _opt("token-mean", _AGG_HELP)
    min_k: int = _opt(2, "skip the regulariser when fewer tokens are selected (authors: 2)", 1)
    full_vocab: bool = _opt(False, "full-vocabulary KL(proxy || pi) (the paper's equation)")

    @property
    def needs_full_logits(self) -> bool:
        return self.full_vocab


@dataclass(frozen=True)
class HighEntropyOptions(ClippedSurrogateOptions):
    """80/20: the clipped surrogate on the highest-entropy share of tokens only."""

    LOSS: ClassVar[str] = "high_entropy"
    INPUTS: ClassVar[tuple[str, ...]] = ("entropy",)
    top_fraction: float = _opt(
        0.2, "share of highest-entropy valid tokens trained", 0.0, 1.0, low_open=True
    )


@dataclass(frozen=True)
class KLCovOptions(LossOptions):
    """KL-Cov: no ratio clipping at all, ``|lp - old|`` on the top-covariance tokens."""

    LOSS: ClassVar[str] = "kl_cov"
    REFUSED: ClassVar[dict[str, str]] = {
        "dual_clip": "KL-Cov does not clip the ratio at all (verl's kl_cov loss)",
        "clip_low": "KL-Cov does not clip the ratio at all (verl's kl_cov loss)",
        "clip_high": "KL-Cov does not clip the ratio at all (verl's kl_cov loss)",
    }
    kl_cov_ratio: float = _opt(0.002, "share of valid tokens penalised (32B: 0.0002)", 0.0, 1.0)
    ppo_kl_coef: float = _opt(1.0, "weight of |lp - old| on the penalised tokens", 0.0)
    agg: str = _opt("token-mean", _AGG_HELP)


@dataclass(frozen=True)
class ClipCovOptions(ClippedSurrogateOptions):
    """Clip-Cov: the clipped surrogate with a few random high-covariance tokens cut."""

    LOSS: ClassVar[str] = "clip_cov"
    clip_ratio: float = _opt(0.0002, "share of valid tokens whose gradient is cut", 0.0, 1.0)
    clip_cov_lb: float = _opt(1.0, "lower covariance bound of the eligible tokens")
    clip_cov_ub: float = _opt(5.0, "upper covariance bound of the eligible tokens")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(
                f"policy loss 'clip_cov': clip_cov_lb={self.clip_cov_lb} must be below "
                f"clip_cov_ub={self.clip_cov_ub}"
            )
