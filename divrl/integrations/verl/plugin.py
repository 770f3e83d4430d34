"""The ``verl.plugins`` entry point: verl imports this module when it starts.

It installs divrl's start-up gate in verl's ``validate_config``
(:mod:`divrl.integrations.verl.startup`: a run whose divrl settings would not act stops
before any worker starts), registers ``divrl_vanilla`` in verl's policy-loss registry,
divrl's advantage estimators (``divrl_grpo``, ``divrl_rloo``, ...: unscorable responses
left out) in its advantage-estimator registry, and the ``divrl_sync`` and
``divrl_presample`` v1 trainer modes (in the driver and in every worker, since each imports
verl). verl swallows an entry point's exceptions at debug level, so an unsupported verl
is reported here with a warning, and the losses are then left unregistered
(``loss_mode=divrl_vanilla`` fails with verl's list of the registered ones).
"""

from __future__ import annotations

import logging

from divrl.integrations.verl import UnsupportedVerlError, check_verl_version

logger = logging.getLogger(__name__)


def register() -> bool:
    """Register divrl's losses with verl; False (and a warning) on an unsupported verl.

    The start-up gate is installed first, on any verl release that has the function it
    wraps: a run with divrl settings is checked even where the losses are not registered.
    """
    from divrl.integrations.verl.startup import install_startup_gate

    install_startup_gate()
    try:
        check_verl_version()
    except UnsupportedVerlError as e:
        logger.warning("divrl's verl plugin is not registered: %s", e)
        return False
    import divrl.integrations.verl.advantages  # registers divrl_grpo, divrl_rloo, ...
    import divrl.integrations.verl.losses

    try:  # the v1 trainer needs TransferQueue (divrl[verl] installs it)
        import divrl.integrations.verl.presample  # registers divrl_presample
        import divrl.integrations.verl.trainer  # noqa: F401  (registers divrl_sync)
    except ImportError as e:
        logger.warning(
            "divrl's verl trainer modes divrl_sync and divrl_presample are not registered: %s", e
        )
    return True


REGISTERED = register()
