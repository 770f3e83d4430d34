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
from divrl.algorithms.loss_options import LossOptions
from divrl.algorithms.policy_loss import POLICY_LOSS_OPTIONS, policy_loss_options
from divrl.algorithms.rehearsal_control import RehearsalControlOptions

#: the tensors (a loss's declared ``INPUTS``) the plugin hands a divrl policy loss, and where
#: they come from; a loss declaring another input is refused, naming it
PLUGIN_INPUTS = {
    "proxy_log_prob": "pi_old's min-p proxy, from the engine's logits hook (NEEDS_PROXY)",
    "log_normalizer": "the proxy's log normaliser, from the same hook (NEEDS_PROXY)",
    "token_weights": "verl's rollout importance weights (algorithm.rollout_correction)",
    # a scoped selection (SCOPED_SELECTION) is the loss's own, over each micro-batch's rows
    "selected": "none: the loss selects over each micro-batch's rows",
}
#: a capability a loss may declare (``needs_full_logits``) that the plugin lacks
FULL_LOGITS = "the full-vocabulary logits of every position ([batch, len, vocab] rows)"
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
        policy_loss: null (verl's own ``actor.policy_loss.loss_mode`` is the policy term), or
            a loss of divrl's policy-loss registry (``divrl.algorithms.POLICY_LOSSES``:
            ``vanilla``, ``lp_reg``, ``gspo`` ...) that replaces verl's policy term; accepted
            when the plugin provides what the loss's options declare it needs
            (:func:`missing_capabilities`). Its clip range, dual clip and aggregation are
            verl's keys, where the loss declares them.
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

    policy_loss: str | None = None
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
        self._check_policy_loss()
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

    def _check_policy_loss(self) -> None:
        if self.policy_loss is None:
            return
        if self.policy_loss not in POLICY_LOSS_OPTIONS:
            raise VerlSettingsError(
                f"{SECTION}.policy_loss={self.policy_loss!r} is not a registered policy loss; "
                f"valid: {', '.join(sorted(POLICY_LOSS_OPTIONS))} (or unset it for verl's "
                "own actor.policy_loss.loss_mode)"
            )

    def _check_loss_options(self) -> None:
        keys = set(self.loss_options)
        if self.policy_loss is None:
            if keys:
                raise VerlSettingsError(
                    f"{SECTION}.loss_options {sorted(keys)} set without {SECTION}.policy_loss: "
                    "verl's own loss takes its options from verl's keys; set "
                    f"{SECTION}.policy_loss to the divrl loss they belong to, or remove them"
                )
            return
        for key in sorted(keys & set(VERL_KEYS)):
            raise VerlSettingsError(
                f"{SECTION}.loss_options.{key}: set verl's {VERL_KEYS[key]} instead"
            )
        try:
            options = self.policy_options()
        except ValueError as e:
            raise VerlSettingsError(f"{SECTION}.loss_options: {e}") from e
        missing = missing_capabilities(options)
        if missing:
            raise VerlSettingsError(
                f"{SECTION}.policy_loss={self.policy_loss}: the loss (with these options) needs "
                f"{missing[0]}, which the verl plugin does not provide (it passes a loss "
                "proxy_log_prob, log_normalizer and token_weights, and never materialises "
                "full-vocabulary rows); use another loss, or divrl train"
            )

    @property
    def dph(self) -> bool:
        """Whether the run adds DPH-RL's divergence term."""
        return self.divergence is not None and self.divergence_coef > 0

    @property
    def replaces_loss(self) -> bool:
        """Whether the actor's loss is divrl's (DPH-RL, a divrl policy loss); else verl's own."""
        return self.dph or self.policy_loss is not None

    @property
    def needs_proxy(self) -> bool:
        """The divrl policy loss declares it needs pi_old's min-p proxy (``NEEDS_PROXY``):
        the trainer turns the engine's logits hook on for it."""
        return self.policy_loss is not None and POLICY_LOSS_OPTIONS[self.policy_loss].NEEDS_PROXY

    def policy_options(self, **verl_values: Any) -> LossOptions:
        """The validated options of ``policy_loss``: ``loss_options`` over the loss's
        defaults, with ``verl_values`` (``clip_low``, ``clip_high``, ``dual_clip``,
        ``agg`` from verl's keys) for the options the loss declares.

        Raises:
            ValueError: no divrl policy loss is set; an option the loss does not take, or out
                of its range (the loss's own message).
        """
        if self.policy_loss is None:
            raise ValueError(f"{SECTION}.policy_loss is unset: verl's own loss runs")
        options = POLICY_LOSS_OPTIONS[self.policy_loss]
        from_verl = {k: v for k, v in verl_values.items() if k in options.names()}
        return policy_loss_options(self.policy_loss, **{**from_verl, **self.loss_options})

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


