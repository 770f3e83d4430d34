"""The TRL internals divrl's adapter relies on, and the checks that catch their change.

:data:`TRL_HOOKS` lists the ``GRPOTrainer`` methods the adapter overrides or calls with the
parameters it passes; :func:`check_trl_internals` checks them (and the batch keys and
trainer attributes the adapter reads) against the installed TRL.
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
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
    "TRL_LOSS_MODIFIERS",
    "check_trl_internals",
    "check_trl_version",
    "trl_loss_modifiers",
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
# Every statement of TRL's `_compute_loss` that changes the per-token loss after computing
# it (`per_token_loss = f(per_token_loss, ...)`), as `ast.unparse` writes it, with the
# condition it runs under, and what the policy-loss replacement does about it. A TRL release that
# adds, drops or rewrites one fails check_trl_internals: the replacement would no longer
# reproduce TRL's per-token loss.
TRL_LOSS_MODIFIERS: dict[tuple[str, str], str] = {
    (
        "per_token_loss * off_policy_mask",
        "self.off_policy_mask_threshold is not None",
    ): "refused with a policy_loss (off_policy_mask_threshold=None)",
    (
        "per_token_loss * entropy_mask",
        "entropy_mask is not None",
    ): "refused with a policy_loss (top_entropy_quantile=1.0)",
    (
        "per_token_loss * inputs['importance_sampling_ratio']",
        "self.use_vllm and self.vllm_importance_sampling_correction and "
        "(self.loss_type != 'vespo')",
    ): "the same weights go on the replacement (token_weights)",
    (
        "per_token_loss + self.beta * per_token_kl",
        "self.beta != 0.0",
    ): "an added term the replacement leaves alone (DPH-RL needs beta=0)",
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
    listed parameters, and that ``_compute_loss`` changes the per-token loss exactly by
    the statements of :data:`TRL_LOSS_MODIFIERS`. The batch keys (:data:`REQUIRED_INPUT_KEYS`) and trainer attributes
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
    if callable(getattr(trainer_cls, "_compute_loss", None)):
        found, known = trl_loss_modifiers(trainer_cls), set(TRL_LOSS_MODIFIERS)
        for statement, condition in sorted(found - known):
            problems.append(
                f"{trainer_cls.__name__}._compute_loss changes the per-token loss in a way "
                f"the policy-loss replacement does not know: `per_token_loss = {statement}` "
                f"(if {condition or 'always'})"
            )
        for statement, condition in sorted(known - found):
            problems.append(
                f"{trainer_cls.__name__}._compute_loss no longer has `per_token_loss = "
                f"{statement}` (if {condition})"
            )
    return problems


def trl_loss_modifiers(trainer_cls: type = GRPOTrainer) -> set[tuple[str, str]]:
    """The ``(statement, condition)`` pairs of ``trainer_cls._compute_loss`` that rewrite
    ``per_token_loss`` from itself (see :data:`TRL_LOSS_MODIFIERS`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(trainer_cls._compute_loss)))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = set()
    for node in ast.walk(tree):
        targets = getattr(node, "targets", [])
        if not any(isinstance(t, ast.Name) and t.id == "per_token_loss" for t in targets):
            continue
        if not any(
            isinstance(n, ast.Name) and n.id == "per_token_loss" for n in ast.walk(node.value)
        ):
            continue
        parent = parents.get(node)
        while parent is not None and not isinstance(parent, ast.If):
            parent = parents.get(parent)
        condition = ast.unparse(parent.test) if parent is not None else ""
        found.add((ast.unparse(node.value), condition))
    return found


def internal_problem(problems: list[str]) -> RuntimeError:
    """The error naming TRL internals that changed (``problems``, one line each)."""
    return RuntimeError(
        f"trl {trl.__version__} changed internals divrl's TRL integration relies on: "
        + "; ".join(problems)
        + f". Use trl{TESTED_TRL_VERSIONS} (see docs/trl.md)."
    )


def raise_on_internal_problems(problems: list[str]) -> None:
    if problems:
        raise internal_problem(problems)
