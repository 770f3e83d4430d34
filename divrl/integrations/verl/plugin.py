"""The ``verl.plugins`` entry point: verl imports this module when it starts.

It registers ``divrl_vanilla`` in verl's policy-loss registry (in the driver and in every
worker, since each imports verl). verl swallows an entry point's exceptions at debug
level, so an unsupported verl is reported here with a warning, and the losses are then
left unregistered (``loss_mode=divrl_vanilla`` fails with verl's list of the registered
ones).
"""

from __future__ import annotations

import logging

from divrl.integrations.verl import UnsupportedVerlError, check_verl_version

logger = logging.getLogger(__name__)


def register() -> bool:
    """Register divrl's losses with verl; False (and a warning) on an unsupported verl."""
    try:
        check_verl_version()
    except UnsupportedVerlError as e:
        logger.warning("divrl's verl plugin is not registered: %s", e)
        return False
    import divrl.integrations.verl.losses  # noqa: F401  (registers divrl_vanilla)

    return True


REGISTERED = register()