def missing_capabilities(options: LossOptions) -> list[str]:
    """What a divrl policy loss's options declare it needs that the verl plugin does not
    provide (one phrase per capability), or [] when the plugin can run it.

    The plugin provides: old log-probs (``NEEDS_OLD_LOG_PROBS``: verl's old-log-prob pass),
    pi_old's min-p proxy (``NEEDS_PROXY``: the engine's logits hook), a selection over each
    micro-batch (``SCOPED_SELECTION``: the loss's own) and the inputs in
    :data:`PLUGIN_INPUTS`; not the full-vocabulary rows (``needs_full_logits``) nor any
    other input (e.g. ``entropy``).
    """
    missing = []
    if options.needs_full_logits:
        missing.append(FULL_LOGITS)
    for name in options.INPUTS:
        if name not in PLUGIN_INPUTS:
            missing.append(f"the input {name!r} (declared in {type(options).__name__}.INPUTS)")
    return missing


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
    "{proxy} under Megatron needs actor_rollout_ref.actor.megatron."
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
            f"{SECTION}'s loss (DPH-RL, {SECTION}.policy_loss) replaces; switch one of them off"
        )
    if settings.policy_loss is not None:
        errors += _policy_loss_errors(config, settings)
    if settings.dph:
        errors += _dph_errors(config, settings)
    return errors


def verl_loss_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """The options verl's actor keys set on a divrl loss (``clip_low``, ``clip_high``,
    ``dual_clip``, ``agg``: :data:`VERL_KEYS`), as the loss reads them in the workers."""
    base = config_value(config, f"{ACTOR}.clip_ratio", 0.2)
    low = config_value(config, f"{ACTOR}.clip_ratio_low", None)
    high = config_value(config, f"{ACTOR}.clip_ratio_high", None)
    return {
        "clip_low": float(base if low is None else low),
        "clip_high": float(base if high is None else high),
        "dual_clip": float(config_value(config, f"{ACTOR}.clip_ratio_c", 3.0)),
        "agg": config_value(config, f"{ACTOR}.loss_agg_mode", "token-mean"),
    }


def _policy_loss_errors(config: Mapping[str, Any], settings: DivRLVerlSettings) -> list[str]:
    """What cannot stand beside a divrl policy loss, from what its options declare."""
    name = f"{SECTION}.policy_loss={settings.policy_loss}"
    errors = []
    mode = config_value(config, f"{ACTOR}.policy_loss.loss_mode", "vanilla")
    if mode != "vanilla":
        errors.append(
            f"{ACTOR}.policy_loss.loss_mode={mode}: {name} is the policy term itself and "
            "cannot stand beside another loss mode; set it to vanilla"
        )
    values = verl_loss_values(config)
    if values["agg"] not in DIVRL_AGGS:
        errors.append(
            f"{ACTOR}.loss_agg_mode={values['agg']}: divrl's losses ({name}) aggregate with "
            f"{', '.join(DIVRL_AGGS)}; set one of them"
        )
        return errors
    try:
        options = settings.policy_options(**values)
    except ValueError as e:  # verl's clip keys out of the loss's range
        return [*errors, f"{name} with verl's actor keys: {e}"]
    rollout_is = config_value(config, "algorithm.rollout_correction.rollout_is")
    if rollout_is and not options.takes_token_weights:
        errors.append(
            f"algorithm.rollout_correction.rollout_is={rollout_is}: {name} takes no per-token "
            "weights (its options do not declare token_weights), so verl's rollout "
            "importance weights would be dropped; switch rollout_is off or use a loss that "
            "takes them"
        )
    errors += _unused_clip_errors(values, options, name)
    if options.NEEDS_PROXY:
        errors += _proxy_errors(config, name)
    return errors


