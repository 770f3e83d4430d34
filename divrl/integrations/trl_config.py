"""``DivRLGRPOConfig``: TRL's ``GRPOConfig`` plus the DPH-RL and policy-loss fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trl import GRPOConfig

from divrl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_OPTIONS,
    DIVERGENCES,
    POLICY_LOSSES,
    LpRegOptions,
    divergence_generator,
    divergence_summaries,
)
from divrl.algorithms.loss_options import LossOptions
from divrl.algorithms.rehearsal_control import RehearsalControlOptions
from divrl.integrations.trl_loss import REPLACEMENT_LOSS_TYPES, TRL_SETS, resolve_loss_options

__all__ = [
    "LOSS_SWITCHES",
    "LP_REG_LOSS_TYPES",
    "TRL_DPH_WEIGHTINGS",
    "TRL_SETS",
    "DivRLGRPOConfig",
]

# which dataset rows a DPH-RL run rolls out (DivRLGRPOConfig.rollout_prompts)
ROLLOUT_PROMPTS = ("exploration", "all")
# divrl's DPH stream weightings the adapter offers (docs/trl.md)
TRL_DPH_WEIGHTINGS = ("authors", "paper")

#: the loss types a policy_loss runs with (the older name of REPLACEMENT_LOSS_TYPES)
LP_REG_LOSS_TYPES = REPLACEMENT_LOSS_TYPES

#: boolean fields kept from before policy_loss, each the old spelling of one loss
#: (field -> the registered loss it turns on)
LOSS_SWITCHES = {"lp_reg": LpRegOptions.LOSS}

# --------------------------------------------------------------------------- config


@dataclass
class DivRLGRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus the DPH-RL and policy-loss fields (see docs/trl.md).

    DPH-RL is on when ``divergence`` is set; ``policy_loss`` names a loss of divrl's
    registry that replaces TRL's clipped surrogate (``lp_reg=True`` is the older spelling of
    ``policy_loss="lp_reg"``); both may be on together. Everything else is TRL's own
    configuration. ``loss_options`` is one of TRL's dict fields (``_VALID_DICT_FIELDS``):
    ``HfArgumentParser`` / ``TrlParser`` take it as a JSON string (``--loss_options
    '{"rho": 0.02}'``) or a YAML mapping, and after validation it holds every option of the
    loss with its value, so ``to_dict()`` / ``to_json_string()`` (what TRL logs and saves
    with a run) carry the options the run used; ``policy_loss_options`` holds them typed
    (None without a policy_loss).
    """

    _VALID_DICT_FIELDS: ClassVar[list[str]] = [
        *GRPOConfig._VALID_DICT_FIELDS,
        "loss_options",
        "rehearsal_control",
    ]

    divergence: str | None = field(
        default=None,
        metadata={
            "help": "DPH-RL divergence on the reference samples, a name in "
            f"divrl.algorithms.DIVERGENCES: {divergence_summaries()}. None (default) turns "
            "DPH-RL off. The same name as `divrl train`'s algorithm.divergence.",
        },
    )
    divergence_coef: float = field(
        default=0.0,
        metadata={
            "help": "eta, the weight of the divergence term: loss = TRL's loss + "
            "divergence_coef * D_f (algorithm.divergence_coef in `divrl train`, with its "
            "default 0: computes and logs the divergence without training on it). The "
            "authors use 0.2 for JS (0.05 to 0.2 recommended) and 0.01 to 0.05 for forward KL.",
        },
    )
    divergence_alpha: float | None = field(
        default=None,
        metadata={"help": "alpha in (0, 1) for divergence='alpha' (paper: 0.2, 0.5, 0.8)."},
    )
    reference_store: str | None = field(
        default=None,
        metadata={
            "help": "Directory of a divrl reference store (written by `divrl presample`, at "
            "its config's reference.store): responses of the initial policy with their "
            "per-token log-probs. Required with divergence.",
        },
    )
    divergence_weighting: str = field(
        default="authors",
        metadata={
            "help": "How divergence_coef weighs the reference samples against TRL's loss "
            "(algorithm.divergence_weighting in `divrl train`). 'authors' (default): the term "
            "is multiplied by reference_batch_size / (completions in the micro-batch), so the "
            "reference stream weighs divergence_coef times its share of the samples, the "
            "balance of the DPH-RL authors' actor (one kind per micro-batch, equal micro-batch "
            "sizes), under which the paper's eta values were tuned. 'paper': loss = TRL's loss "
            "+ divergence_coef * D_f (an absolute weight). See docs/trl.md.",
        },
    )
    reference_batch_size: int = field(
        default=1,
        metadata={
            "help": "Reference samples per device per micro-batch (each compute_loss call). "
            "They cycle through the store in a seeded order (args.seed). Not the same count "
            "as `divrl train`'s reference.per_step (all processes, per step).",
        },
    )
    rollout_prompts: str = field(
        default="exploration",
        metadata={
            "help": "With DPH-RL, which rows of train_dataset are rolled out. 'exploration' "
            "(default): the rows whose prompt_id column names an exploration prompt of the "
            "store (the near-perfect ones are rehearsed from the store instead: DPH-RL's "
            "split); the dataset needs that column (trl_dataset writes it). 'all': every row.",
        },
    )
    allow_store_mismatch: bool = field(
        default=False,
        metadata={
            "help": "Train on a reference store presampled from another model (a warning "
            "instead of an error), as `divrl train --allow-store-mismatch`.",
        },
    )
    advantage: str | None = field(
        default=None,
        metadata={
            "help": "divrl's advantage estimator by its `divrl train` name "
            "(algorithm.advantage): one TRL computes natively sets scale_rewards (grpo = "
            "'group', grpo_batch = 'batch', dr_grpo = 'none'; TRL adds 1e-4 to the std, divrl "
            "1e-6); the others (rloo, gpg, grpo_passk) are refused, since TRL's GRPOTrainer "
            "computes the advantages itself. None (default): TRL's scale_rewards as set.",
        },
    )
    policy_loss: str | None = field(
        default=None,
        metadata={
            "help": "divrl's policy loss by its `divrl train` name (algorithm.policy_loss), "
            f"one of divrl.algorithms.POLICY_LOSSES ({', '.join(sorted(POLICY_LOSSES))}; a "
            "loss registered in your code is taken too): it replaces TRL's clipped "
            "per-token loss, reduced as loss_type reduces it. A loss needing what TRL's "
            "GRPOTrainer does not compute (the full-vocabulary logits, an input the adapter "
            "cannot give) is refused, naming it. None (default): TRL's own loss.",
        },
    )
    lp_reg: bool = field(
        default=False,
        metadata={
            "help": "Deprecated: the older spelling of policy_loss='lp_reg' (Lp-Reg: "
            "regularise the lowest-probability negative-advantage tokens toward a min-p "
            "proxy of the policy); set policy_loss instead. True with another policy_loss "
            "is refused. The authors also set epsilon=1.0 and epsilon_high=9.0 (the clip "
            "range of every other token).",
        },
    )
    loss_options: dict[str, Any] | str | None = field(
        default_factory=dict,
        metadata={
            "help": "The policy loss's options by `divrl train`'s names (algorithm.loss_options; "
            "e.g. Lp-Reg's rho, beta, kappa, min_k), as a dict or, on the command line, a "
            "JSON string ('{\"rho\": 0.02}'). Unset ones keep the loss's defaults and are "
            "filled in after validation; clip_low, clip_high and agg come from TRL's "
            "epsilon, epsilon_high and loss_type.",
        },
    )

    rehearsal_control: dict[str, Any] | str | None = field(
        default_factory=dict,
        metadata={
            "help": "DPH-RL: set eta (divergence_coef is the start) each optimiser step from "
            "a target, as algorithm.rehearsal_control in `divrl train` (docs/algorithms.md, "
            "'Rehearsal control'): a dict or a JSON string such as '{\"target\": 0.02}' "
            "(measure, target, rate, warmup_steps, min_scale, max_scale); empty = off. "
            "After validation it holds every option with its value.",
        },
    )

    max_unscorable: float = field(
        default=0.1,
        metadata={
            "help": "The share of a generation batch's completions (all processes together) "
            "that divrl's verifier_reward may leave unscorable (a verifier timeout, a crashed "
            "worker, a verifier error: returned as None, which TRL keeps out of the group "
            "mean and std with advantage 0; logged as reward/unscorable, a share); a batch "
            "with more stops training with a message. 0 stops at the first one, 1 never "
            "(train.max_unscorable in `divrl train`).",
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.max_unscorable <= 1.0:
            raise ValueError(
                f"max_unscorable={self.max_unscorable} must be a share from 0 to 1 (e.g. 0.1: "
                "stop when more than a tenth of a batch's completions are unscorable)"
            )
        self._apply_advantage()
        self._validate_dph()
        self.control_options = self._control_options()
        self.policy_loss_options = self._policy_loss_options()

    def _apply_advantage(self) -> None:
        """``advantage``: an estimator TRL computes natively becomes its scale_rewards."""
        name = self.advantage
        if name is None:
            return
        if name not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage={name!r}: use one of {sorted(ADVANTAGE_ESTIMATORS)}")
        scale = ADVANTAGE_OPTIONS[name].SCALE
        native = sorted(n for n, o in ADVANTAGE_OPTIONS.items() if o.SCALE is not None)
        if scale is None:
            raise ValueError(
                f"advantage={name!r}: TRL's GRPOTrainer computes the advantages itself and "
                f"scales them only by scale_rewards (the estimators {native}); run {name} "
                "with `divrl train` or the verl plugin"
            )
        aggregation = getattr(self, "multi_objective_aggregation", "sum_then_normalize")
        if aggregation != "sum_then_normalize":
            raise ValueError(
                f"advantage={name!r} sets scale_rewards, which multi_objective_aggregation="
                f"{aggregation!r} does not read: set it to 'sum_then_normalize' or drop advantage"
            )
        if self.scale_rewards not in ("group", scale):
            raise ValueError(
                f"advantage={name!r} is scale_rewards={scale!r} but scale_rewards="
                f"{self.scale_rewards!r} is set: keep one"
            )
        self.scale_rewards = scale

    def _validate_dph(self) -> None:
        if self.rollout_prompts not in ROLLOUT_PROMPTS:
            raise ValueError(
                f"rollout_prompts={self.rollout_prompts!r}: use one of {list(ROLLOUT_PROMPTS)}"
            )
        if self.divergence is None:
            if self.reference_store is not None:
                raise ValueError(
                    "reference_store is set but divergence is None: set divergence "
                    f"(one of {sorted(DIVERGENCES)}) to use the store, or drop the store"
                )
            return
        if self.divergence not in DIVERGENCES:
            raise ValueError(
                f"unknown divergence {self.divergence!r}: use one of {sorted(DIVERGENCES)}"
            )
        try:  # the divergence checks its own options
            divergence_generator(self.divergence, self.divergence_alpha)
        except ValueError as exc:
            raise ValueError(f"divergence_alpha={self.divergence_alpha!r}: {exc}") from exc
        if self.reference_store is None:
            raise ValueError(
                "DPH-RL needs a reference store: set reference_store to the directory "
                "`divrl presample` wrote (its config's reference.store)"
            )
        if not (self.divergence_coef >= 0 and math.isfinite(self.divergence_coef)):
            raise ValueError(
                f"divergence_coef must be a finite number >= 0, got {self.divergence_coef}"
            )
        if self.divergence_weighting not in TRL_DPH_WEIGHTINGS:
            raise ValueError(
                f"divergence_weighting={self.divergence_weighting!r}: use one of "
                f"{list(TRL_DPH_WEIGHTINGS)} ('concat' of divrl's trainer is not offered: TRL's "
                "loss normalisation depends on loss_type)"
            )
        if self.reference_batch_size < 1:
            raise ValueError(f"reference_batch_size must be >= 1, got {self.reference_batch_size}")
        if self.beta != 0.0:
            raise ValueError(
                f"beta={self.beta} loads a reference model for TRL's reverse-KL term; DPH-RL "
                "replaces it with the divergence on stored reference samples: set beta=0.0"
            )

    def _control_options(self) -> RehearsalControlOptions | None:
        """The rehearsal controller's typed options (None: off); the field is rewritten
        to every option with its value."""
        if isinstance(self.rehearsal_control, str):
            raise ValueError(
                f"rehearsal_control={self.rehearsal_control!r}: give a dict, or on the command "
                """line a JSON object such as '{"target": 0.02}'"""
            )
        options = RehearsalControlOptions.from_mapping(self.rehearsal_control)
        if options is None:
            self.rehearsal_control = {}
            return None
        if self.divergence is None or not self.divergence_coef > 0:
            raise ValueError(
                "rehearsal_control moves the DPH-RL divergence weight: set divergence and "
                "divergence_coef > 0 (the starting eta), or drop rehearsal_control"
            )
        self.rehearsal_control = options.as_dict()
        return options

    def _switched_loss(self) -> str | None:
        """``policy_loss``, or the loss an old boolean switch (:data:`LOSS_SWITCHES`) turns
        on; refused when the two name different losses."""
        name = self.policy_loss
        for switch, loss in LOSS_SWITCHES.items():
            if not getattr(self, switch):
                continue
            if name is not None and name != loss:
                raise ValueError(
                    f"{switch}=True (the older spelling of policy_loss={loss!r}) and "
                    f"policy_loss={name!r} disagree: drop {switch}"
                )
            name = loss
        return name

    def _policy_loss_options(self) -> LossOptions | None:
        """The typed options of the policy loss (None: TRL's own loss); the field
        ``loss_options`` is rewritten to every option but TRL's with its value."""
        if self.loss_options is None:
            self.loss_options = {}
        if isinstance(self.loss_options, str):  # a path or other non-JSON text
            raise ValueError(
                f"loss_options={self.loss_options!r}: give a dict, or on the command line a "
                """JSON object such as '{"rho": 0.02}'"""
            )
        name = self._switched_loss()
        if name is None:
            if self.loss_options:
                raise ValueError(
                    f"loss_options {sorted(self.loss_options)} are a policy loss's options: "
                    "set policy_loss (one of "
                    f"{sorted(POLICY_LOSSES)}), or drop loss_options"
                )
            return None
        if name not in POLICY_LOSSES:
            raise ValueError(f"policy_loss={name!r}: use one of {sorted(POLICY_LOSSES)}")
        self.policy_loss = name
        self._validate_replacement(name)
        high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        trl_values = {
            "clip_low": self.epsilon,
            "clip_high": high,
            "agg": REPLACEMENT_LOSS_TYPES[self.loss_type],
        }
        options = resolve_loss_options(name, dict(self.loss_options), trl_values)
        if self._vllm_weights() and not options.takes_token_weights:
            raise ValueError(
                f"policy_loss={name!r} takes no token_weights, which TRL's "
                "vllm_importance_sampling_correction multiplies its per-token loss by: set "
                "vllm_importance_sampling_correction=False or use a loss that takes them"
            )
        # every option with its value, so the serialised config names what the run used
        self.loss_options = {n: getattr(options, n) for n in options.names() if n not in TRL_SETS}
        return options

    def _vllm_weights(self) -> bool:
        """TRL multiplies its per-token loss by vLLM importance weights (TRL's condition)."""
        return bool(self.use_vllm and self.vllm_importance_sampling_correction)

    def _validate_replacement(self, name: str) -> None:
        # The loss replaces TRL's clipped per-token loss; the settings below change that
        # per-token loss in ways the replacement would not reproduce.
        if self.loss_type not in REPLACEMENT_LOSS_TYPES:
            raise ValueError(
                f"policy_loss={name!r} needs a clipped-surrogate loss_type, one of "
                f"{sorted(REPLACEMENT_LOSS_TYPES)}; got {self.loss_type!r}"
            )
        unsupported = {
            "importance_sampling_level='sequence' (set 'token')": (
                self.importance_sampling_level != "token"
            ),
            "delta (set delta=None)": self.delta is not None,
            "off_policy_mask_threshold (set it to None)": self.off_policy_mask_threshold
            is not None,
            "top_entropy_quantile < 1 (set 1.0)": self.top_entropy_quantile < 1.0,
        }
        bad = [setting for setting, on in unsupported.items() if on]
        if bad:
            raise ValueError(f"policy_loss={name!r} does not support " + "; ".join(bad))
