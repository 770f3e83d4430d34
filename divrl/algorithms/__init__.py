"""Pure torch functions for RLVR losses: no models, no I/O.

Shapes are ``[batch, response_len]`` unless a docstring says otherwise; inputs may be fp32
or bf16 (computed in fp32), on any device. Each loss returns ``(loss, metrics)`` with
``metrics`` a dict of Python floats. The methods follow docs/algorithms.md: the authors' code behaviour by default, the paper's form as an
option where the two differ.
"""

from divrl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_OPTIONS,
    ADVANTAGE_SCALES,
    AdvantageOptions,
    advantage_options,
    advantage_summaries,
    compute_advantages,
    group_advantages,
    register_advantage,
)
from divrl.algorithms.aggregation import AGGREGATIONS, aggregate
from divrl.algorithms.divergences import (
    DIVERGENCES,
    DivergenceSpec,
    divergence_generator,
    divergence_summaries,
    reference_divergence_loss,
    register_divergence,
)
from divrl.algorithms.dph_weighting import (
    DIVERGENCE_WEIGHTINGS,
    AuthorsLayout,
    StreamWeights,
    authors_effective_eta,
    authors_step_etas,
    micro_batch_weights,
    stream_weights,
)
from divrl.algorithms.entropy_control import (
    clip_cov_loss,
    entropy_bonus,
    high_entropy_mask,
    high_entropy_policy_loss,
    kl_cov_loss,
)
from divrl.algorithms.kl import KL_ESTIMATORS, kl_estimate
from divrl.algorithms.logits import LogitStats, entropy_from_logits, logit_stats, token_log_probs
from divrl.algorithms.loss_options import (
    ClipCovOptions,
    GSPOOptions,
    HighEntropyOptions,
    KLCovOptions,
    LossOptions,
    LpRegOptions,
    VanillaOptions,
)
from divrl.algorithms.lp_reg import (
    FILTERED_LOG_PROB,
    LpRegSelection,
    lp_reg_loss,
    lp_reg_net_push,
    lp_reg_regime_metrics,
    lp_reg_selection,
    minp_log_normalizer,
    proxy_log_prob,
    proxy_log_prob_rows,
)
from divrl.algorithms.options import Options, option
from divrl.algorithms.policy_loss import (
    POLICY_LOSS_OPTIONS,
    POLICY_LOSSES,
    PolicyLossSpec,
    get_policy_loss,
    gspo_loss,
    policy_loss,
    policy_loss_options,
    policy_loss_spec,
    register_policy_loss,
)
from divrl.algorithms.rehearsal_control import (
    CONTROL_MEASURES,
    RehearsalController,
    RehearsalControlOptions,
    control_measurement,
)
from divrl.algorithms.rollout_correction import ROLLOUT_IS_LEVELS, rollout_is_weights

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_OPTIONS",
    "ADVANTAGE_SCALES",
    "AGGREGATIONS",
    "CONTROL_MEASURES",
    "DIVERGENCES",
    "DIVERGENCE_WEIGHTINGS",
    "FILTERED_LOG_PROB",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "POLICY_LOSS_OPTIONS",
    "ROLLOUT_IS_LEVELS",
    "AdvantageOptions",
    "AuthorsLayout",
    "ClipCovOptions",
    "DivergenceSpec",
    "GSPOOptions",
    "HighEntropyOptions",
    "KLCovOptions",
    "LogitStats",
    "LossOptions",
    "LpRegOptions",
    "LpRegSelection",
    "Options",
    "PolicyLossSpec",
    "RehearsalControlOptions",
    "RehearsalController",
    "StreamWeights",
    "VanillaOptions",
    "advantage_options",
    "advantage_summaries",
    "aggregate",
    "authors_effective_eta",
    "authors_step_etas",
    "clip_cov_loss",
    "compute_advantages",
    "control_measurement",
    "divergence_generator",
    "divergence_summaries",
    "entropy_bonus",
    "entropy_from_logits",
    "get_policy_loss",
    "group_advantages",
    "gspo_loss",
    "high_entropy_mask",
    "high_entropy_policy_loss",
    "kl_cov_loss",
    "kl_estimate",
    "logit_stats",
    "lp_reg_loss",
    "lp_reg_net_push",
    "lp_reg_regime_metrics",
    "lp_reg_selection",
    "micro_batch_weights",
    "minp_log_normalizer",
    "option",
    "policy_loss",
    "policy_loss_options",
    "policy_loss_spec",
    "proxy_log_prob",
    "proxy_log_prob_rows",
    "reference_divergence_loss",
    "register_advantage",
    "register_divergence",
    "register_policy_loss",
    "rollout_is_weights",
    "stream_weights",
    "token_log_probs",
]
