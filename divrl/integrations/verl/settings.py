"""What divrl adds to a verl run, read from the ``divrl`` section of verl's Hydra config.

verl's own dataclasses (``ActorConfig``, ``PolicyLossConfig``) reject keys they do not
declare, so divrl's settings live in a top-level section of their own, added on the command
line with Hydra's ``+`` prefix (``+divrl.divergence=js``) or in a recipe's YAML. The names
are those of ``divrl train``'s config (``algorithm.divergence`` -> ``divrl.divergence``;
docs/verl.md has the whole table). The clip range and the aggregation are verl's own keys
(``actor_rollout_ref.actor.clip_ratio_low`` ..., ``loss_agg_mode``), read by the loss.

This module imports neither torch nor verl, so a config can be checked anywhere.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from divrl.algorithms.divergences import DIVERGENCES, check_divergence_setting
from divrl.algorithms.dph_weighting import DIVERGENCE_WEIGHTINGS
from divrl.algorithms.loss_options import LpRegOptions
from divrl.algorithms.rehearsal_control import RehearsalControlOptions

POLICY_LOSSES = ("vanilla", "lp_reg")
#: Lp-Reg's options set in the divrl section (``full_vocab`` is refused, as by divrl train:
#: no trainer computes the full-vocabulary rows it needs)
LP_REG_OPTIONS = ("rho", "beta", "kappa", "min_k")
#: options that are verl's own keys
VERL_KEYS = {
    "clip_low": "actor_rollout_ref.actor.clip_ratio_low",
    "clip_high": "actor_rollout_ref.actor.clip_ratio_high",
    "dual_clip": "actor_rollout_ref.actor.clip_ratio_c",
    "agg": "actor_rollout_ref.actor.loss_agg_mode",
}
SECTION = "divrl"
#: verl loss modes DPH-RL's rollout term is computed with (through verl's registry): those
#: whose aggregation is the actor's ``loss_agg_mode`` (DPH's stream weights count tokens)
COMPOSED_LOSS_MODES = (
    "vanilla",
    "divrl_vanilla",
    "dppo_tv",
    "dppo_kl",
    "gspo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "dro",
    "cispo",
)
#: why the other registered modes cannot be DPH-RL's rollout term
REFUSED_LOSS_MODES = {
    "sapo": "it aggregates seq-mean-token-mean whatever loss_agg_mode says",
    "geo_mean": "it aggregates per sequence (a geometric mean), not over tokens",
    "bypass_mode": "it needs verl's rollout-correction bypass, which skips the pass DPH reads",
}


class VerlSettingsError(ValueError):
    """A ``divrl.*`` key of a verl config is unknown or out of range."""


@dataclass(frozen=True)
class DivRLVerlSettings:
    """divrl's keys in a verl config (all optional: the defaults are plain GRPO).

    Attributes:
        policy_loss: ``vanilla`` (the clipped surrogate; verl's clip range, dual clip
            ``clip_ratio_c`` and ``loss_agg_mode``) or ``lp_reg``.
        divergence: DPH-RL's f-divergence on rehearsal rows (null = no DPH).
        divergence_alpha: alpha of the ``alpha`` divergence, in (0, 1).
        divergence_coef: eta.
        divergence_weighting: ``authors``, ``paper`` or ``concat`` (as in ``divrl train``).
        reference_store: the store ``divrl presample`` wrote.
        reference_per_step: rehearsal rows joined to each step's batch (all ranks together).
        reference_seed: the seed of the rehearsal draw order.
        allow_store_mismatch: train on a store presampled at another temperature.
        loss_options: the policy loss's own options by the names ``divrl train`` gives
            them under ``algorithm.loss_options`` (Lp-Reg: ``rho``, ``beta``, ``kappa``,
            ``min_k``); the clip range and the aggregation are verl's keys.
        rehearsal_control: DPH-RL's eta set each step from a target (``divergence_coef``
            the start), the options of ``algorithm.rehearsal_control`` in ``divrl train``
            (:class:`divrl.algorithms.RehearsalControlOptions`); empty = off.
        authors_gpus, authors_dynamic_batch, authors_micro_batch_size: the DPH-RL authors'
            layout that the ``authors`` weighting's eta is computed from
            (:class:`divrl.algorithms.AuthorsLayout`; their scripts: 8 GPUs, micro-batches
            of 2, dynamic batch sizes in the JS and alpha runs).
    """

    policy_loss: str = "vanilla"
    divergence: str | None = None
    divergence_alpha: float | None = None
    divergence_coef: float = 0.0
    divergence_weighting: str = "authors"
    reference_store: str | None = None
    reference_per_step: int = 0
    reference_seed: int = 0
    allow_store_mismatch: bool = False
    loss_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    rehearsal_control: dict[str, Any] = dataclasses.field(default_factory=dict)
    authors_gpus: int = 8
    authors_dynamic_batch: bool = False
    authors_micro_batch_size: int = 2

    def __post_init__(self) -> None:
        if self.loss_options is None:  # YAML `loss_options:` with nothing under it
            object.__setattr__(self, "loss_options", {})
        if self.rehearsal_control is None:
            object.__setattr__(self, "rehearsal_control", {})
        _check_types(self)
        _choice("policy_loss", self.policy_loss, POLICY_LOSSES)
        _choice("divergence_weighting", self.divergence_weighting, DIVERGENCE_WEIGHTINGS)
        if self.divergence is not None:
            # any registered divergence (divrl.algorithms.DIVERGENCES), as in divrl train
            try:
                check_divergence_setting(self.divergence, self.divergence_alpha, f"{SECTION}.")
            except ValueError as exc:
                raise VerlSettingsError(str(exc)) from exc
        if self.divergence_coef < 0:
            raise VerlSettingsError(
                f"{SECTION}.divergence_coef={self.divergence_coef} must be >= 0 (eta)"
            )
        if self.reference_per_step < 0:
            raise VerlSettingsError(
                f"{SECTION}.reference_per_step={self.reference_per_step} must be >= 0"
            )
        if self.divergence is None and self.divergence_coef > 0:
            raise VerlSettingsError(
                f"{SECTION}.divergence_coef={self.divergence_coef} has no effect without "
                f"{SECTION}.divergence: set {SECTION}.divergence ({', '.join(sorted(DIVERGENCES))}) "
                f"for DPH-RL, or remove {SECTION}.divergence_coef"
            )
        if self.dph and (self.reference_store is None or self.reference_per_step < 1):
            raise VerlSettingsError(
                f"{SECTION}.divergence is set: set {SECTION}.reference_store (the folder "
                f"`divrl presample` wrote) and {SECTION}.reference_per_step >= 1"
            )
        self._check_loss_options()
        self._check_control()

    def _check_control(self) -> None:
        try:
            options = self.control
        except ValueError as e:
            raise VerlSettingsError(f"{SECTION}.{e}") from e
        if options is not None and not self.dph:
            raise VerlSettingsError(
                f"{SECTION}.rehearsal_control moves DPH-RL's eta: set {SECTION}.divergence and "
                f"{SECTION}.divergence_coef > 0 (the starting eta), or remove it"
            )

    @property
    def control(self) -> RehearsalControlOptions | None:
        """The rehearsal controller's validated options, None when it is off."""
        return RehearsalControlOptions.from_mapping(self.rehearsal_control)

    def _check_loss_options(self) -> None:
        keys = set(self.loss_options)
        if self.policy_loss == "vanilla" and keys:
            raise VerlSettingsError(
                f"{SECTION}.loss_options {sorted(keys)}: the vanilla loss takes its options "
                "from verl's keys (actor_rollout_ref.actor.clip_ratio_low, clip_ratio_high, "
                "clip_ratio_c, loss_agg_mode)"
            )
        for key in sorted(keys & set(VERL_KEYS)):
            raise VerlSettingsError(
                f"{SECTION}.loss_options.{key}: set verl's {VERL_KEYS[key]} instead"
            )
        unknown = sorted(keys - set(LP_REG_OPTIONS))
        if unknown:
            raise VerlSettingsError(
                f"{SECTION}.loss_options: unknown option(s) {unknown}; Lp-Reg takes "
                + ", ".join(LP_REG_OPTIONS)
            )
        try:
            self.lp_reg_options()
        except ValueError as e:
            raise VerlSettingsError(f"{SECTION}.loss_options: {e}") from e

    @property
    def dph(self) -> bool:
        """Whether the run adds DPH-RL's divergence term."""
        return self.divergence is not None and self.divergence_coef > 0

    @property
    def replaces_loss(self) -> bool:
        """Whether the actor's loss is divrl's (DPH-RL or Lp-Reg); else it is verl's own."""
        return self.dph or self.policy_loss == "lp_reg"

    def lp_reg_options(
        self, clip_low: float = 1.0, clip_high: float = 9.0, agg: str = "token-mean"
    ) -> LpRegOptions:
        """The validated :class:`LpRegOptions` (clip range and aggregation from verl's keys)."""
        return LpRegOptions(clip_low=clip_low, clip_high=clip_high, agg=agg, **self.loss_options)

    def authors_layout(self, rollouts: int, mini_batches: int):
        """The authors' layout of a step with ``rollouts`` rows and this run's rehearsal rows
        (``divergence_weighting=authors``), or None for the other weightings."""
        from divrl.algorithms.dph_weighting import AuthorsLayout

        if not (self.dph and self.divergence_weighting == "authors"):
            return None
        try:
            return AuthorsLayout(
                rollouts=rollouts,
                references=self.reference_per_step,
                mini_batches=mini_batches,
                gpus=self.authors_gpus,
                micro_batch_size=self.authors_micro_batch_size,
                dynamic=self.authors_dynamic_batch,
            )
        except ValueError as e:
            raise VerlSettingsError(
                f"{SECTION}.divergence_weighting=authors: {e}; set {SECTION}.authors_* to "
                "sizes that fit or use divergence_weighting=paper"
            ) from e

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any] | None) -> DivRLVerlSettings:
        """Settings from the ``divrl`` section of a verl config (a dict or DictConfig).

        Raises:
            VerlSettingsError: an unknown key (listing the valid ones) or a bad value.
        """
        values = {k: _plain(v) for k, v in dict(section or {}).items()}
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise VerlSettingsError(
                f"unknown key(s) {', '.join(f'{SECTION}.{k}' for k in unknown)}; valid: "
                + ", ".join(names)
            )
        return cls(**values)


