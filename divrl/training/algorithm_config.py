"""The ``algorithm`` section of the training config: the policy loss and its options, the
advantage scale, the reverse-KL, entropy and DPH-RL divergence terms, DAPO's dynamic
sampling and overlong shaping (read by :mod:`divrl.training.update` and
:mod:`divrl.training.experience`; the loss options resolved by
:mod:`divrl.training.loss_config`, the authors' layout checked by
:mod:`divrl.training.authors_config`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

from divrl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    DIVERGENCES,
    POLICY_LOSSES,
    ROLLOUT_IS_LEVELS,
    AdvantageOptions,
    LossOptions,
    advantage_options,
    advantage_summaries,
    divergence_summaries,
)
from divrl.algorithms.divergences import check_divergence_setting
from divrl.algorithms.rehearsal_control import RehearsalController, RehearsalControlOptions
from divrl.training import authors_config, loss_config
from divrl.training.config_io import ConfigError, choice, help_field, positive

__all__ = ["AlgorithmConfig"]

#: algorithm.adv_scale of earlier versions -> the estimator that computes the same advantages
ADV_SCALE_ESTIMATORS = {"group": "grpo", "batch": "grpo_batch", "none": "dr_grpo"}

_UNSET = "null = the policy loss's own default (divrl.algorithms.loss_options)"


@dataclass
class AlgorithmConfig:
    policy_loss: str = help_field(
        "policy-gradient term, a name in divrl.algorithms.POLICY_LOSSES (vanilla: the clipped "
        f"surrogate of GRPO/DAPO): {', '.join(sorted(POLICY_LOSSES))}",
        "vanilla",
    )
    advantage: str = help_field(
        "advantage estimator, a name in divrl.algorithms.ADVANTAGE_ESTIMATORS: "
        f"{advantage_summaries()} (the earlier algorithm.adv_scale group / batch / none is "
        "read as grpo / grpo_batch / dr_grpo)",
        "grpo",
    )
    advantage_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "options of algorithm.advantage by the estimator's own names (e.g. {k: 4} "
            "for grpo_passk); unset ones keep its defaults; an option it does not take is an "
            "error. After loading: every option the estimator runs with"
        },
    )
    # --- fidelity to the authors' scripts: the policy loss's options, resolved by divrl.training.loss_config
    loss_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "options of algorithm.policy_loss by the loss's own names (e.g. {rho: "
            "0.01, min_k: 2} for lp_reg); unset ones keep the loss's defaults; an option the "
            "loss does not take is an error. After loading: every option the loss runs with"
        },
    )
    clip_low: float | None = help_field(f"ratio clip below: r >= 1 - clip_low ({_UNSET})", None)
    clip_high: float | None = help_field(
        f"ratio clip above: r <= 1 + clip_high, DAPO clip-higher 0.28 ({_UNSET})", None
    )
    dual_clip: float | None = help_field(
        "dual-clip c for A < 0, verl's clip_ratio_c (null = off; gspo/lp_reg/kl_cov refuse it)",
        None,
    )
    loss_agg: str | None = help_field(
        f"loss aggregation mode, verl names or micro-batch-token-mean; also aggregates the "
        f"KL, entropy and DPH terms ({_UNSET}: token-mean, gspo seq-mean-token-mean)",
        None,
    )
    lp_reg_scope: Literal["micro_batch", "mini_batch", "step", "group", "authors"] = help_field(
        "Lp-Reg: the tokens of the rho-quantile selection: each of divrl's micro-batches, "
        "the mini-batch, the whole step, groups of lp_reg_group_size sequences, or 'authors': "
        "the Lp-Reg authors' micro-batches (each virtual GPU's lp_reg_group_size rows cut "
        "into Karmarkar-Karp partitions of lp_reg_micro_batch_tokens, as verl's dynamic batch "
        "size). All but micro_batch cost one extra no-grad forward per mini-batch",
        "micro_batch",
    )
    lp_reg_group_size: int | None = help_field(
        "Lp-Reg, lp_reg_scope=group: sequences per selection group (consecutive rows); "
        "lp_reg_scope=authors: rows per virtual GPU (theirs: 32 on-policy, 4 off-policy)",
        None,
    )
    lp_reg_micro_batch_tokens: int | None = help_field(
        "Lp-Reg, lp_reg_scope=authors: the token budget (prompt + response) of the authors' "
        "micro-batches (null = train.micro_batch_tokens; theirs 30720)",
        None,
    )
    lp_reg_balance_batch: bool = help_field(
        "Lp-Reg, lp_reg_scope=authors: deal the step's rows to the virtual GPUs as verl's "
        "trainer.balance_batch deals them to its ranks (equal-size Karmarkar-Karp partitions "
        "of prompt + response tokens; on in the Lp-Reg authors' runs) instead of "
        "consecutive rows; with several processes each balances its own rows",
        False,
    )
    rollout_is: str | None = help_field(
        "rollout importance-sampling correction of the engine's sampling log-probs against "
        "the trainer's old log-probs (docs/algorithms.md, 'Rollout correction'): 'token' "
        "(truncated IS per token, TIS), 'sequence' (one truncated weight per sequence), "
        "null (off), or 'auto': token for an engine that samples with its own kernels (vllm), "
        "null for one that samples with the policy itself (hf, static). After loading: the "
        "level used",
        "auto",
    )
    rollout_is_threshold: float = help_field(
        "rollout IS: the cap C of the weights, w = min(pi_old / mu, C) (verl's default 2.0; "
        "TRL's 3.0)",
        2.0,
    )
    rollout_rs_threshold: float | None = help_field(
        "rollout correction: tokens whose ratio pi_old / mu lies outside [1/b, b] get weight "
        "0 (IcePop masking; null = off), with or without rollout_is",
        None,
    )
    kl_coef: float = help_field(
        "beta of the online reverse-KL term on policy samples (> 0 loads a frozen reference model)",
        0.0,
    )
    kl_estimator: Literal["k1", "k2", "k3"] = help_field("estimator of the reverse KL", "k3")
    divergence: str | None = help_field(
        f"DPH-RL divergence on reference samples (null = off), a name in "
        f"divrl.algorithms.DIVERGENCES: {divergence_summaries()}",
        None,
    )
    divergence_alpha: float | None = help_field("alpha of the alpha-divergence, in (0, 1)", None)
    divergence_coef: float = help_field("eta: weight of the divergence term", 0.0)
    divergence_weighting: Literal["authors", "paper", "concat"] = help_field(
        "DPH-RL weight of the reference stream (docs/algorithms.md): 'authors': the authors' "
        "balance from the authors_* layout (eta/8 forward_kl.sh, 0.078 eta js_kl.sh, "
        "alpha.sh on 8 GPUs); 'paper': L_pg + eta * L_f; 'concat': one token-mean over both "
        "streams",
        "authors",
    )
    rehearsal_control: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "DPH-RL: set eta each step from a target instead of fixing it ({} = off; "
            "docs/algorithms.md, 'Rehearsal control'): {measure: likelihood, target: 0.02} "
            "holds the reference responses' loss of log-likelihood at 0.02 nats per token; "
            "also rate, warmup_steps, min_scale, max_scale (bounds as multiples of "
            "divergence_coef, the starting eta). After loading: every option it runs with"
        },
    )
    authors_gpus: int = help_field(
        "the DPH-RL authors' GPU count, 8 x nodes: their scripts set n_gpus_per_node=8 and "
        "nnodes from the cluster (8 on one node: 0.078 eta for js_kl.sh; 16 on two: 0.109 eta)",
        8,
    )
    authors_dynamic_batch: bool = help_field("the authors' run had dynamic batch sizes", False)
    authors_micro_batch_size: int = help_field("the authors' fixed micro-batch rows per GPU", 2)
    entropy_coef: float = help_field("entropy bonus: loss -= coef * aggregate(H)", 0.0)
    dynamic_sampling: bool = help_field(
        "DAPO: drop groups whose rewards are all equal and refill the batch", False
    )
    max_refill_rounds: int = help_field("DAPO: extra generation rounds to refill the batch", 4)
    gen_batch_factor: int = help_field("DAPO: prompts per round = this x prompts_per_step", 1)
    refill_exhausted: Literal["continue", "raise"] = help_field(
        "DAPO: when the last round leaves the batch short of informative groups: 'continue' "
        "trains on the groups kept (a warning, dapo/short_batch logged and counted at the "
        "end), 'raise' stops the run as verl's DAPO and entropy recipes do",
        "continue",
    )
    overlong_buffer: int = help_field(
        "DAPO overlong shaping: length of the penalty buffer before max_new_tokens (0 = off)", 0
    )
    overlong_penalty: float = help_field("DAPO overlong shaping: penalty at max_new_tokens", 1.0)

    def __post_init__(self) -> None:
        choice("algorithm.policy_loss", self.policy_loss, sorted(POLICY_LOSSES))
        self._resolve_loss_options()
        choice("algorithm.advantage", self.advantage, sorted(ADVANTAGE_ESTIMATORS))
        try:
            estimator = advantage_options(self.advantage, **dict(self.advantage_options))
        except ValueError as exc:
            raise ConfigError(f"algorithm.advantage_options: {exc}") from exc
        self.advantage_options = estimator.kwargs()
        if self.divergence is not None:
            choice("algorithm.divergence", self.divergence, sorted(DIVERGENCES))
            try:
                check_divergence_setting(self.divergence, self.divergence_alpha, "algorithm.")
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        for name in ("kl_coef", "divergence_coef", "entropy_coef"):
            positive(f"algorithm.{name}", getattr(self, name), allow_zero=True)
        if self.lp_reg_scope != "micro_batch" and not self.options.SCOPED_SELECTION:
            raise ConfigError(
                f"algorithm.lp_reg_scope={self.lp_reg_scope!r} is set but "
                f"algorithm.policy_loss={self.policy_loss!r} selects no share of tokens "
                "(its options declare no SCOPED_SELECTION): remove it"
            )
        self._resolve_rehearsal_control()
        if self.rollout_is is not None:
            choice("algorithm.rollout_is", self.rollout_is, ["auto", *ROLLOUT_IS_LEVELS])
        if self.rollout_is_threshold < 1.0:
            raise ConfigError(
                f"algorithm.rollout_is_threshold={self.rollout_is_threshold} must be >= 1 (the "
                "cap of the importance weights)"
            )
        if self.rollout_rs_threshold is not None and self.rollout_rs_threshold <= 1.0:
            raise ConfigError(
                f"algorithm.rollout_rs_threshold={self.rollout_rs_threshold} must be > 1 (tokens "
                "outside [1/b, b] are masked) or null"
            )
        positive("algorithm.max_refill_rounds", self.max_refill_rounds, allow_zero=True)
        if problems := authors_config.algorithm_problems(self):
            raise ConfigError("; ".join(problems))
        positive("algorithm.overlong_buffer", self.overlong_buffer, allow_zero=True)

    def _resolve_loss_options(self) -> None:
        """Typed options of the policy loss (bounds checked once, by its dataclass); the
        flat keys and loss_options are rewritten to the values the loss runs with."""
        flat = {key: getattr(self, key) for key in loss_config.FLAT_OPTION_KEYS}
        try:
            resolved = loss_config.resolved_option_fields(
                self.policy_loss, flat, dict(self.loss_options)
            )
        except ValueError as exc:
            raise ConfigError(f"algorithm: {exc}") from exc
        for key, value in resolved.items():
            setattr(self, key, value)

    def _resolve_rehearsal_control(self) -> None:
        try:
            control = RehearsalControlOptions.from_mapping(self.rehearsal_control)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"algorithm.{exc}") from exc
        if control is None:
            return
        if self.divergence is None or self.divergence_coef <= 0:
            raise ConfigError(
                "algorithm.rehearsal_control moves the DPH-RL divergence weight: set "
                "algorithm.divergence and algorithm.divergence_coef > 0 (the starting eta), "
                "or remove rehearsal_control"
            )
        try:  # its bounds: divergence_coef times the scales, positive and finite
            RehearsalController(control, self.divergence_coef)
        except ValueError as exc:
            raise ConfigError(f"algorithm.rehearsal_control: {exc}") from exc
        self.rehearsal_control = control.as_dict()

    @property
    def control(self) -> RehearsalControlOptions | None:
        """The rehearsal controller's validated options, None when it is off."""
        return RehearsalControlOptions.from_mapping(self.rehearsal_control)

    @functools.cached_property
    def options(self) -> LossOptions:
        """The policy loss's validated options (``loss_kwargs()`` are its keyword args),
        built once: the section is not changed after loading."""
        return loss_config.resolve_loss_options(self.policy_loss, {}, self.loss_options)

    def resolve_rollout_is(self, separate_sampler: bool) -> None:
        """``rollout_is: auto`` resolved (token when the engine samples with its own kernels,
        ``separate_sampler``; else off); the correction's weights need a loss that takes
        them."""
        auto = self.rollout_is == "auto"
        if auto:
            self.rollout_is = "token" if separate_sampler else None
        if self.rollout_correction and not self.options.takes_token_weights:
            setting = (
                f"algorithm.rollout_is={self.rollout_is}"
                + (" (auto: the engine samples with its own kernels)" if auto else "")
                if self.rollout_is is not None
                else f"algorithm.rollout_rs_threshold={self.rollout_rs_threshold}"
            )
            raise ConfigError(
                f"{setting} reweighs the policy loss's tokens, but policy loss "
                f"{self.policy_loss!r} takes no per-token weights (token_weights is not among "
                "its options' INPUTS): set algorithm.rollout_is=null and "
                "algorithm.rollout_rs_threshold=null"
            )

    @property
    def rollout_correction(self) -> bool:
        """The policy loss's tokens are reweighed by the rollout correction."""
        return self.rollout_is is not None or self.rollout_rs_threshold is not None

    @property
    def estimator(self) -> AdvantageOptions:
        """The advantage estimator's validated options (``kwargs()``: its keyword args)."""
        return advantage_options(self.advantage, **self.advantage_options)

    @staticmethod
    def migrate(raw: dict[str, Any]) -> dict[str, Any]:
        """Read ``adv_scale`` of earlier versions as the estimator it named; refuse the
        per-loss keys of earlier versions, naming where each went."""
        if "adv_scale" in raw:
            raw = dict(raw)
            scale = raw.pop("adv_scale")
            if scale not in ADV_SCALE_ESTIMATORS:
                raise ConfigError(
                    f"algorithm.adv_scale={scale!r}: use algorithm.advantage, one of "
                    f"{', '.join(sorted(ADVANTAGE_ESTIMATORS))}"
                )
            named = ADV_SCALE_ESTIMATORS[scale]
            if raw.get("advantage", named) != named:
                raise ConfigError(
                    f"algorithm.adv_scale={scale!r} (the estimator {named}) and "
                    f"algorithm.advantage={raw['advantage']!r} disagree: set "
                    f"algorithm.advantage={named} instead of algorithm.adv_scale={scale}, or "
                    "drop adv_scale"
                )
            raw["advantage"] = named
        removed = {k: v for k, v in loss_config.REMOVED_KEYS.items() if k in raw}
        if removed:
            moved = ", ".join(
                f"algorithm.{k} -> algorithm.loss_options.{v}" for k, v in removed.items()
            )
            raise ConfigError(f"removed keys (CHANGELOG.md): {moved}")
        return raw
