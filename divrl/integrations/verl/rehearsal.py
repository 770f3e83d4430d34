"""DPH-RL's rehearsal rows in a verl update batch: reference-store samples joined as rows.

:func:`join_rehearsal` takes the TensorDict that verl's actor update receives (one row per
rollout, the nested/jagged layout of verl's v1 trainer: ``prompts``, ``responses``,
``input_ids``, ... per row without padding) and returns it with rehearsal rows appended,
each carrying the stored per-token log-probs of the initial policy under
``divrl_ref_log_prob`` (a key verl's old-log-prob and reference passes never write), and
its rows ordered so that every mini-batch of every data-parallel rank holds its share of
both streams, as ``divrl train`` splits its reference samples over its mini-batches.

verl cuts the update batch into ``dp_size`` contiguous rank chunks and each chunk into
``mini_batches`` contiguous mini-batches (with ``actor.shuffle=False``); the join lays the
rows out cell by cell in that order and records each mini-batch's stream statistics
(``divrl_stream``), which :class:`~divrl.integrations.verl.losses.DivRLLoss` checks against
verl's own token count of the mini-batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from divrl.data.reference_store import ReferenceSample, ReferenceStore
from divrl.data.sampling import EpochSampler
from divrl.integrations.verl.keys import (
    ETA,
    IS_REFERENCE,
    LOG_NORMALIZER,
    PROXY_LOG_PROB,
    REF_LOG_PROB,
    STREAM,
)

#: the per-row keys of verl's actor update that the join carries (rollout rows keep theirs;
#: rehearsal rows get theirs built from the store)
UPDATE_KEYS = (
    "prompts",
    "responses",
    "input_ids",
    "position_ids",
    "response_mask",
    "loss_mask",
    "old_log_probs",
    "advantages",
)
#: joined when the rollout rows have them (verl's v1 queue rows carry no attention_mask)
OPTIONAL_KEYS = ("attention_mask", "ref_log_prob", "entropy", PROXY_LOG_PROB, LOG_NORMALIZER)


@dataclass(frozen=True)
class JoinLayout:
    """How the joined batch is cut: the sizes verl's update must be given."""

    rows: int  # rows of the joined batch
    mini_batch_rows: int  # rows per mini-batch, all ranks (verl's ``mini_batch_size``)
    rollouts_per_cell: int  # rollout rows per (rank, mini-batch)
    references_per_cell: int  # rehearsal rows per (rank, mini-batch)
    #: where each joined row comes from: ``i >= 0`` rollout row i, ``-(j + 1)`` sample j
    order: tuple[int, ...] = ()


class RehearsalSource:
    """Seeded, cycling draws from a divrl reference store (the same order on every run).

    Args:
        path: the store ``divrl presample`` wrote.
        temperature: verl's rollout temperature; the store's log-probs must be at it.
        seed: the draw order's seed.
        allow_mismatch: train on a store whose temperature differs (a warning).
    """

    def __init__(self, path: str, temperature: float, seed: int = 0, allow_mismatch=False):
        store = ReferenceStore.open(path, temperature=None if allow_mismatch else temperature)
        self.samples = store.samples
        self.sampler = EpochSampler(len(store), seed, shuffle=True)

    def draw(self, n: int) -> list[ReferenceSample]:
        return [self.samples[i] for i in self.sampler.take(n)]

    def state_dict(self) -> dict:
        """The draw order's position (saved in verl's checkpoint folder)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue a saved draw order (a ValueError when the store's size differs)."""
        self.sampler.load_state_dict(state)


