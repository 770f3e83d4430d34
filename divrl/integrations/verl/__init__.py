"""divrl inside upstream verl (optional extra ``divrl[verl]``; docs/verl.md).

No fork, no copy of verl code: divrl registers into verl's extension points.

- ``losses``: ``divrl_vanilla`` in verl's policy-loss registry, and :class:`DivRLLoss`,
  the actor's whole loss (``set_loss_fn``) with DPH-RL rehearsal and Lp-Reg;
- ``rehearsal``: reference-store samples joined to an update batch as rehearsal rows;
- ``reward``: divrl's verifiers as verl's custom reward function (torch- and verl-free);
- ``metrics``: unbiased Pass@k in verl's validation metrics;
- ``settings``: the ``divrl.*`` keys of a verl config (torch- and verl-free);
- ``plugin``: the ``verl.plugins`` entry point (registers the losses when verl starts).

Importing this package does not import verl; each module that needs verl imports it at its
top, and :func:`check_verl_version` says when the installed verl is not the tested one.
"""

from __future__ import annotations

import os

#: the verl releases the plugin is tested with (``make test-verl``)
TESTED_VERL_VERSIONS = ("0.9.1",)
#: set to 1 to run on another verl release anyway (a warning instead of an error)
ALLOW_UNTESTED_ENV = "DIVRL_ALLOW_UNTESTED_VERL"


class UnsupportedVerlError(RuntimeError):
    """The installed verl is not one the plugin is tested with."""


def check_verl_version(version: str | None = None) -> str:
    """The installed verl's version, or an error naming the tested ones and the way out.

    Raises:
        UnsupportedVerlError: verl is missing, or another release and
            ``DIVRL_ALLOW_UNTESTED_VERL`` is unset.
    """
    if version is None:
        try:
            from importlib.metadata import version as _version

            version = _version("verl")
        except Exception as e:  # PackageNotFoundError
            raise UnsupportedVerlError(
                "verl is not installed: pip install 'divrl[verl]' (verl=="
                f"{TESTED_VERL_VERSIONS[-1]})"
            ) from e
    if version not in TESTED_VERL_VERSIONS and os.environ.get(ALLOW_UNTESTED_ENV) != "1":
        raise UnsupportedVerlError(
            f"verl {version} is installed; divrl's verl plugin is tested with "
            f"{', '.join(TESTED_VERL_VERSIONS)} (pip install 'divrl[verl]'), or set "
            f"{ALLOW_UNTESTED_ENV}=1 to try this one"
        )
    return version
