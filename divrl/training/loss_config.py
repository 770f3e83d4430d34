"""The policy loss's options as the config names them, resolved once into typed options.

``algorithm.loss_options`` holds options by the loss's own names (``LossOptions`` fields of
``algorithm.policy_loss``, see :mod:`divrl.algorithms.loss_options`). The flat keys below
are shortcuts that mean the same option, for the settings several losses share: the clip
range, dual clip and aggregation. A key left null means "the loss's own default" (GSPO:
3e-4 / 4e-4 and sequence-level aggregation). Setting an option that the configured loss
does not take is an error naming the loss and its options.

A preset's option keys are written for the preset's own loss: when a command-line override
switches ``algorithm.policy_loss``, :func:`stale_preset_options` finds the preset's keys
that would silently carry over with a value the new loss would not pick itself (e.g.
``configs/grpo.yaml``'s vanilla clip 0.2 / 0.2 under GSPO, whose own range is 3e-4 / 4e-4),
so that loading refuses them by name (docs/training.md, "Switching the policy loss").
"""

from __future__ import annotations

import dataclasses
from typing import Any

from divrl.algorithms import LossOptions, policy_loss_options, policy_loss_spec

__all__ = [
    "FLAT_OPTION_KEYS",
    "REMOVED_KEYS",
    "flat_option_values",
    "resolve_loss_options",
    "resolved_option_fields",
    "stale_preset_options",
]

# flat algorithm.<key> -> (loss it belongs to, or None = any loss that takes it; option name)
FLAT_OPTION_KEYS: dict[str, tuple[str | None, str]] = {
    "clip_low": (None, "clip_low"),
    "clip_high": (None, "clip_high"),
    "dual_clip": (None, "dual_clip"),
    "loss_agg": (None, "agg"),
}

# the per-loss flat keys of 0.1, removed: algorithm.<key> -> its algorithm.loss_options name
REMOVED_KEYS: dict[str, str] = {
    "lp_reg_rho": "rho",
    "lp_reg_beta": "beta",
    "lp_reg_kappa": "kappa",
    "kl_cov_ratio": "kl_cov_ratio",
    "kl_cov_coef": "ppo_kl_coef",
    "clip_cov_ratio": "clip_ratio",
    "clip_cov_lb": "clip_cov_lb",
    "clip_cov_ub": "clip_cov_ub",
    "high_entropy_fraction": "top_fraction",
}


def _number(options: type[LossOptions], key: str, value: Any) -> Any:
    """YAML 1.1 reads ``3e-4`` (no dot) as a string: a float option takes it as a number."""
    fields = {f.name: f for f in dataclasses.fields(options)}
    if isinstance(value, str) and key in fields and "float" in str(fields[key].type):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _collect(loss: str, flat: dict[str, Any], nested: dict[str, Any]) -> dict[str, Any]:
    """The options set by the flat keys and ``loss_options`` together (errors on clashes)."""
    options = policy_loss_spec(loss).options
    valid = options.names()
    chosen = {key: _number(options, key, value) for key, value in nested.items()}
    for key, value in flat.items():
        if value is None:
            continue
        owner, option = FLAT_OPTION_KEYS[key]
        if owner is not None and owner != loss:
            raise ValueError(
                f"algorithm.{key} is an option of policy loss {owner!r}, but "
                f"algorithm.policy_loss={loss!r}; its options: {', '.join(valid)} "
                "(remove the key or set them under algorithm.loss_options)"
            )
        if option in chosen and chosen[option] != value:
            raise ValueError(
                f"algorithm.{key}={value!r} and algorithm.loss_options.{option}="
                f"{chosen[option]!r} set the same option differently: keep one"
            )
        chosen[option] = value
    return chosen


def resolve_loss_options(loss: str, flat: dict[str, Any], nested: dict[str, Any]) -> LossOptions:
    """The validated options of ``loss`` from the flat keys (``FLAT_OPTION_KEYS``) and
    ``algorithm.loss_options``; unset options keep the loss's defaults.

    Raises:
        ValueError: an option the loss does not take (naming the loss and its options, and
            why when the loss refuses it), a flat key of another loss, a clash between a
            flat key and ``loss_options``, or a value out of the option's bounds.
    """
    chosen = _collect(loss, flat, nested)
    try:
        options = policy_loss_options(loss, **chosen)
    except TypeError as exc:  # a wrong type for a dataclass field
        raise ValueError(f"policy loss {loss!r}: {exc}") from exc
    if options.needs_full_logits:
        # refused here rather than at the first step, where the loss would raise
        raise ValueError(
            options.FULL_LOGITS_REFUSED
            or f"{options.label()} needs the full-vocabulary logits, which `divrl train` "
            "does not compute: change its options"
        )
    return options


def flat_option_values(loss: str, options: LossOptions) -> dict[str, Any]:
    """The flat keys' resolved values: the option's value where ``loss`` takes it, else None
    (so ``--print-config`` shows what the loss runs with)."""
    names = set(options.names())
    out: dict[str, Any] = {}
    for key, (owner, option) in FLAT_OPTION_KEYS.items():
        takes = option in names and (owner is None or owner == loss)
        out[key] = getattr(options, option) if takes else None
    return out


def resolved_option_fields(
    loss: str, flat: dict[str, Any], nested: dict[str, Any]
) -> dict[str, Any]:
    """The algorithm config's option fields after resolution: every flat key
    (:func:`flat_option_values`) and ``loss_options`` = all options the loss runs with."""
    options = resolve_loss_options(loss, flat, nested)
    return {**flat_option_values(loss, options), "loss_options": dataclasses.asdict(options)}


def stale_preset_options(
    loss: str, preset: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """The preset's loss-option keys that an override switching the loss would carry over.

    Args:
        loss: ``algorithm.policy_loss`` after the overrides.
        preset: the preset file's ``algorithm`` section (``extends`` merged).
        overrides: the ``algorithm`` keys set on the command line.

    Returns:
        ``{"algorithm.<key>": value}`` for each shared flat key (``clip_low``, ``clip_high``,
        ``dual_clip``, ``loss_agg``) and each ``loss_options`` entry that the preset sets, the
        overrides do not set again, and whose value is not ``loss``'s own default (or which
        ``loss`` does not take). Empty when the overrides do not switch the preset's loss
        (``vanilla`` when the preset names none) or when ``loss`` is not a registered loss
        (config validation reports that).
    """
    preset_loss = preset.get("policy_loss") or "vanilla"
    if "policy_loss" not in overrides or loss == preset_loss:
        return {}
    try:
        options = policy_loss_spec(loss).options
    except ValueError:
        return {}
    defaults = {f.name: f.default for f in dataclasses.fields(options)}
    candidates = {
        f"algorithm.{key}": (option, preset.get(key))
        for key, (owner, option) in FLAT_OPTION_KEYS.items()
        if owner is None and key not in overrides
    }
    over_nested = overrides.get("loss_options") or {}
    for option, value in (preset.get("loss_options") or {}).items():
        if option not in over_nested:
            candidates[f"algorithm.loss_options.{option}"] = (option, value)
    stale = {}
    for name, (option, value) in candidates.items():
        if value is None:
            continue
        if option not in defaults or _number(options, option, value) != defaults[option]:
            stale[name] = value
    return stale
