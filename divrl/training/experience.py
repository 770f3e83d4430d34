"""Stage 1 of a training step: the experience (roll out, score, shape, filter, shard).

:class:`ExperienceMaker` turns one step's prompt draw into an :class:`Experience`: this
process's scored rollouts as padded tensors, built once per step. The update stage reads
micro-batches of it by index (:meth:`Experience.model_inputs`); nothing re-pads lists.

The pieces with a small surface are pure functions: :func:`overlong_penalty` (DAPO's soft
length punishment), :func:`shard_positions` (which prompts of the global draw this process
rolls out) and :func:`informative_groups` (DAPO's dynamic-sampling filter).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from divrl.algorithms import compute_advantages
from divrl.data.prompts import PromptItem
from divrl.data.sampling import EpochSampler, derive_seed
from divrl.distributed import Collective
from divrl.rewards.types import (
    BatchScores,
    ScoreRequest,
    UnscorableShareError,
    is_correct,
    unscorable_share_message,
)
from divrl.rollout import RolloutEngine, RolloutOutput, SamplingParams
from divrl.training.batch import Experience
from divrl.training.config import Config

logger = logging.getLogger(__name__)

__all__ = [
    "Experience",
    "ExperienceMaker",
    "RewardFn",
    "check_unscorable_share",
    "count_unscorable",
    "default_reward_fn",
    "informative_groups",
    "is_correct",
    "overlong_penalty",
    "score_requests",
    "shard_positions",
]

# typed requests -> BatchScores (with failure reasons), or plain per-item scores
RewardFn = Callable[[list[ScoreRequest]], "BatchScores | Sequence[float]"]


def default_reward_fn(requests: list[ScoreRequest]) -> BatchScores:
    """The verifiers (:func:`divrl.rewards.score_batch`)."""
    from divrl.rewards import score_batch

    return score_batch(requests)


def score_requests(
    reward_fn: RewardFn, requests: list[ScoreRequest], unscorable: float = 0.0
) -> tuple[list[float], dict[str, int]]:
    """(scores, counts of failure reasons) of ``requests`` under ``reward_fn``.

    An unscorable response (a verifier timeout, a crashed worker, a verifier error:
    :data:`~divrl.rewards.types.UNSCORABLE_REASONS`) gets the score ``unscorable`` (training
    passes NaN, which keeps it out of its group's baseline); a reward function that returns
    plain scores reports no reasons, and a NaN it returns marks an unscorable response.
    """
    result = reward_fn(requests)
    if isinstance(result, BatchScores):
        scores = [unscorable if r.unscorable else float(r.score) for r in result.results]
        return scores, result.failures
    scores = [float(s) for s in result]
    if len(scores) != len(requests):
        raise ValueError(f"the reward function returned {len(scores)} scores for {len(requests)}")
    return scores, {}


def count_unscorable(scores: Sequence[float]) -> int:
    """How many of ``scores`` mark an unscorable response (NaN)."""
    return sum(1 for s in scores if not math.isfinite(s))


def check_unscorable_share(step: int, n_unscorable: float, n_total: float, limit: float) -> None:
    """Raise :class:`~divrl.rewards.types.UnscorableShareError` (one line) when more than
    ``limit`` (``train.max_unscorable``) of the step's ``n_total`` responses, all processes
    together, were unscorable."""
    if n_total > 0 and n_unscorable > limit * n_total:
        raise UnscorableShareError(
            unscorable_share_message(
                f"step {step + 1}", int(n_unscorable), int(n_total), limit,
                "train.max_unscorable",
            )
        )  # fmt: skip


def rollout_requests(
    prompts: Sequence[PromptItem], rows: Sequence[int], out: RolloutOutput
) -> list[ScoreRequest]:
    """One request per generated text; ``rows[p]`` is the prompt of ``out``'s prompt ``p``."""
    return [
        ScoreRequest(
            data_source=prompts[rows[p]].data_source,
            solution_str=text,
            ground_truth=prompts[rows[p]].ground_truth,
            extra_info=prompts[rows[p]].extra_info,
        )
        for p, text in zip(out.prompt_index, out.texts, strict=True)
    ]


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max_len - buffer``, then linear to -factor."""
    if buffer <= 0 or length <= max_len - buffer:
        return 0.0
    return -min(length - (max_len - buffer), buffer) / buffer * factor


def shard_positions(prompts_per_step: int, mini_batch: int, world: int, rank: int) -> list[int]:
    """Positions in the global prompt batch that process ``rank`` rolls out.

    Each mini-batch (a contiguous block of the global batch) is split evenly over the
    processes, so a process's k-th mini-batch is its piece of the global k-th one and
    every optimiser step sees the same prompts whatever the number of processes.
    """
    piece = mini_batch // world
    return [
        k * mini_batch + rank * piece + j
        for k in range(prompts_per_step // mini_batch)
        for j in range(piece)
    ]


def informative_groups(rewards: Sequence[float], n: int) -> list[bool]:
    """DAPO dynamic sampling: for each group of ``n`` consecutive rewards, whether its
    scorable rewards differ (a group whose scorable rewards are all equal has zero advantage
    everywhere; an unscorable response, NaN, has none)."""
    return [
        len({r for r in rewards[g : g + n] if math.isfinite(r)}) > 1
        for g in range(0, len(rewards), n)
    ]


class _Rows:
    """Kept groups of one step, appended round by round, padded once at the end."""

    def __init__(self) -> None:
        self.prompt_ids: list[list[int]] = []
        self.response_ids: list[list[int]] = []
        self.rollout_log_probs: list[list[float]] = []
        self.rewards: list[float] = []
        self.scores: list[float] = []
        self.groups: list[int] = []
        self.truncated: list[bool] = []

    def __len__(self) -> int:
        return len(self.response_ids)

    def add_group(self, out: RolloutOutput, rows: range, rewards, scores, gid: int) -> None:
        for r in rows:
            self.prompt_ids.append(out.prompt_ids[r])
            self.response_ids.append(out.response_ids[r])
            self.rollout_log_probs.append(out.log_probs[r])
            self.rewards.append(rewards[r])
            self.scores.append(scores[r])
            self.groups.append(gid)
            self.truncated.append(out.truncated[r])

    def padded(self, pad_id: int) -> Experience:
        return Experience.from_rollouts(**vars(self), pad_id=pad_id)


class ExperienceMaker:
    """Rolls out, scores, shapes and (DAPO) filters this process's share of each step.

    Args:
        config: the run's config.
        engine: the rollout engine (it samples from the current policy).
        prompts: the training prompts; ``sampler`` draws indices into them (the same
            global draw on every process).
        reward_fn: typed requests -> :class:`~divrl.rewards.types.BatchScores` (or scores).
        collective: the processes of the run.
        params: sampling settings of the rollouts.
        pad_id: the pad token id.
    """

    def __init__(
        self,
        config: Config,
        engine: RolloutEngine,
        prompts: Sequence[PromptItem],
        sampler: EpochSampler,
        reward_fn: RewardFn,
        collective: Collective,
        params: SamplingParams,
        pad_id: int,
    ) -> None:
        self.config, self.engine, self.prompts, self.sampler = config, engine, prompts, sampler
        self.reward_fn, self.collective, self.params = reward_fn, collective, params
        self.pad_id = pad_id
        t = config.train
        self.positions = shard_positions(
            t.prompts_per_step, t.mini_batch_size or t.prompts_per_step, collective.world,
            collective.rank,
        )  # fmt: skip

    @property
    def round_positions(self) -> list[int]:
        """This process's positions in one generation round's global draw: its share of
        each of the round's ``algorithm.gen_batch_factor`` blocks of prompts_per_step."""
        size = self.config.train.prompts_per_step
        factor = self.config.algorithm.gen_batch_factor
        return [block * size + q for block in range(factor) for q in self.positions]

    def _generate(self, step: int, round_: int, mine: list[int]) -> RolloutOutput:
        cfg, coll = self.config, self.collective
        prompt_ids = [self.prompts[i].prompt_ids for i in mine]
        if cfg.rollout.seeded:
            seeds = [derive_seed(cfg.train.seed, step, round_, q) for q in self.round_positions]
            return self.engine.generate(prompt_ids, self.params, seeds)
        # batched: one seed per (step, round, process), independent of the global RNG
        device = coll.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(derive_seed(cfg.train.seed, step, round_, coll.world, coll.rank, 1))
            return self.engine.generate(prompt_ids, self.params)

    def _shaped(self, scores: list[float], out: RolloutOutput) -> list[float]:
        cfg, algo = self.config, self.config.algorithm
        return [
            s
            + overlong_penalty(
                len(r), cfg.rollout.max_new_tokens, algo.overlong_buffer, algo.overlong_penalty
            )
            for s, r in zip(scores, out.response_ids, strict=True)
        ]

    @staticmethod
    def _batch_stats(out: RolloutOutput, scores: list[float], rewards: list[float]) -> dict:
        """The current policy's batch statistics, before any filtering; the scores and
        rewards over the scorable responses only (a process with none reports none)."""
        lengths = [len(r) for r in out.response_ids]
        stats = {
            "response/length": sum(lengths) / len(lengths),
            "response/truncated": sum(out.truncated) / len(out.truncated),
        }
        kept = [(s, r) for s, r in zip(scores, rewards, strict=True) if math.isfinite(s)]
        if kept:
            stats["reward/score"] = sum(s for s, _ in kept) / len(kept)
            stats["reward/pass@1"] = sum(is_correct(s) for s, _ in kept) / len(kept)
            stats["reward/shaped"] = sum(r for _, r in kept) / len(kept)
        return stats

    def _short_batch(self, step: int, least: int, per_rank: int, rounds: int) -> None:
        """The last generation round left the batch short: stop (``refill_exhausted: raise``,
        as the recipes) or say so and train on what was kept."""
        algo = self.config.algorithm
        what = (
            f"step {step + 1}: dynamic sampling kept {least} of {per_rank} informative groups "
            f"per process after {rounds} generation rounds (algorithm.max_refill_rounds="
            f"{algo.max_refill_rounds}, gen_batch_factor={algo.gen_batch_factor})"
        )
        if algo.refill_exhausted == "raise":
            raise RuntimeError(
                f"{what}; algorithm.refill_exhausted=raise stops here, as verl's recipe does: "
                "raise algorithm.max_refill_rounds or gen_batch_factor, or set "
                "algorithm.refill_exhausted=continue to train on the groups kept"
            )
        if self.collective.rank == 0:
            logger.warning("%s; training on the groups kept", what)

    def make(self, step: int) -> tuple[Experience | None, dict[str, float], dict[str, float]]:
        """(experience or None when every group was dropped, mean metrics, count metrics)
        of training step ``step`` (0-based)."""
        cfg, algo = self.config, self.config.algorithm
        n, per_rank = cfg.rollout.n, cfg.train.prompts_per_step // self.collective.world
        rows, means, reasons = _Rows(), {}, Counter()
        n_scored = n_unscorable = 0
        counts: dict[str, float] = {"dapo/dropped_groups": 0.0} if algo.dynamic_sampling else {}
        round_, positions = 0, self.round_positions
        while True:
            global_idx = self.sampler.take(cfg.train.prompts_per_step * algo.gen_batch_factor)
            mine = [global_idx[q] for q in positions]
            out = self._generate(step, round_, mine)
            scores, failures = score_requests(
                self.reward_fn, rollout_requests(self.prompts, mine, out), float("nan")
            )
            reasons.update(failures)
            n_scored += len(scores)
            n_unscorable += count_unscorable(scores)
            rewards = self._shaped(scores, out)
            if round_ == 0:
                means.update(self._batch_stats(out, scores, rewards))
            keep = informative_groups(rewards, n) if algo.dynamic_sampling else [True] * len(mine)
            for p, informative in enumerate(keep):
                if not informative:
                    counts["dapo/dropped_groups"] += 1
                elif len(rows) // n < per_rank:
                    gid = round_ * 10**9 + positions[p]
                    rows.add_group(out, range(p * n, (p + 1) * n), rewards, scores, gid)
            round_ += 1
            if not algo.dynamic_sampling:
                break
            (least,) = self.collective.all_reduce([len(rows) // n], op="min")
            if least >= per_rank or round_ > algo.max_refill_rounds:
                break
        counts.update({f"reward/{reason}": float(c) for reason, c in reasons.items()})
        counts["reward/unscorable"] = float(n_unscorable)
        # the same sums on every process, so that every process stops or none does
        total_unscorable, total = self.collective.all_reduce([n_unscorable, n_scored])
        check_unscorable_share(step, total_unscorable, total, cfg.train.max_unscorable)
        experience = rows.padded(self.pad_id) if len(rows) else None
        if algo.dynamic_sampling:
            # Every process must run the same number of micro-batches (DDP): trim to the
            # smallest process's count of kept groups.
            (least,) = self.collective.all_reduce([len(rows) // n], op="min")
            if experience is not None:
                experience = experience.truncate(int(least) * n)
            means["dapo/rounds"] = round_
            means["dapo/short_batch"] = float(least < per_rank)
            counts["dapo/kept_groups"] = int(least)
            if least < per_rank:
                self._short_batch(step, int(least), per_rank, round_)
        if experience is not None and len(experience):
            # an unscorable response (NaN reward) is out of its group's baseline, advantage 0
            advantages, adv_metrics = compute_advantages(
                algo.advantage, experience.rewards, experience.groups, algo.estimator
            )
            experience.advantages = advantages.float()
            means.update(adv_metrics)
        return experience, means, counts
