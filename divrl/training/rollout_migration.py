"""The ``rollout`` section of earlier versions: engine options that were flat keys."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["migrate_rollout_section"]

# engine options that used to be keys of the rollout section; the engines that take each
# are the registered ones whose options have that field (divrl.rollout.engines_taking)
_LEGACY_ENGINE_KEYS = ("batch_size", "gpu_memory_utilization")


def migrate_rollout_section(raw: dict[str, Any]) -> dict[str, Any]:
    """See :meth:`divrl.training.config.RolloutConfig.migrate` (ValueError: an old and a
    new key disagree)."""
    legacy = [k for k in _LEGACY_ENGINE_KEYS if k in raw]
    if not legacy:
        return raw
    from divrl.rollout.registry import engines_taking

    raw = dict(raw)
    engine = raw.get("engine", "auto")  # RolloutConfig.engine's default
    options = dict(raw.get("engine_options") or {})
    log = logging.getLogger(__name__)
    for key in legacy:
        value = raw.pop(key)
        takers = engines_taking(key)
        if engine not in takers:
            log.warning(
                "rollout.%s is an option of the %s engine; rollout.engine=%s never read it: "
                "ignored (remove it)",
                key,
                "/".join(takers),
                engine,
            )
            continue
        if key in options and options[key] != value:
            raise ValueError(
                f"rollout.{key}={value!r} and rollout.engine_options.{key}={options[key]!r} "
                f"disagree: rollout.{key} is the old name of rollout.engine_options.{key}; "
                "keep only the new one"
            )
        options[key] = value
        log.warning("rollout.%s is now rollout.engine_options.%s: read as that", key, key)
    raw["engine_options"] = options
    return raw
