"""The start-up gate of a verl run: every divrl setting acts, or the run stops before Ray
starts anything.

verl's ``main_ppo`` calls ``verl.utils.config.validate_config(config, ...)`` in the
driver, after Hydra composed the config and before ``ray.init``. The plugin wraps that
function (:func:`install_startup_gate`, at plugin load, which verl runs before
``main_ppo``'s own imports), so every run of ``python -m verl.trainer.main_ppo`` in an
environment with divrl installed passes :func:`startup_errors` first. A run it refuses
prints one line per refused key (``divrl: <key>=<value>: <why>; <what to set>``) on stderr
and exits with status 2, before Ray, the TaskRunner or any worker starts.

What it refuses:

- divrl settings a trainer will not read: a ``divrl`` section under verl's ``sync`` or
  async trainer modes or the legacy trainer (``trainer.use_v1=False``), which train plain
  GRPO without it; a divrl trainer mode under the legacy trainer; in ``divrl_presample``,
  every ``divrl`` key but ``reference_store``;
- a ``divrl`` section that does not validate (:class:`DivRLVerlSettings`), and whatever
  cannot stand beside divrl's loss (:func:`composition_errors`), the ``authors`` layout
  included;
- ``loss_mode=divrl_vanilla`` under any trainer with what it does not implement (``token-sum``,
  rollout-correction weights);
- the presample's own needs (``rollout.n >= 2``, ``divrl.reference_store``, single-turn
  rollouts).

What it warns about (one ``divrl: warning:`` line, the run goes on): divrl's reward
function beside one of verl's own advantage estimators (:func:`startup_warnings`).

This module imports neither torch nor verl (the gate's install imports verl lazily).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from divrl.integrations.verl.settings import (
    DivRLVerlSettings,
    VerlSettingsError,
    composition_errors,
    config_value,
)

logger = logging.getLogger(__name__)

SYNC_MODE = "divrl_sync"
PRESAMPLE_MODE = "divrl_presample"
DIVRL_MODES = (SYNC_MODE, PRESAMPLE_MODE)
#: the only key of the divrl section the presample reads
PRESAMPLE_KEYS = ("reference_store",)
#: the aggregations ``divrl_vanilla`` implements (verl's ``token-sum`` is not one)
DIVRL_VANILLA_AGGS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
#: the modules that hold ``validate_config`` by name once imported (verl 0.9.1)
VALIDATE_CONFIG_HOLDERS = (
    "verl.utils.config",
    "verl.utils",
    "verl.trainer.main_ppo",
    "verl.trainer.main_ppo_v0",
)


def _section_keys(config: Mapping[str, Any]) -> list[str]:
    section = config_value(config, "divrl")
    return sorted(section.keys()) if section is not None and hasattr(section, "keys") else []


def mode_errors(config: Mapping[str, Any]) -> list[str]:
    """The divrl settings the chosen trainer would not read (one line each), or []."""
    keys = _section_keys(config)
    use_v1 = bool(config_value(config, "trainer.use_v1", True))
    mode = config_value(config, "trainer.v1.trainer_mode", "sync")
    if mode in DIVRL_MODES and not use_v1:
        return [
            f"trainer.use_v1=False: verl's legacy trainer ignores trainer.v1.trainer_mode={mode} "
            "(it would train plain GRPO); set trainer.use_v1=True"
        ]
    named = ", ".join(f"divrl.{k}" for k in keys)
    if keys and mode not in DIVRL_MODES:
        where = (
            "trainer.use_v1=False (verl's legacy trainer)"
            if not use_v1
            else f"trainer.v1.trainer_mode={mode}"
        )
        add = "trainer.v1.trainer_mode=divrl_sync" + ("" if use_v1 else " and trainer.use_v1=True")
        return [
            f"{named} set, but {where} does not read the divrl section (it would train plain "
            f"GRPO without them); add {add}"
        ]
    extra = [k for k in keys if k not in PRESAMPLE_KEYS]
    if mode == PRESAMPLE_MODE and extra:
        return [
            f"{', '.join(f'divrl.{k}' for k in extra)} set, but trainer.v1.trainer_mode="
            f"{PRESAMPLE_MODE} reads only divrl.reference_store; remove the others (the "
            "training run takes them)"
        ]
    return []


def loss_name_errors(config: Mapping[str, Any]) -> list[str]:
    """``loss_mode=divrl_vanilla`` (any trainer) with what it does not implement."""
    actor = "actor_rollout_ref.actor"
    if config_value(config, f"{actor}.policy_loss.loss_mode", "vanilla") != "divrl_vanilla":
        return []
    errors = []
    agg = config_value(config, f"{actor}.loss_agg_mode", "token-mean")
    if agg not in DIVRL_VANILLA_AGGS:
        errors.append(
            f"{actor}.loss_agg_mode={agg}: loss_mode=divrl_vanilla aggregates with "
            f"{', '.join(DIVRL_VANILLA_AGGS)}; set one of them, or loss_mode=vanilla"
        )
    rollout_is = config_value(config, "algorithm.rollout_correction.rollout_is")
    if rollout_is:
        errors.append(
            f"algorithm.rollout_correction.rollout_is={rollout_is}: loss_mode=divrl_vanilla "
            "does not apply rollout-correction weights; set loss_mode=vanilla or switch "
            "rollout_is off"
        )
    return errors


def exploration_path(store: str) -> str:
    """Where ``divrl_presample`` writes the exploration prompts of the store at ``store``
    (the training run's ``data.train_files``): beside it, ``<store>.exploration.parquet``."""
    return f"{str(store).rstrip('/')}.exploration.parquet"


def presample_errors(config: Mapping[str, Any], settings: DivRLVerlSettings) -> list[str]:
    """What ``trainer.v1.trainer_mode=divrl_presample`` needs of the config."""
    from divrl.data.store_files import check_store_target

    errors = []
    n = int(config_value(config, "actor_rollout_ref.rollout.n", 1))
    if n < 2:
        errors.append(
            f"actor_rollout_ref.rollout.n={n}: trainer.v1.trainer_mode={PRESAMPLE_MODE} draws "
            "k responses for the split and one reference response per prompt; set it to k+1 "
            "(>= 2)"
        )
    if not settings.reference_store:
        errors.append(
            f"trainer.v1.trainer_mode={PRESAMPLE_MODE} writes the store at "
            "divrl.reference_store: set +divrl.reference_store=PATH"
        )
    else:
        try:
            check_store_target(settings.reference_store, flag="a new divrl.reference_store path")
        except ValueError as e:
            errors.append(str(e))
        out = exploration_path(settings.reference_store)
        if os.path.exists(out):
            errors.append(
                f"{out} exists: the presample writes the exploration prompts there; move it, "
                "or set a new divrl.reference_store path"
            )
    steps = config_value(config, "trainer.total_training_steps")
    epochs = config_value(config, "trainer.total_epochs", 1)
    if steps is not None or epochs != 1:
        errors.append(
            f"trainer.total_epochs={epochs}, trainer.total_training_steps={steps}: the "
            "presample runs one epoch over data.train_files (each prompt once); set "
            "trainer.total_epochs=1 and trainer.total_training_steps=null"
        )
    rollout = "actor_rollout_ref.rollout"
    agent = config_value(config, f"{rollout}.agent.default_agent_loop", "single_turn_agent")
    if config_value(config, f"{rollout}.multi_turn.enable", False) or agent != "single_turn_agent":
        errors.append(
            f"{rollout}.multi_turn.enable / agent.default_agent_loop={agent}: the presample "
            "stores a response's tokens as the model's own (tool and user turns would be "
            "rehearsed as the model's); set multi_turn.enable=False and "
            "agent.default_agent_loop=single_turn_agent"
        )
    return errors


def startup_errors(config: Mapping[str, Any]) -> list[str]:
    """Every reason a verl run would not do what its divrl settings say (one line each).

    [] for a run without divrl settings, divrl trainer modes or divrl loss names.
    """
    errors = mode_errors(config) + loss_name_errors(config)
    if errors:
        return errors
    mode = config_value(config, "trainer.v1.trainer_mode", "sync")
    if mode not in DIVRL_MODES:
        return []
    try:
        settings = DivRLVerlSettings.from_mapping(config_value(config, "divrl"))
    except VerlSettingsError as e:
        return [str(e)]
    if mode == PRESAMPLE_MODE:
        return presample_errors(config, settings)
    return composition_errors(config, settings)


#: how a config names divrl's reward function (verl's loader takes a module or a file)
DIVRL_REWARD = ("pkg://divrl.integrations.verl.reward", "divrl/integrations/verl/reward.py")


def startup_warnings(config: Mapping[str, Any]) -> list[str]:
    """What acts, but not as a divrl user would want (printed, the run goes on): divrl's
    reward with one of verl's own advantage estimators, which spread the NaN score of an
    unscorable response over its group (verl then skips the update: its gradient norm is
    not finite)."""
    path = str(config_value(config, "reward.custom_reward_function.path", "") or "")
    if not path.endswith(DIVRL_REWARD):
        return []
    kwargs = "reward.custom_reward_function.reward_kwargs"
    if config_value(config, f"{kwargs}.unscorable_score") is not None:
        return []
    estimator = str(config_value(config, "algorithm.adv_estimator", "gae"))
    if estimator.startswith("divrl_"):
        return []
    return [
        f"algorithm.adv_estimator={estimator}: divrl's reward scores a response it cannot "
        "score (a verifier timeout, a crashed worker) NaN, which verl's own estimators spread "
        "over the response's group; set algorithm.adv_estimator=divrl_grpo (or another "
        f"divrl_<name>), or +{kwargs}.unscorable_score=0.0 to score such responses 0"
    ]


def check_startup(config: Mapping[str, Any]) -> None:
    """Raise :class:`VerlSettingsError` with the first of :func:`startup_errors`."""
    errors = startup_errors(config)
    if errors:
        raise VerlSettingsError(errors[0])


def stop_unless_divrl_acts(config: Mapping[str, Any]) -> None:
    """The gate: print each of :func:`startup_errors` on one line and exit with status 2."""
    errors = startup_errors(config)
    if errors:
        for line in errors:
            print(f"divrl: {line}", file=sys.stderr)
        raise SystemExit(2)
    for line in startup_warnings(config):
        print(f"divrl: warning: {line}", file=sys.stderr)


def install_startup_gate() -> bool:
    """Wrap verl's ``validate_config`` (where it is held by name) with the gate.

    The one surface this relies on: ``verl.trainer.main_ppo.main`` calls
    ``validate_config(config=..., ...)`` before ``run_ppo`` (``ray.init``). Idempotent;
    False (and a warning) where verl has no ``validate_config``.
    """
    try:
        import verl.utils.config as verl_config
    except ImportError as e:  # pragma: no cover (the plugin is loaded by verl)
        logger.warning("divrl's start-up checks are not installed: %s", e)
        return False
    original = getattr(verl_config, "validate_config", None)
    if original is None:
        logger.warning("divrl's start-up checks are not installed: verl has no validate_config")
        return False
    if getattr(original, "divrl_gate", False):
        return True

    @functools.wraps(original)
    def validate_config(*args: Any, **kwargs: Any) -> Any:
        config = kwargs["config"] if "config" in kwargs else args[0]
        stop_unless_divrl_acts(config)
        return original(*args, **kwargs)

    validate_config.divrl_gate = True  # type: ignore[attr-defined]
    for name in VALIDATE_CONFIG_HOLDERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "validate_config", None) is original:
            module.validate_config = validate_config  # type: ignore[attr-defined]
    return True