def plan_layout(
    rollouts: int, references: int, dp_size: int, mini_batches: int, micro_batch_size: int | None
) -> JoinLayout:
    """The joined batch's layout, or a ValueError naming the sizes that do not divide."""
    cells = dp_size * mini_batches
    if rollouts % cells or references % cells:
        raise ValueError(
            f"{rollouts} rollout rows and {references} rehearsal rows must each split evenly "
            f"over {dp_size} data-parallel ranks x {mini_batches} mini-batches: set "
            f"divrl.reference_per_step to a multiple of {cells}"
        )
    per_roll, per_ref = rollouts // cells, references // cells
    if micro_batch_size is not None and (per_roll + per_ref) % micro_batch_size:
        raise ValueError(
            f"each mini-batch of each rank holds {per_roll} rollout + {per_ref} rehearsal "
            f"rows, not a multiple of ppo_micro_batch_size_per_gpu={micro_batch_size}"
        )
    rows = rollouts + references
    return JoinLayout(rows, rows // mini_batches, per_roll, per_ref)


def _reference_row(sample: ReferenceSample, keys: Sequence[str]) -> dict[str, torch.Tensor]:
    prompt = torch.tensor(sample.prompt_ids, dtype=torch.int64)
    response = torch.tensor(sample.response_ids, dtype=torch.int64)
    if len(sample.ref_log_probs) != len(response) or len(response) == 0:
        raise ValueError(
            f"reference sample of prompt {sample.prompt_id!r}: {len(response)} response tokens "
            f"but {len(sample.ref_log_probs)} log-probs; presample again"
        )
    ref = torch.tensor(sample.ref_log_probs, dtype=torch.float32)
    seq = torch.cat([prompt, response])
    row = {
        "prompts": prompt,
        "responses": response,
        "input_ids": seq,
        # positions 0..len-1, as when the stored log-probs were computed: u = 1 at step 0
        "attention_mask": torch.ones_like(seq),
        "position_ids": torch.arange(len(seq), dtype=torch.int64),
        "response_mask": torch.ones_like(response),
        "loss_mask": torch.ones_like(response),
        "old_log_probs": ref.clone(),
        "advantages": torch.zeros_like(ref),
        "ref_log_prob": ref.clone(),
        "entropy": torch.zeros_like(ref),
        # Lp-Reg acts on rollout rows only; a rehearsal row's proxy is never read
        PROXY_LOG_PROB: torch.zeros_like(ref),
        LOG_NORMALIZER: torch.zeros_like(ref),
    }
    return {k: row[k] for k in keys}


def _rollout_row(batch: TensorDict, i: int, keys: Sequence[str]) -> dict[str, torch.Tensor]:
    row = batch[i]
    return {k: row[k] for k in keys}


def join_rehearsal(
    batch: TensorDict,
    samples: Sequence[ReferenceSample],
    *,
    dp_size: int = 1,
    mini_batches: int = 1,
    micro_batch_size: int | None = None,
    eta: float | None = None,
) -> tuple[TensorDict, JoinLayout]:
    """``batch`` with ``samples`` appended as rehearsal rows, laid out for verl's update.

    Args:
        batch: the update's rollout rows (nested layout; :data:`UPDATE_KEYS` at least).
        samples: the rehearsal samples of this step (``RehearsalSource.draw``).
        dp_size, mini_batches: how verl's update cuts the batch (ranks, optimiser steps).
        micro_batch_size: ``ppo_micro_batch_size_per_gpu`` with fixed micro-batches (None:
            dynamic batch sizes), checked to divide each rank's mini-batch.
        eta: the step's eta from the rehearsal controller, written on every row as
            ``divrl_eta`` (None: the loss uses ``divrl.divergence_coef``).

    Returns:
        The joined TensorDict (rollout keys, ``divrl_is_reference``, ``divrl_ref_log_prob``,
        ``divrl_stream``) and its :class:`JoinLayout`.
    """
    missing = [k for k in UPDATE_KEYS if k not in batch]
    if missing:
        raise ValueError(f"the update batch lacks {missing}; join after the advantages")
    keys = list(UPDATE_KEYS) + [k for k in OPTIONAL_KEYS if k in batch]
    layout = plan_layout(len(batch), len(samples), dp_size, mini_batches, micro_batch_size)
    dtypes = {key: batch[key].dtype for key in keys}
    rows: list[dict] = []
    order: list[int] = []
    kinds: list[bool] = []
    cell_of: list[int] = []  # the mini-batch index of each joined row
    per_roll, per_ref = layout.rollouts_per_cell, layout.references_per_cell
    for rank in range(dp_size):
        for k in range(mini_batches):
            cell = rank * mini_batches + k
            for i in range(cell * per_roll, (cell + 1) * per_roll):
                rows.append(_rollout_row(batch, i, keys))
                order.append(i)
                kinds.append(False)
                cell_of.append(k)
            for j in range(cell * per_ref, (cell + 1) * per_ref):
                ref = _reference_row(samples[j], keys)
                # verl's nested tensors need one dtype per key (its masks, ids may differ)
                rows.append({key: value.to(dtypes[key]) for key, value in ref.items()})
                order.append(-(j + 1))
                kinds.append(True)
                cell_of.append(k)
    for row, is_ref in zip(rows, kinds, strict=True):
        row[REF_LOG_PROB] = (
            row["old_log_probs"] if is_ref else torch.zeros_like(row["old_log_probs"])
        )
        row[IS_REFERENCE] = torch.tensor(is_ref)
    stream = _stream_tokens(rows, kinds, cell_of, mini_batches)
    for row, k in zip(rows, cell_of, strict=True):
        row[STREAM] = stream[k]
        if eta is not None:
            row[ETA] = torch.tensor(float(eta), dtype=torch.float64)
    return tu.list_of_dict_to_tensordict(rows), dataclasses.replace(layout, order=tuple(order))


def _stream_tokens(rows, kinds, cell_of, mini_batches: int) -> torch.Tensor:
    """``[mini_batches, 2]``: each mini-batch's rollout and reference tokens, all ranks."""
    tokens = torch.zeros(mini_batches, 2, dtype=torch.int64)
    for row, is_ref, k in zip(rows, kinds, cell_of, strict=True):
        tokens[k, int(is_ref)] += int(row["response_mask"].sum())
    return tokens
