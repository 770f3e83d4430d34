"""The settings of the DPH-RL authors' runs that a divrl config carries
(``algorithm.authors_*``, ``train.batch_assembly``): their layout of a step, and the checks
of the replica assembly. Kept out of the config classes, which only hold the keys."""

from __future__ import annotations

from typing import Any

from divrl.algorithms import AuthorsLayout


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
    if algo.divergence_weighting != "authors":
        problems.append("it weighs the streams itself: set algorithm.divergence_weighting=authors")
    if algo.authors_dynamic_batch and config.train.micro_batch_tokens is None:
        problems.append(
            "algorithm.authors_dynamic_batch=true needs train.micro_batch_tokens (the token "
            "budget per micro-batch, theirs 32384)"
        )
    return problems
