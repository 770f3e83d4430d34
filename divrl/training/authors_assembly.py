"""The DPH-RL authors' batch assembly, replicated: ``train.batch_assembly: authors``.

divrl's default keeps rollouts and reference samples in separate micro-batches and weighs
the streams explicitly (docs/algorithms.md, "Stream weighting"). This module instead does
what the authors' trainer and actor do with a step's rows (seamoke/DPH-RL
``ray_trainer.py``, ``dp_actor.py``), for users who must reproduce the paper's numbers:

1. the step's reference rows are appended after its rollouts;
2. the rows are cut into ``algorithm.authors_gpus`` contiguous chunks (their data-parallel
   split), each chunk in order into mini-batches of ``rollouts / (mini-batches x GPUs)``
   rows: a chunk longer than its rollouts' share gives an extra, smaller optimiser step;
3. each mini-batch is cut into micro-batches: ``authors_micro_batch_size`` consecutive rows,
   or, with ``authors_dynamic_batch``, Karmarkar-Karp partitions balancing prompt + response
   tokens, as many as the most any GPU needs for ``train.micro_batch_tokens``;
4. a micro-batch is typed by its first row: reference -> ``eta x`` the token-mean
   divergence, otherwise the token-mean clipped loss on all its rows, reference rows
   included (old log-probs = their stored ones, advantage ``1 / (1 + 1e-6)``: a one-sample
   group has mean 0 and std 1 in verl's GRPO, and a stored response is correct);
5. each micro-batch loss is divided by the accumulation count ``mini-batch rows //
   micro-batch rows`` (fixed) or multiplied by ``rows / mini-batch rows`` (dynamic), and
   the GPUs' gradients are averaged.

The virtual GPUs' micro-batches are dealt round-robin to divrl's processes, so the gradient
is the same on any number of processes.
"""

from __future__ import annotations

import contextlib
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from divrl.algorithms import LogitStats, logit_stats, reference_divergence_loss, token_log_probs
from divrl.algorithms.dph_weighting import REFERENCE, ROLLOUT, AuthorsLayout
from divrl.training.authors_config import REPLICA_PARTS
from divrl.training.batch import Experience, PaddedPairs, ReferenceSamples, concat_pairs, pad_right
from divrl.training.forward import response_logits, to_device
from divrl.training.metrics import MetricMeter

__all__ = [
    "REFERENCE_ADVANTAGE",
    "REPLICA_PARTS",
    "AuthorsAssembly",
    "MicroBatch",
    "balanced_order",
    "karmarkar_karp",
    "schedule",
]

#: a reference row's advantage in the authors' runs: score 1 in a group of one (verl's GRPO
#: gives such a group mean 0 and std 1, and divides by std + 1e-6)
REFERENCE_ADVANTAGE = 1.0 / (1.0 + 1e-6)


class _Part:
    """One set of a partition: its ``(index, length)`` items in the order they joined."""

    def __init__(self, items: list[tuple[int, int]]) -> None:
        self.items = items
        self.total = sum(v for _, v in items)

    def key(self) -> tuple:
        return (self.total, len(self.items), self.items)


