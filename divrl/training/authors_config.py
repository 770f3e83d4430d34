"""The settings of the DPH-RL authors' runs that a divrl config carries
(``algorithm.authors_*``, ``train.batch_assembly``): their layout of a step, and the checks
of the replica assembly. Kept out of the config classes, which only hold the keys."""

from __future__ import annotations

from typing import Any

from divrl.algorithms import AuthorsLayout, authors_effective_eta, authors_step_etas

#: parts of the authors' step that ``train.authors_replica_omit`` leaves out (ablations of
#: the replica, docs/algorithms.md "The authors' batch assembly")
REPLICA_PARTS = ("cloned_references", "third_step", "micro_batch_scaling")


def authors_layout(config: Any) -> AuthorsLayout:
    """The authors' layout of a step of ``config`` (a :class:`divrl.training.config.Config`):
    its rollouts and reference samples per step and mini-batches, on the authors' GPUs and
    micro-batching (``algorithm.authors_gpus``, ``authors_micro_batch_size``,
    ``authors_dynamic_batch``)."""
    algo, t = config.algorithm, config.train
    return AuthorsLayout(
        rollouts=t.prompts_per_step * config.rollout.n,
        references=config.reference.per_step,
        mini_batches=t.num_mini_batches,
        gpus=algo.authors_gpus,
        micro_batch_size=algo.authors_micro_batch_size,
        dynamic=algo.authors_dynamic_batch,
    )


def authors_weight_line(config: Any) -> str:
    """The ``authors`` weighting's numbers for ``config``, as the trainer prints them at the
    start: the GPU count they assume, the batch's effective eta, the authors' per-step
    weights, and what this run's assembly applies."""
    algo = config.algorithm
    layout = authors_layout(config)
    eta = algo.divergence_coef
    steps = ", ".join(f"{w:.4g}" for w in authors_step_etas(eta, layout))
    mean = authors_effective_eta(eta, layout)
    applied = (
        "the replica applies them step by step (train.batch_assembly=authors)"
        if config.train.batch_assembly == "authors"
        else f"divrl's assembly applies {mean:.4g} to each of its "
        f"{config.train.num_mini_batches * config.train.ppo_epochs} optimiser steps"
    )
    return (
        f"authors weighting on algorithm.authors_gpus={layout.gpus} GPUs "
        f"({'dynamic batch sizes' if layout.dynamic else f'micro-batches of {layout.micro_batch_size}'}): "
        f"effective eta {mean:.4g} (eta {eta:g} x {mean / eta if eta else 0:.4g}); "
        f"their optimiser steps weigh the divergence {steps}; {applied}"
    )


def authors_assembly_problems(config: Any) -> list[str]:
    """What keeps ``config`` from running ``train.batch_assembly: authors`` (empty: nothing):
    the replica covers the authors' DPH runs, so it takes their loss settings."""
    algo, problems = config.algorithm, []
    if not config.uses_reference_samples:
        problems.append(
            "it needs DPH reference samples (algorithm.divergence, divergence_coef > 0)"
        )
    if algo.policy_loss != "vanilla":
        problems.append(f"the authors' DPH runs use policy_loss=vanilla, not {algo.policy_loss}")
    if algo.kl_coef > 0 or algo.entropy_coef > 0:
        problems.append("set algorithm.kl_coef=0 and entropy_coef=0 (the DPH scripts' values)")
    if algo.rollout_correction:
        problems.append(
            "it applies no rollout correction: set algorithm.rollout_is=null and "
            "rollout_rs_threshold=null"
        )
    if algo.divergence_weighting != "authors":
        problems.append("it weighs the streams itself: set algorithm.divergence_weighting=authors")
    if algo.authors_dynamic_batch and config.train.micro_batch_tokens is None:
        problems.append(
            "algorithm.authors_dynamic_batch=true needs train.micro_batch_tokens (the token "
            "budget per micro-batch, theirs 32384)"
        )
    return problems


def lp_reg_authors_problems(config: Any) -> list[str]:
    """``lp_reg_scope: authors`` needs a token budget for the authors' micro-batches."""
    algo = config.algorithm
    if algo.lp_reg_scope != "authors":
        return []
    if (algo.lp_reg_micro_batch_tokens or config.train.micro_batch_tokens) is None:
        return [
            "algorithm.lp_reg_scope=authors cuts each virtual GPU's rows by a token budget: "
            "set algorithm.lp_reg_micro_batch_tokens (or train.micro_batch_tokens)"
        ]
    return []


def replica_omit_problems(config: Any) -> list[str]:
    """``train.authors_replica_omit``: known parts, and only with the replica."""
    omit = config.train.authors_replica_omit
    problems = [
        f"train.authors_replica_omit: unknown part {p!r}; valid: {', '.join(REPLICA_PARTS)}"
        for p in omit
        if p not in REPLICA_PARTS
    ]
    if omit and config.train.batch_assembly != "authors":
        problems.append(
            "train.authors_replica_omit leaves parts out of the authors' batch assembly: it "
            "needs train.batch_assembly=authors (or remove it)"
        )
    return problems


def algorithm_problems(algo: Any) -> list[str]:
    """Bounds and pairings of the ``algorithm`` keys that reproduce the authors' runs."""
    problems = [
        f"algorithm.{name}={getattr(algo, name)} must be >= 1"
        for name in ("authors_gpus", "authors_micro_batch_size", "gen_batch_factor")
        if getattr(algo, name) < 1
    ]
    if algo.gen_batch_factor > 1 and not algo.dynamic_sampling:
        problems.append(
            f"algorithm.gen_batch_factor={algo.gen_batch_factor} needs "
            "algorithm.dynamic_sampling=true (without it every generated group is kept)"
        )
    grouped = algo.lp_reg_scope in ("group", "authors")
    if grouped != (algo.lp_reg_group_size is not None):
        problems.append(
            "algorithm.lp_reg_scope=group (or authors) and algorithm.lp_reg_group_size go "
            "together: set both (a group size >= 1) or neither"
        )
    elif algo.lp_reg_group_size is not None and algo.lp_reg_group_size < 1:
        problems.append(f"algorithm.lp_reg_group_size={algo.lp_reg_group_size} must be >= 1")
    tokens = algo.lp_reg_micro_batch_tokens
    if tokens is not None and algo.lp_reg_scope != "authors":
        problems.append(
            "algorithm.lp_reg_micro_batch_tokens is read with algorithm.lp_reg_scope=authors "
            "only: remove it or set the scope"
        )
    elif tokens is not None and tokens < 1:
        problems.append(f"algorithm.lp_reg_micro_batch_tokens={tokens} must be >= 1")
    if algo.lp_reg_balance_batch and algo.lp_reg_scope != "authors":
        problems.append(
            "algorithm.lp_reg_balance_batch deals rows to the authors' virtual GPUs: it needs "
            "algorithm.lp_reg_scope=authors (or remove it)"
        )
    return problems


def launch_problems(config: Any, world: int) -> list[str]:
    """What the number of processes ``world`` rules out for these keys."""
    t, problems = config.train, []
    group = config.algorithm.lp_reg_group_size
    rows = (t.mini_batch_size or t.prompts_per_step) * config.rollout.n // world
    if group is not None and rows % group:
        problems.append(
            f"algorithm.lp_reg_group_size={group} must divide each process's {rows} rows of "
            "a mini-batch, so that no selection group spans two processes"
        )
    if t.batch_assembly == "authors" and t.strategy == "fsdp" and world > 1:
        problems.append(
            "train.batch_assembly=authors deals micro-batches to processes unevenly: use "
            "train.strategy=ddp (or one process) with it"
        )
    return problems