#: verl 0.9.1's defaults of the actor's clip keys (trainer/config/actor/actor.yaml)
VERL_CLIP_DEFAULTS = {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0}


def _unused_clip_errors(values: Mapping[str, Any], options: Any, name: str) -> list[str]:
    """verl's clip keys set away from verl's defaults for a loss whose options do not take
    them would be dropped without a word (verl always fills them, so only a value other
    than the default can be told to be the user's)."""
    return [
        f"{VERL_KEYS[key]}={values[key]:g}: {name} takes no {key} (its options do not "
        f"declare it), so the value would be ignored; remove it (verl's default is "
        f"{default:g})"
        for key, default in VERL_CLIP_DEFAULTS.items()
        if key not in options.names() and values[key] != default
    ]


def _proxy_errors(config: Mapping[str, Any], name: str) -> list[str]:
    """What cannot stand beside a loss that needs the min-p proxy (``NEEDS_PROXY``: Lp-Reg),
    computed from each position's whole logits row by the engine's logits hook."""
    proxy = f"the min-p proxy of {name}"
    errors = []
    if config_value(config, "actor_rollout_ref.model.use_fused_kernels"):
        errors.append(
            "actor_rollout_ref.model.use_fused_kernels=True: fused kernels never materialise "
            f"the logits {proxy} is computed from; set it to False"
        )
    for key in ("ulysses_sequence_parallel_size", "fsdp_config.ulysses_sequence_parallel_size"):
        sp = config_value(config, f"{ACTOR}.{key}", 1)
        if sp > 1:
            errors.append(
                f"{ACTOR}.{key}={sp}: {proxy} needs each position's whole logits row, "
                "which Ulysses splits; set it to 1"
            )
    for key in ("pad_to_length", "fsdp_config.pad_to_length", "megatron.pad_to_length"):
        if config_value(config, f"{ACTOR}.{key}", False):
            errors.append(
                f"{ACTOR}.{key}=True: verl's engine gives no logits hook to a padded-to-length "
                f"forward (it is the top-K distillation path), and {proxy} is computed "
                "there; set it to False"
            )
            break  # the engine's keys default to the actor's: one line for one setting
    sync_step = int(config_value(config, "trainer.v1.sync.parameter_sync_step", 1) or 1)
    if sync_step > 1:
        errors.append(
            f"trainer.v1.sync.parameter_sync_step={sync_step}: verl would run {sync_step} "
            "actor updates per rollout-weight sync, each after the first recomputing pi_old "
            f"and {proxy} from updated weights, not those that sampled its responses (not "
            "divrl train's Lp-Reg); set it to 1"
        )
    if config_value(config, f"{ACTOR}.strategy", "fsdp") == "megatron":
        tp = int(config_value(config, f"{ACTOR}.megatron.tensor_model_parallel_size", 1) or 1)
        cp = int(config_value(config, f"{ACTOR}.megatron.context_parallel_size", 1) or 1)
        if tp > 1 or cp > 1:
            errors.append(MEGATRON_REFUSAL.format(proxy=proxy, tp=tp, cp=cp))
        fp8 = config_value(config, f"{ACTOR}.megatron.override_transformer_config.fp8")
        if fp8 in FP8_PADDED and config_value(config, f"{ACTOR}.megatron.use_remove_padding", True):
            errors.append(
                f"{ACTOR}.megatron.override_transformer_config.fp8={fp8}: verl pads each packed "
                f"sequence to a multiple of 16 under FP8, and the next-token labels of {proxy} "
                f"assume sequences packed end to end; unset fp8 for {name}"
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