class _State:
    """A partial partition of the largest differencing method: ``k`` parts, largest first."""

    def __init__(self, parts: list[_Part]) -> None:
        self.parts = sorted(parts, key=_Part.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.parts[0].total - self.parts[-1].total

    def __lt__(self, other: _State) -> bool:
        # the heap pops the largest spread first, then the largest first part
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.parts[0].key() > other.parts[0].key()

    def merge(self, other: _State) -> None:
        # the largest part of one joins the smallest of the other
        k = len(self.parts)
        joined = [_Part(self.parts[i].items + other.parts[k - 1 - i].items) for i in range(k)]
        self.parts = sorted(joined, key=_Part.key, reverse=True)


def karmarkar_karp(lengths: Sequence[int], parts: int, equal_size: bool = False) -> list[list[int]]:
    """``range(len(lengths))`` in ``parts`` sets of balanced length sums, by the largest
    differencing method with verl's order of ties: sizes unequal (the partition of its
    dynamic batch size) or, ``equal_size``, ``len(lengths) / parts`` items each (its
    ``balance_batch`` over the data-parallel ranks: the sorted lengths enter ``parts`` at
    a time, one to each set).

    Each set is sorted ascending; sets come in order of decreasing sum. Every set is
    non-empty when ``parts <= len(lengths)``.
    """
    if not 1 <= parts <= len(lengths):
        raise ValueError(f"parts must be in [1, {len(lengths)}], got {parts}")
    if equal_size and len(lengths) % parts:
        raise ValueError(f"equal sizes need parts ({parts}) to divide {len(lengths)} items")
    heap: list[_State] = []
    ordered = sorted((int(n), i) for i, n in enumerate(lengths))
    if equal_size:
        for start in range(0, len(ordered), parts):
            chunk = ordered[start : start + parts]
            heapq.heappush(heap, _State([_Part([(i, n)]) for n, i in chunk]))
    else:
        for n, i in ordered:
            empty = [_Part([]) for _ in range(parts - 1)]
            heapq.heappush(heap, _State([_Part([(i, n)]), *empty]))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return [sorted(i for i, _ in part.items) for part in heap[0].parts]


def balanced_order(lengths: Sequence[int], gpus: int, mini_batches: int) -> list[int]:
    """The step's rows in the order its mini-batches take them when verl's
    ``balance_batch`` deals them to ``gpus`` ranks: equal-size Karmarkar-Karp partitions of
    the lengths (prompt + response tokens, its ``attention_mask`` sums), rank ``g`` holding
    partition ``g`` in ascending row order and cutting it into ``mini_batches`` consecutive
    pieces. Mini-batch ``j`` is the ``j``-th piece of every rank, ranks in order, so
    consecutive groups of ``len(lengths) / (gpus x mini_batches)`` rows are one rank's."""
    if len(lengths) % (gpus * mini_batches):
        raise ValueError(
            f"{len(lengths)} rows do not split into {gpus} ranks x {mini_batches} mini-batches"
        )
    parts = karmarkar_karp(lengths, gpus, equal_size=True)
    per = len(lengths) // (gpus * mini_batches)
    return [r for j in range(mini_batches) for p in parts for r in p[j * per : (j + 1) * per]]


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of one virtual GPU: ``rows`` (positions in the step's row list,
    ascending), the authors' ``scale`` of its loss, and whether it is typed reference."""

    rows: tuple[int, ...]
    scale: float
    reference: bool


def _pieces(rows: Sequence[int], size: int) -> list[list[int]]:
    return [list(rows[i : i + size]) for i in range(0, len(rows), size)]


def _micro_count(rows: Sequence[int], lengths: Sequence[int], budget: int) -> int:
    return min(len(rows), math.ceil(sum(lengths[r] for r in rows) / budget))


def _micro_batches(
    rows: list[int], kinds: Sequence[str], lengths: Sequence[int], layout: AuthorsLayout, count: int
) -> list[MicroBatch]:
    m = layout.mini_batch_rows
    if layout.dynamic:
        parts = karmarkar_karp([lengths[r] for r in rows], count)
        pieces = [[rows[i] for i in p] for p in parts]
        scales = [len(p) / m for p in pieces]
    else:
        accumulation = m // layout.micro_batch_size
        if accumulation < 1:
            raise ValueError(
                f"the authors' mini-batch of {m} rows per GPU is smaller than their "
                f"micro-batch of {layout.micro_batch_size} rows"
            )
        pieces = _pieces(rows, layout.micro_batch_size)
        scales = [1.0 / accumulation] * len(pieces)
    return [
        MicroBatch(tuple(p), s, kinds[p[0]] == REFERENCE)
        for p, s in zip(pieces, scales, strict=True)
    ]


def _without_clones(mb: MicroBatch, kinds: Sequence[str], layout: AuthorsLayout) -> MicroBatch:
    """A rollout-typed micro-batch without its reference rows (they get neither loss); under
    dynamic batch sizes the scale follows the rows kept, so each kept row weighs as before."""
    if mb.reference:
        return mb
    kept = tuple(r for r in mb.rows if kinds[r] != REFERENCE)
    scale = len(kept) / layout.mini_batch_rows if layout.dynamic else mb.scale
    return MicroBatch(kept, scale, False)


def _token_scaled(
    mb: MicroBatch, tokens: Sequence[int], per_row: float, layout: AuthorsLayout
) -> MicroBatch:
    """The micro-batch's token-mean weighted by its share of the tokens of a full
    mini-batch (``per_row`` x mini-batch rows) instead of its share of the rows."""
    share = sum(tokens[r] for r in mb.rows) / (per_row * layout.mini_batch_rows)
    return MicroBatch(mb.rows, share, mb.reference)


def _fold_short_tails(minis: list[list[list[int]]], size: int) -> list[list[list[int]]]:
    """Each GPU's last mini-batch, when shorter than ``size`` rows, joined to the one before
    it (the authors' extra small optimiser step removed; every row keeps its weight)."""
    out = []
    for gpu in minis:
        if len(gpu) > 1 and len(gpu[-1]) < size:
            gpu = [*gpu[:-2], gpu[-2] + gpu[-1]]
        out.append(gpu)
    return out


def schedule(
    kinds: Sequence[str],
    lengths: Sequence[int],
    layout: AuthorsLayout,
    token_budget: int | None = None,
    omit: Sequence[str] = (),
    tokens: Sequence[int] | None = None,
) -> list[list[list[MicroBatch]]]:
    """The authors' optimiser steps over a step's rows: ``[step][gpu][micro-batch]``.

    Args:
        kinds: ``rollout`` / ``reference`` per row, rollouts first.
        lengths: prompt + response tokens per row (dynamic batch sizes balance these).
        layout: the authors' layout (GPUs, mini-batch rows, micro-batching).
        token_budget: tokens per micro-batch per GPU, required when ``layout.dynamic``.
        omit: parts of :data:`REPLICA_PARTS` to leave out (ablations of the replica):
            ``cloned_references``: reference rows of rollout-typed micro-batches are dropped
            from them; ``third_step``: each GPU's short last mini-batch joins the one before;
            ``micro_batch_scaling``: each micro-batch weighs its share of the tokens
            (``tokens``, the loss's tokens per row) of a full mini-batch, not of its rows.
    """
    if layout.dynamic and token_budget is None:
        raise ValueError("dynamic batch sizes need a token budget per micro-batch")
    unknown = sorted(set(omit) - set(REPLICA_PARTS))
    if unknown:
        raise ValueError(f"unknown replica parts {unknown}; valid: {', '.join(REPLICA_PARTS)}")
    if "micro_batch_scaling" in omit and tokens is None:
        raise ValueError("omitting the micro-batch scaling needs the tokens per row")
    chunk = -(-len(kinds) // layout.gpus)  # torch.chunk's split of the rows over the GPUs
    minis = [_pieces(g, layout.mini_batch_rows) for g in _pieces(range(len(kinds)), chunk)]
    if "third_step" in omit:
        minis = _fold_short_tails(minis, layout.mini_batch_rows)
    per_row = sum(tokens) / max(len(tokens), 1) if tokens is not None else 0.0
    steps = []
    for k in range(max(len(g) for g in minis)):
        here = [g[k] for g in minis if k < len(g)]
        # one micro-batch count for all GPUs: the most any of them needs
        count = max(_micro_count(mb, lengths, token_budget) for mb in here) if layout.dynamic else 0
        step = [_micro_batches(mb, kinds, lengths, layout, count) for mb in here]
        if "cloned_references" in omit:
            step = [[_without_clones(mb, kinds, layout) for mb in gpu] for gpu in step]
        if "micro_batch_scaling" in omit:
            step = [[_token_scaled(mb, tokens, per_row, layout) for mb in gpu] for gpu in step]
        steps.append(step)
    return steps


@dataclass
class _StepRows:
    """A step's rows in the authors' order, on every process."""

    pairs: PaddedPairs
    old_log_probs: torch.Tensor  # [T, R]: rollouts' old log-probs, references' stored ones
    advantages: torch.Tensor  # [T]
    kinds: list[str]

    @property
    def lengths(self) -> list[int]:
        return (self.pairs.prompt_lengths + self.pairs.response_lengths).tolist()


class AuthorsAssembly:
    """Runs a step's optimiser steps the authors' way through ``update`` (a
    :class:`~divrl.training.update.PolicyUpdate`: its model, optimiser and step end)."""

    def __init__(self, update, layout: AuthorsLayout) -> None:
        self.update, self.layout = update, layout
        self.config = update.config

    @torch.no_grad()
    def _old_log_probs(self, exp: Experience) -> torch.Tensor:
        """The rollouts' log-probs under the policy before this step's updates (a step that
        divrl runs on-policy is not one here: the reference rows add optimiser steps)."""
        update = self.update
        policy = update.accelerator.unwrap_model(update.model)
        out = torch.zeros(exp.responses.shape)
        for idx in update.micro_batches(exp, range(len(exp))):
            data = to_device(exp.model_inputs(idx), update.accelerator.device)
            lp = token_log_probs(
                response_logits(policy, data),
                data["responses"],
                self.config.rollout.temperature,
                update.chunk,
            )
            lp = torch.where(data["response_mask"] > 0, lp.float(), torch.zeros_like(lp.float()))
            out[idx, : lp.shape[1]] = lp.cpu()
        return out

    def _gather(self, exp: Experience) -> tuple[PaddedPairs, torch.Tensor, torch.Tensor]:
        """Every process's rollouts, in prompt order (independent of the process count)."""
        old = exp.old_log_probs if exp.old_log_probs is not None else self._old_log_probs(exp)
        mine = {
            "pairs": PaddedPairs(exp.prompts, exp.prompt_mask, exp.responses, exp.response_mask),
            "old": old,
            "advantages": exp.advantages,
            "groups": exp.groups,
        }
        parts = self.update.collective.all_gather_object(mine)
        keys = [(int(g), r, i) for r, p in enumerate(parts) for i, g in enumerate(p["groups"])]
        order = [j for j, _ in sorted(enumerate(keys), key=lambda x: x[1])]
        pad = self.update.pad_id
        pairs = concat_pairs([p["pairs"] for p in parts], pad).select(order)
        width = pairs.responses.shape[1]
        old = torch.cat([pad_right(p["old"], width) for p in parts])[order]
        advantages = torch.cat([p["advantages"].float() for p in parts])[order]
        return pairs, old, advantages

    def step_rows(self, exp: Experience, references: Sequence[int]) -> _StepRows:
        """The rollouts of all processes, then the step's reference rows."""
        pairs, old, advantages = self._gather(exp)
        samples: ReferenceSamples = self.update.reference_samples
        refs = samples.select(list(references))
        both = concat_pairs([pairs, refs], self.update.pad_id)
        width = both.responses.shape[1]
        return _StepRows(
            pairs=both,
            old_log_probs=torch.cat([pad_right(old, width), pad_right(refs.ref_log_probs, width)]),
            advantages=torch.cat([advantages, torch.full((len(refs),), REFERENCE_ADVANTAGE)]),
            kinds=[ROLLOUT] * len(pairs) + [REFERENCE] * len(refs),
        )

    def _loss(
        self, rows: _StepRows, mb: MicroBatch
    ) -> tuple[torch.Tensor, dict, int, tuple[float, float] | None]:
        cfg, algo, update = self.config, self.config.algorithm, self.update
        data = to_device(rows.pairs.model_inputs(mb.rows), update.accelerator.device)
        # policy-typed micro-batches also yield the entropy, from the same pass over the logits
        stats = logit_stats(
            response_logits(update.model, data),
            data["responses"],
            cfg.rollout.temperature,
            update.chunk,
            with_entropy=not mb.reference,
        )
        lp = stats.log_prob
        old = rows.old_log_probs[list(mb.rows), : lp.shape[1]].to(lp.device)
        mask = data["response_mask"]
        if mb.reference:
            loss, metrics = reference_divergence_loss(
                lp, old, mask, algo.divergence, algo.divergence_alpha, update.agg
            )
            loss = update.eta * loss
        else:
            loss, metrics = update.loss_spec.fn(
                log_prob=lp,
                old_log_prob=old,
                advantages=rows.advantages[list(mb.rows)].to(lp.device),
                mask=mask,
                **update.loss_options.loss_kwargs(),
            )
        return (
            loss,
            dict(metrics),
            int(mask.sum().item()),
            self._rollout_entropy(rows, mb, stats, mask),
        )

    @staticmethod
    def _rollout_entropy(
        rows: _StepRows, mb: MicroBatch, stats: LogitStats, mask: torch.Tensor
    ) -> tuple[float, float] | None:
        """(mean entropy, tokens) over the micro-batch's rollout rows, or None when it has none.
        The reference rows a rollout-typed micro-batch carries are left out: ``actor/entropy``
        is the policy's entropy on its own samples, as divrl's default assembly logs it."""
        if mb.reference:
            return None
        rollout = torch.tensor([rows.kinds[r] == ROLLOUT for r in mb.rows], device=mask.device)
        tokens = mask * rollout[:, None].to(mask.dtype)
        count = float(tokens.sum())
        if count == 0:
            return None
        return float((stats.entropy.detach() * tokens).sum()) / count, count

    def _optimiser_step(self, rows: _StepRows, gpus, meter: MetricMeter, step: int) -> bool:
        update, world = self.update, self.update.collective.world
        every = [mb for gpu in gpus for mb in gpu]
        mine = every[update.collective.rank :: world]
        if not mine:
            raise ValueError(
                f"train.batch_assembly=authors: an optimiser step has {len(every)} micro-batches, "
                f"fewer than the {world} processes; run on fewer processes"
            )
        nonfinite = objective = 0.0
        for j, mb in enumerate(mine):
            sync = j == len(mine) - 1
            # the authors average their GPUs' gradients; DDP averages divrl's processes'
            scale = mb.scale / self.layout.gpus * world
            with contextlib.nullcontext() if sync else update.accelerator.no_sync(update.model):
                loss, metrics, ntok, entropy = self._loss(rows, mb)
                update.accelerator.backward(loss * scale)
            value = float(loss.detach())
            nonfinite = max(nonfinite, 0.0 if math.isfinite(value) else 1.0)
            objective += value * scale / world
            meter.add(metrics, weight=ntok)
            if entropy is not None:
                meter.add({"actor/entropy": entropy[0]}, weight=entropy[1])
        return update._apply(step, nonfinite, objective, meter)

    def run(self, exp: Experience, references: Sequence[int], meter: MetricMeter, step: int) -> int:
        """All optimiser steps of a training step; returns how many were skipped."""
        rows = self.step_rows(exp, references)
        plan = schedule(
            rows.kinds,
            rows.lengths,
            self.layout,
            self.config.train.micro_batch_tokens,
            omit=self.config.train.authors_replica_omit,
            tokens=rows.pairs.response_lengths.tolist(),
        )
        under_policy = sum(
            rows.kinds[r] == REFERENCE
            for s in plan
            for gpu in s
            for mb in gpu
            if not mb.reference
            for r in mb.rows
        )
        meter.add(
            {
                "dph/reference_rows_under_policy_loss": float(under_policy),
                "dph/optimiser_steps": float(len(plan) * self.config.train.ppo_epochs),
            }
        )
        skipped = 0
        for _ in range(self.config.train.ppo_epochs):
            for gpus in plan:
                skipped += not self._optimiser_step(rows, gpus, meter, step)
        return skipped