def _check_types(settings: DivRLVerlSettings) -> None:
    """Each field's value against its annotation: numbers finite and not quoted, whole
    numbers whole, switches true or false (YAML's ``'no'`` is a string, which Python
    would count as true), no NaN or infinity among the loss options.

    Raises:
        VerlSettingsError: naming the key, its value and what it must be.
    """
    hints = typing.get_type_hints(type(settings))
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        tp = hints[f.name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):  # X | None
            if value is None:
                continue
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        base = typing.get_origin(tp) or tp
        need = _TYPE_NAMES[base]
        if base is float:
            ok = _is_number(value) and math.isfinite(value)
        elif base is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, base)
        if not ok:
            raise VerlSettingsError(f"{SECTION}.{f.name}={value!r} must be {need}")
    for key, value in settings.loss_options.items():  # the loss checks names and ranges
        if isinstance(value, float) and not math.isfinite(value):
            raise VerlSettingsError(
                f"{SECTION}.loss_options.{key}={value!r} must be a finite number"
            )


_TYPE_NAMES = {
    float: "a finite number (unquoted)",
    int: "a whole number (unquoted)",
    bool: "true or false",
    str: "a string",
    dict: "a mapping of option names to numbers",
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    """A DictConfig (Hydra's nested section) as a plain dict."""
    return {k: _plain(v) for k, v in value.items()} if hasattr(value, "items") else value


def _choice(name: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise VerlSettingsError(f"{SECTION}.{name}={value!r}; valid: {', '.join(valid)}")


def config_value(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """``config``'s value at a dotted key (a DictConfig or nested dicts), else ``default``."""
    node: Any = config
    for part in dotted.split("."):
        if not hasattr(node, "get"):
            return default
        node = node.get(part, None)
        if node is None:
            return default
    return node


#: the aggregations divrl's losses implement (verl's ``token-sum`` is not one)
DIVRL_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
#: Megatron FP8 recipes under which verl pads each packed sequence to a multiple of 16
FP8_PADDED = ("e4m3", "hybrid")
MEGATRON_REFUSAL = (
    "Lp-Reg's proxy under Megatron needs actor_rollout_ref.actor.megatron."
    "tensor_model_parallel_size=1 and context_parallel_size=1 (its softmax, min-p and "
    "label reductions are over the whole vocabulary and sequence), got TP={tp}, CP={cp}"
)
ACTOR = "actor_rollout_ref.actor"


def composition_errors(config: Mapping[str, Any], settings: DivRLVerlSettings) -> list[str]:
    """What in a verl config cannot stand beside divrl's loss (one line per key), or [].

    Called at start-up (:mod:`divrl.integrations.verl.startup`'s gate in verl's
    ``validate_config``, and the trainer mode's constructor), before Ray starts any worker,
    so a run that would drop one of the user's settings stops at once instead of at step 400.
    Nothing is refused when divrl's loss is off (verl's own ``ppo_loss`` runs).
    """
    if not settings.replaces_loss:
        return []
    errors = []
    if config_value(config, "distillation.enabled", False):
        errors.append(
            "distillation.enabled=True: verl's distillation loss is the actor loss that "
            f"{SECTION}'s DPH-RL / Lp-Reg loss replaces; switch one of them off"
        )
    if settings.policy_loss == "lp_reg":
        errors += _lp_reg_errors(config, settings)
    if settings.dph:
        errors += _dph_errors(config, settings)
    return errors


def _lp_reg_errors(config: Mapping[str, Any], settings: DivRLVerlSettings) -> list[str]:
    """What cannot stand beside Lp-Reg (its proxy needs each position's whole logits row)."""
    errors = []
    mode = config_value(config, f"{ACTOR}.policy_loss.loss_mode", "vanilla")
    if mode != "vanilla":
        errors.append(
            f"{ACTOR}.policy_loss.loss_mode={mode}: Lp-Reg ({SECTION}.policy_loss=lp_reg) is "
            "the policy term itself and cannot stand beside another loss mode; set it to vanilla"
        )
    agg = config_value(config, f"{ACTOR}.loss_agg_mode", "token-mean")
    if agg not in DIVRL_AGGS:
        errors.append(
            f"{ACTOR}.loss_agg_mode={agg}: divrl's Lp-Reg aggregates with "
            f"{', '.join(DIVRL_AGGS)}; set one of them"
        )
    if config_value(config, "actor_rollout_ref.model.use_fused_kernels"):
        errors.append(
            "actor_rollout_ref.model.use_fused_kernels=True: fused kernels never materialise "
            "the logits Lp-Reg's proxy is computed from; set it to False"
        )
    for key in ("ulysses_sequence_parallel_size", "fsdp_config.ulysses_sequence_parallel_size"):
        sp = config_value(config, f"{ACTOR}.{key}", 1)
        if sp > 1:
            errors.append(
                f"{ACTOR}.{key}={sp}: Lp-Reg's proxy needs each position's whole logits row, "
                "which Ulysses splits; set it to 1"
            )
    for key in ("pad_to_length", "fsdp_config.pad_to_length", "megatron.pad_to_length"):
        if config_value(config, f"{ACTOR}.{key}", False):
            errors.append(
                f"{ACTOR}.{key}=True: verl's engine gives no logits hook to a padded-to-length "
                "forward (it is the top-K distillation path), and Lp-Reg's proxy is computed "
                "there; set it to False"
            )
            break  # the engine's keys default to the actor's: one line for one setting
    if config_value(config, f"{ACTOR}.strategy", "fsdp") == "megatron":
        tp = int(config_value(config, f"{ACTOR}.megatron.tensor_model_parallel_size", 1) or 1)
        cp = int(config_value(config, f"{ACTOR}.megatron.context_parallel_size", 1) or 1)
        if tp > 1 or cp > 1:
            errors.append(MEGATRON_REFUSAL.format(tp=tp, cp=cp))
        fp8 = config_value(config, f"{ACTOR}.megatron.override_transformer_config.fp8")
        if fp8 in FP8_PADDED and config_value(config, f"{ACTOR}.megatron.use_remove_padding", True):
            errors.append(
                f"{ACTOR}.megatron.override_transformer_config.fp8={fp8}: verl pads each packed "
                "sequence to a multiple of 16 under FP8, and Lp-Reg's next-token labels assume "
                "sequences packed end to end; unset fp8 for Lp-Reg"
            )
    return errors


def _dph_errors(config: Mapping[str, Any], settings: DivRLVerlSettings) -> list[str]:
    """What cannot stand beside DPH-RL's rehearsal rows and stream weights."""
    errors = []
    mode = config_value(config, f"{ACTOR}.policy_loss.loss_mode", "vanilla")
    if mode not in COMPOSED_LOSS_MODES:
        why = REFUSED_LOSS_MODES.get(mode, "it is not one divrl has checked")
        errors.append(
            f"{ACTOR}.policy_loss.loss_mode={mode}: cannot be DPH-RL's rollout term ({why}); "
            f"use one of {', '.join(COMPOSED_LOSS_MODES)}"
        )
    replay = config_value(config, f"{ACTOR}.megatron.router_replay.mode", "disabled")
    if replay != "disabled":
        errors.append(
            f"{ACTOR}.megatron.router_replay.mode={replay}: the rehearsal rows have no recorded "
            "expert routes to replay; set it to disabled for DPH-RL"
        )
    agg = config_value(config, f"{ACTOR}.loss_agg_mode", "token-mean")
    if agg != "token-mean":
        errors.append(
            f"{ACTOR}.loss_agg_mode={agg}: DPH-RL's stream weights count tokens; set it to "
            "token-mean"
        )
    if config_value(config, f"{ACTOR}.shuffle", False):
        errors.append(
            f"{ACTOR}.shuffle=True: verl would regroup the rows after the rehearsal join; "
            "set it to False"
        )
    sync_step = int(config_value(config, "trainer.v1.sync.parameter_sync_step", 1) or 1)
    if sync_step > 1:
        errors.append(
            f"trainer.v1.sync.parameter_sync_step={sync_step}: each of a step's sub-updates "
            "would draw a whole step's rehearsal rows (and move the rehearsal controller); "
            "set it to 1 for DPH-RL"
        )
    errors += _layout_errors(config, settings)
    return errors


def _layout_errors(config: Mapping[str, Any], settings: DivRLVerlSettings) -> list[str]:
    """The ``authors`` weighting's layout from verl's batch sizes (the trainer's own sums)."""
    try:
        batch = int(config_value(config, "data.train_batch_size"))
        n = int(config_value(config, "actor_rollout_ref.rollout.n", 1))
        mini = int(config_value(config, f"{ACTOR}.ppo_mini_batch_size"))
    except (TypeError, ValueError):
        return []  # verl's own validation names these
    if mini <= 0:
        return []
    try:
        settings.authors_layout(batch * n, batch // mini)
    except VerlSettingsError as e:
        return [str(e)]
    return []


def check_composition(config: Mapping[str, Any], settings: DivRLVerlSettings) -> None:
    """Raise :class:`VerlSettingsError` with the first of :func:`composition_errors`."""
    errors = composition_errors(config, settings)
    if errors:
        raise VerlSettingsError(errors[0])
