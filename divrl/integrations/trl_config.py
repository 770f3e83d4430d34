"""``DivRLGRPOConfig``: TRL's ``GRPOConfig`` plus the DPH-RL and Lp-Reg fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from divrl.algorithms import DIVERGENCES, LpRegOptions, divergence_generator

__all__ = ["LP_REG_LOSS_TYPES", "TRL_DPH_WEIGHTINGS", "DivRLGRPOConfig"]

# divrl's DPH stream weightings the adapter offers (docs/trl.md)
TRL_DPH_WEIGHTINGS = ("authors", "paper")


# Loss types whose per-token loss is the clipped surrogate Lp-Reg replaces, with the divrl
# aggregation mode that matches TRL's reduction (a further scale is applied in the trainer).
LP_REG_LOSS_TYPES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "token-mean",
    "dapo": "token-mean",
}

# --------------------------------------------------------------------------- config


@dataclass
class DivRLGRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus the DPH-RL and Lp-Reg fields (see docs/trl.md).

    DPH-RL is on when ``dph_divergence`` is set, Lp-Reg when ``lp_reg`` is true; both may
    be on together. Everything else is TRL's own configuration.
    """

    dph_divergence: str | None = field(
        default=None,
        metadata={
            "help": "DPH-RL divergence on the reference samples: 'forward_kl' (DPH-F), 'js' "
            "(DPH-JS), 'reverse_kl' or 'alpha'. None (default) turns DPH-RL off.",
        },
    )
    dph_eta: float = field(
        default=0.2,
        metadata={
            "help": "Weight of the divergence term: loss = TRL's loss + dph_eta * D_f. The "
            "authors use 0.2 for JS (0.05 to 0.2 recommended) and 0.01 to 0.05 for forward "
            "KL. 0 computes and logs the divergence without training on it.",
        },
    )
    dph_alpha: float | None = field(
        default=None,
        metadata={"help": "alpha in (0, 1) for dph_divergence='alpha' (paper: 0.2, 0.5, 0.8)."},
    )
    dph_reference_store: str | None = field(
        default=None,
        metadata={
            "help": "Directory of a divrl reference store (written by `divrl presample`): "
            "responses of the initial policy with their per-token log-probs. Required with "
            "dph_divergence.",
        },
    )
    dph_weighting: str = field(
        default="authors",
        metadata={
            "help": "How dph_eta weighs the reference samples against TRL's loss. 'authors' "
            "(default): the term is multiplied by dph_batch_size / (completions in the "
            "micro-batch), so the reference stream weighs dph_eta times its share of the "
            "samples, the balance of the DPH-RL authors' actor (one kind per micro-batch, "
            "equal micro-batch sizes), under which the paper's eta values were tuned. "
            "'paper': loss = TRL's loss + dph_eta * D_f (an absolute weight). See docs/trl.md.",
        },
    )
    dph_batch_size: int = field(
        default=1,
        metadata={
            "help": "Reference samples per device per micro-batch (each compute_loss call). "
            "They cycle through the store in a seeded order (args.seed).",
        },
    )
    lp_reg: bool = field(
        default=False,
        metadata={
            "help": "Turn Lp-Reg on: regularise the lowest-probability negative-advantage tokens "
            "toward a min-p proxy of the policy. The authors also set epsilon=1.0 and "
            "epsilon_high=9.0 (the clip range of every other token).",
        },
    )
    lp_reg_kappa: float = field(
        default=0.02,
        metadata={"help": "Min-p ratio of the Lp-Reg proxy: keep tokens with p >= kappa * max p."},
    )
    lp_reg_rho: float = field(
        default=0.01,
        metadata={
            "help": "Share of the micro-batch's negative-advantage tokens selected (lowest "
            "probability first); paper 0.01, 0.005 for 32B models. As in the authors' code "
            "nothing is selected while floor(rho * N_negative) < 2.",
        },
    )
    lp_reg_beta: float = field(
        default=1.0,
        metadata={"help": "Weight of the Lp-Reg penalty toward the proxy (paper: 1.0)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._validate_dph()
        if self.lp_reg:
            self._validate_lp_reg()

    def _validate_dph(self) -> None:
        if self.dph_divergence is None:
            if self.dph_reference_store is not None:
                raise ValueError(
                    "dph_reference_store is set but dph_divergence is None: set dph_divergence "
                    f"(one of {sorted(DIVERGENCES)}) to use the store, or drop the store"
                )
            return
        if self.dph_divergence not in DIVERGENCES:
            raise ValueError(
                f"unknown dph_divergence {self.dph_divergence!r}: use one of {sorted(DIVERGENCES)}"
            )
        divergence_generator(self.dph_divergence, self.dph_alpha)  # validates alpha
        if self.dph_reference_store is None:
            raise ValueError(
                "DPH-RL needs a reference store: set dph_reference_store to the directory "
                "`divrl presample` wrote"
            )
        if not (self.dph_eta >= 0 and math.isfinite(self.dph_eta)):
            raise ValueError(f"dph_eta must be a finite number >= 0, got {self.dph_eta}")
        if self.dph_weighting not in TRL_DPH_WEIGHTINGS:
            raise ValueError(
                f"dph_weighting={self.dph_weighting!r}: use one of {list(TRL_DPH_WEIGHTINGS)} "
                "('concat' of divrl's trainer is not offered: TRL's loss normalisation depends "
                "on loss_type)"
            )
        if self.dph_batch_size < 1:
            raise ValueError(f"dph_batch_size must be >= 1, got {self.dph_batch_size}")
        if self.beta != 0.0:
            raise ValueError(
                f"beta={self.beta} loads a reference model for TRL's reverse-KL term; DPH-RL "
                "replaces it with the divergence on stored reference samples: set beta=0.0"
            )

    def _validate_lp_reg(self) -> None:
        # the bounds live in one place: divrl's Lp-Reg options dataclass
        for name in ("kappa", "rho", "beta"):
            try:
                LpRegOptions(**{name: getattr(self, f"lp_reg_{name}")})
            except ValueError as exc:
                raise ValueError(f"lp_reg_{name}: {exc}") from exc
        # Lp-Reg replaces TRL's clipped per-token loss on a few tokens; the settings below
        # change that per-token loss in ways the replacement would not reproduce.
        if self.loss_type not in LP_REG_LOSS_TYPES:
            raise ValueError(
                f"lp_reg needs a clipped-surrogate loss_type, one of {sorted(LP_REG_LOSS_TYPES)}; "
                f"got {self.loss_type!r}"
            )
        unsupported = {
            "importance_sampling_level='sequence' (set 'token')": (
                self.importance_sampling_level != "token"
            ),
            "delta (set delta=None)": self.delta is not None,
            "off_policy_mask_threshold (set it to None)": self.off_policy_mask_threshold
            is not None,
            "top_entropy_quantile < 1 (set 1.0)": self.top_entropy_quantile < 1.0,
            "vLLM importance-sampling correction (set vllm_importance_sampling_correction=False)": (
                self.use_vllm and self.vllm_importance_sampling_correction
            ),
        }
        bad = [name for name, on in unsupported.items() if on]
        if bad:
            raise ValueError("lp_reg does not support " + "; ".join(bad))
