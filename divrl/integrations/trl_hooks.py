"""The TRL internals divrl's adapter relies on, and the checks that catch their change.

:data:`TRL_HOOKS` lists the ``GRPOTrainer`` methods the adapter overrides or calls with the
parameters it passes; :func:`check_trl_internals` checks them (and the batch keys and
trainer attributes the adapter reads) against the installed TRL.
"""

from __future__ import annotations

import inspect
import os
import warnings

import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from trl import GRPOTrainer

__all__ = [
    "ALLOW_UNTESTED_ENV",
    "REQUIRED_INPUT_KEYS",
    "REQUIRED_TRAINER_ATTRIBUTES",
    "TESTED_TRL_VERSIONS",
    "TRL_HOOKS",
    "check_trl_internals",
    "check_trl_version",
]

# The TRL releases this adapter was tested against; pyproject's `trl` extra pins the same.
TESTED_TRL_VERSIONS = SpecifierSet(">=1.16,<1.17")
# Set to 1 to run an untested TRL release anyway (a warning instead of an error).
ALLOW_UNTESTED_ENV = "DIVRL_ALLOW_UNTESTED_TRL"

# TRL methods the adapter overrides or calls, with the parameters it passes or relies on.
TRL_HOOKS: dict[str, tuple[str, ...]] = {
    "_compute_loss": ("model", "inputs"),
    "_get_per_token_logps_and_entropies": (
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ),
    "_generate_and_score_completions": ("inputs",),
}
# Keys of the batch dict that `_generate_and_score_completions` returns and the adapter reads.
REQUIRED_INPUT_KEYS = frozenset(
    {
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "advantages",
        "num_items_in_batch",
    }
)
# Trainer attributes set by GRPOTrainer.__init__ that the adapter reads.
REQUIRED_TRAINER_ATTRIBUTES = (
    "_metrics",
    "accelerator",
    "temperature",
    "loss_type",
    "epsilon_low",
    "epsilon_high",
    "max_completion_length",
    "beta",
    "use_vllm",
    "vllm_importance_sampling_correction",
)

# --------------------------------------------------------------------------- checks


def check_trl_version(version: str | None = None) -> None:
    """Raise if the installed TRL is outside :data:`TESTED_TRL_VERSIONS`.

    Set the environment variable ``DIVRL_ALLOW_UNTESTED_TRL=1`` to get a warning instead;
    the internals check (:func:`check_trl_internals`) still runs.
    """
    version = trl.__version__ if version is None else version
    if Version(version) in TESTED_TRL_VERSIONS:
        return
    message = (
        f"divrl's TRL integration is tested with trl{TESTED_TRL_VERSIONS}, found trl {version}: "
        f'install a tested release (pip install "divrl[trl]") or set {ALLOW_UNTESTED_ENV}=1 '
        "to try this one"
    )
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        warnings.warn(message, stacklevel=2)
        return
    raise RuntimeError(message)


def check_trl_internals(trainer_cls: type = GRPOTrainer) -> list[str]:
    """Problems with the TRL internals the adapter relies on (empty when all is well).

    Checks that every method in :data:`TRL_HOOKS` exists on ``trainer_cls`` and accepts the
    listed parameters. The batch keys (:data:`REQUIRED_INPUT_KEYS`) and trainer attributes
    (:data:`REQUIRED_TRAINER_ATTRIBUTES`) are checked at run time by the trainer itself.
    """
    problems = []
    for name, params in TRL_HOOKS.items():
        method = getattr(trainer_cls, name, None)
        if not callable(method):
            problems.append(f"{trainer_cls.__name__}.{name} is missing")
            continue
        accepted = inspect.signature(method).parameters
        missing = [p for p in params if p not in accepted]
        if missing:
            problems.append(f"{trainer_cls.__name__}.{name} no longer accepts {missing}")
    return problems


def raise_on_internal_problems(problems: list[str]) -> None:
    if problems:
        raise RuntimeError(
            f"trl {trl.__version__} changed internals divrl's TRL integration relies on: "
            + "; ".join(problems)
            + f". Use trl{TESTED_TRL_VERSIONS} (see docs/trl.md)."
        )
