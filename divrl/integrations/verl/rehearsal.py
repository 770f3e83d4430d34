"""DPH-RL's rehearsal rows in a verl update batch: reference-store samples joined as rows.

:func:`join_rehearsal` (in memory) and the trainer's ``join_in_queue`` (in TransferQueue)
take the rows verl's actor update receives (one row per rollout, the nested/jagged layout
of verl's v1 trainer) and join rehearsal rows to them, each carrying the stored per-token
log-probs of the initial policy under ``divrl_ref_log_prob`` (a key verl's old-log-prob
and reference passes never write).

Every field of verl's rows is carried: a rehearsal row is built from a rollout row as
template (as verl builds its own padding rows, ``verl.trainer.ppo.padding_utils``), with
its sequence, masks and per-token fields filled from the stored sample
(:data:`RESPONSE_FILL`); a per-token field divrl cannot fill, or one whose value would be
wrong for a stored sample (:data:`REFUSED`), stops the join with one line naming it.
Per-row metadata (strings, scalars) is the template's; verl's reward, advantage and
metrics never see rehearsal rows.

The layout (:func:`plan_layout`) is computed each step from the rows verl hands over:
verl cuts the update batch into ``dp_size`` contiguous rank chunks and each into
``mini_batches`` contiguous mini-batches (``actor.shuffle=False``); the draw is split over
the step's mini-batches in draw order and, within a mini-batch, over the ranks by length
(the longest sample to the rank with the fewest tokens so far), and cells left short get
zero-mask padding rows, so any mini-batch count, rank count and ``reference_per_step``
give the equal cells verl's update needs. Each row also records its mini-batch's stream
statistics (``divrl_stream``), which :class:`~divrl.integrations.verl.losses.DivRLLoss`
checks against verl's own count.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict
from verl.trainer.ppo.padding_utils import build_padding_position_ids
from verl.utils import tensordict_utils as tu

from divrl.data.reference_store import ReferenceSample, ReferenceStore
from divrl.data.sampling import EpochSampler
from divrl.integrations.verl import keys

#: the per-row keys verl's actor update needs (a batch without them is joined too early)
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
#: per response token: what a rehearsal row gets in each field verl's rows may carry
#: (``stored``: the stored log-probs of the initial policy; ``mask``: 1, 0 on padding rows)
RESPONSE_FILL: dict[str, Any] = {
    "response_mask": "mask",
    "loss_mask": "mask",
    "old_log_probs": "stored",
    "ref_log_prob": "stored",
    "rollout_log_probs": "stored",
    "advantages": 0.0,
    "returns": 0.0,
    "values": 0.0,
    "token_level_rewards": 0.0,
    "token_level_scores": 0.0,
    "rm_scores": 0.0,
    "entropy": 0.0,
    "rollout_is_weights": 1.0,  # the store's samples are the initial policy's: no correction
    keys.PROXY_LOG_PROB: 0.0,  # Lp-Reg acts on rollout rows only
    keys.LOG_NORMALIZER: 0.0,
}
#: per sequence position: fields verl's passes leave in its rows that the update does not
#: read (the old-log-prob pass's whole-sequence output, cut into ``old_log_probs``)
SEQUENCE_FILL: dict[str, float] = {"log_probs": 0.0}
#: fields whose value for a stored sample divrl cannot give, and what to change
REFUSED = {
    "routed_experts": "verl's router replay would replay zero-filled expert routes on the "
    "rehearsal rows (the store has none); set router_replay.mode=disabled for DPH-RL",
    "multi_modal_inputs": "the rehearsal rows are text-only samples of the store; DPH-RL "
    "in verl takes text-only batches",
    "teacher_ids": "distillation's teacher tokens have no value for a stored sample",
    "teacher_logprobs": "distillation's teacher log-probs have no value for a stored sample",
}
#: per-row tensors of verl's rows that are not per token (copied from the template row)
ROW_METADATA = ("dummy_tensor",)
#: the uid of every rehearsal row (they join after the advantages: no GRPO group sees them)
REHEARSAL_UID = "divrl_rehearsal"


@dataclass(frozen=True)
class JoinLayout:
    """How the joined batch is cut: the sizes verl's update must be given."""

    rows: int  # rows of the joined batch
    mini_batch_rows: int  # rows per mini-batch, all ranks (verl's ``mini_batch_size``)
    rollouts_per_cell: int  # rollout rows per (rank, mini-batch)
    references_per_cell: int  # rehearsal rows (padding included) per (rank, mini-batch)
    #: where each joined row comes from: ``i >= 0`` rollout row i, ``-(j + 1)`` sample j,
    #: None a zero-mask padding row
    order: tuple[int | None, ...] = ()

    @property
    def padding(self) -> int:
        """Zero-mask padding rows in the joined batch."""
        return sum(i is None for i in self.order)


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

    @property
    def drawn(self) -> int:
        """Samples drawn so far over all epochs (restored with the state)."""
        return self.sampler.epoch * self.sampler.size + self.sampler.position

    def state_dict(self) -> dict:
        """The draw order's position (saved in verl's checkpoint folder)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue a saved draw order (a ValueError when the store's size differs)."""
        self.sampler.load_state_dict(state)


def _cell_sizes(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` sizes differing by at most one, larger ones first."""
    return [total // parts + (k < total % parts) for k in range(parts)]


def plan_layout(
    rollout_lengths: Sequence[int],
    sample_lengths: Sequence[int],
    dp_size: int,
    mini_batches: int,
    micro_batch_size: int | None,
) -> JoinLayout:
    """The joined batch's layout for this step.

    Args:
        rollout_lengths: each rollout row's sequence length, in verl's order (rank chunks,
            then mini-batches, after verl's length balancing).
        sample_lengths: each drawn sample's sequence length, in draw order.
        dp_size, mini_batches: how verl's update cuts the batch this step.
        micro_batch_size: ``ppo_micro_batch_size_per_gpu`` (None: dynamic batch sizes);
            each cell is padded to a multiple of it.

    Raises:
        ValueError: the rollout rows do not split over the ranks and mini-batches (verl
            pads its batch so that they do).
    """
    rollouts, cells = len(rollout_lengths), dp_size * mini_batches
    if rollouts == 0 or rollouts % cells:
        raise ValueError(
            f"verl's update batch of {rollouts} rows does not split over {dp_size} "
            f"data-parallel ranks x {mini_batches} mini-batches"
        )
    per_roll = rollouts // cells
    per_mini = _cell_sizes(len(sample_lengths), mini_batches)
    slots = math.ceil(max(per_mini) / dp_size)
    while micro_batch_size is not None and (per_roll + slots) % micro_batch_size:
        slots += 1
    order: list[int | None] = []
    first = 0
    cell_samples: dict[tuple[int, int], list[int]] = {}
    for k, count in enumerate(per_mini):
        drawn = range(first, first + count)
        first += count
        load = [
            sum(rollout_lengths[(r * mini_batches + k) * per_roll + i] for i in range(per_roll))
            for r in range(dp_size)
        ]
        for r in range(dp_size):
            cell_samples[(r, k)] = []
        # the longest sample to the rank with the fewest tokens (and a free slot) so far
        for j in sorted(drawn, key=lambda j: (-sample_lengths[j], j)):
            free = [r for r in range(dp_size) if len(cell_samples[(r, k)]) < slots]
            r = min(free, key=lambda r: (load[r], r))
            cell_samples[(r, k)].append(j)
            load[r] += sample_lengths[j]
    for r in range(dp_size):
        for k in range(mini_batches):
            cell = r * mini_batches + k
            order += range(cell * per_roll, (cell + 1) * per_roll)
            mine = sorted(cell_samples[(r, k)])
            order += [-(j + 1) for j in mine] + [None] * (slots - len(mine))
    rows = len(order)
    return JoinLayout(rows, rows // mini_batches, per_roll, slots, tuple(order))


def padding_sample() -> ReferenceSample:
    """A one-token prompt and response, masked out: fills a cell's free rehearsal slots."""
    return ReferenceSample("divrl_padding", [0], [0], [0.0])


def _check_sample(sample: ReferenceSample) -> None:
    if len(sample.ref_log_probs) != len(sample.response_ids) or not sample.response_ids:
        raise ValueError(
            f"reference sample of prompt {sample.prompt_id!r}: {len(sample.response_ids)} "
            f"response tokens but {len(sample.ref_log_probs)} log-probs; presample again"
        )


def rehearsal_row(
    sample: ReferenceSample, template: Mapping[str, Any], padding: bool = False
) -> dict[str, Any]:
    """One rehearsal row with every field of ``template`` (a rollout row of the batch).

    Raises:
        ValueError: one line naming a field divrl cannot fill for a stored sample.
    """
    _check_sample(sample)
    prompt = torch.tensor(sample.prompt_ids, dtype=torch.int64)
    response = torch.tensor(sample.response_ids, dtype=torch.int64)
    seq = torch.cat([prompt, response])
    ones = torch.ones(len(response))
    stored = torch.tensor(sample.ref_log_probs, dtype=torch.float32)
    # positions 0..len-1, as when the stored log-probs were computed: u = 1 at step 0
    mask = torch.ones_like(seq)
    built: dict[str, Any] = {
        "prompts": prompt,
        "responses": response,
        "input_ids": seq,
        "attention_mask": mask,
        "position_ids": build_padding_position_ids(template.get("position_ids"), mask),
    }
    for key, fill in SEQUENCE_FILL.items():
        built[key] = torch.full((len(seq),), fill)
    for key, fill in RESPONSE_FILL.items():
        if fill == "mask":
            built[key] = ones * (0.0 if padding else 1.0)
        elif fill == "stored":
            built[key] = stored.clone()
        else:
            built[key] = ones * fill
    row: dict[str, Any] = {}
    for key, value in template.items():
        if key in built and not (torch.is_tensor(value) and value.dim() == 0):
            row[key] = built[key].to(value.dtype) if torch.is_tensor(value) else built[key]
        elif key in REFUSED and _carries_data(value):
            raise ValueError(f"the update batch carries {key!r}: {REFUSED[key]}")
        elif key not in ROW_METADATA and _per_token(value, template):
            raise ValueError(
                f"the update batch carries the per-token field {key!r}, which divrl's "
                "rehearsal join cannot fill for a stored sample; drop it from the batch or "
                "switch DPH-RL off"
            )
        else:  # per-row metadata: the template's, as verl's own padding rows
            row[key] = copy.deepcopy(value)
    if "uid" in row:
        row["uid"] = REHEARSAL_UID
    return row


def check_update_keys(keys) -> None:
    """A ValueError when verl's rows lack a key of its actor update (joined too early)."""
    missing = [k for k in UPDATE_KEYS if k not in set(keys)]
    if missing:
        raise ValueError(f"the update batch lacks {missing}; join after the advantages")


def _per_token(value: Any, template: Mapping[str, Any]) -> bool:
    """Whether a field of the template row runs along its tokens (prompt, response or
    whole sequence), so that the template's value cannot stand for a stored sample's."""
    if not torch.is_tensor(value) or value.dim() == 0:
        return False
    lengths = {len(template[k]) for k in ("prompts", "responses", "input_ids") if k in template}
    return value.shape[0] in lengths


def _carries_data(value: Any) -> bool:
    if value is None:
        return False
    if torch.is_tensor(value):
        return value.numel() > 0
    return bool(value)


def _row(batch: TensorDict, i: int) -> dict[str, Any]:
    row = batch[i]
    return {key: row[key] for key in batch.keys()}  # noqa: SIM118 (TensorDict keys)


def divrl_fields(
    rows: Sequence[Mapping[str, Any]],
    kinds: Sequence[bool],
    layout: JoinLayout,
    eta: float | None = None,
) -> list[dict[str, torch.Tensor]]:
    """divrl's keys of every joined row, in the joined order: whether it is a rehearsal row,
    its stored log-probs (0 on rollout rows), its mini-batch's stream statistics
    ``[rollout tokens, reference tokens, loss_mask tokens]`` (all ranks), and the step's
    eta from the rehearsal controller (``divrl_eta``; None: not written, the loss uses
    ``divrl.divergence_coef``)."""
    mini_batches = layout.rows // layout.mini_batch_rows
    cells_per_rank = mini_batches
    cell_rows = layout.rollouts_per_cell + layout.references_per_cell
    stream = torch.zeros(mini_batches, 3, dtype=torch.int64)
    minis = [(i // cell_rows) % cells_per_rank for i in range(len(rows))]
    for row, is_ref, k in zip(rows, kinds, minis, strict=True):
        stream[k, int(is_ref)] += int(row["response_mask"].sum())
        stream[k, 2] += int(row["loss_mask"].sum())
    out = []
    for row, is_ref, k in zip(rows, kinds, minis, strict=True):
        zeros = torch.zeros(row["response_mask"].shape, dtype=torch.float32)
        ref = row["old_log_probs"].float() if is_ref else zeros
        fields = {
            keys.IS_REFERENCE: torch.tensor(is_ref),
            keys.REF_LOG_PROB: ref.float(),
            keys.STREAM: stream[k],
        }
        if eta is not None:
            fields[keys.ETA] = torch.tensor(float(eta), dtype=torch.float64)
        out.append(fields)
    return out


def join_rehearsal(
    batch: TensorDict,
    samples: Sequence[ReferenceSample],
    *,
    dp_size: int = 1,
    mini_batches: int = 1,
    micro_batch_size: int | None = None,
    eta: float | None = None,
) -> tuple[TensorDict, JoinLayout]:
    """``batch`` with ``samples`` joined as rehearsal rows, laid out for verl's update.

    Args:
        batch: the update's rollout rows (nested layout; :data:`UPDATE_KEYS` at least).
        samples: the rehearsal samples of this step (``RehearsalSource.draw``).
        dp_size, mini_batches: how verl's update cuts the batch (ranks, optimiser steps).
        micro_batch_size: ``ppo_micro_batch_size_per_gpu`` with fixed micro-batches (None:
            dynamic batch sizes); every cell is padded to a multiple of it.
        eta: the step's eta from the rehearsal controller, written on every row as
            ``divrl_eta`` (None: the loss uses ``divrl.divergence_coef``).

    Returns:
        The joined TensorDict (every field of ``batch``, plus ``divrl_is_reference``,
        ``divrl_ref_log_prob``, ``divrl_stream``) and its :class:`JoinLayout`.
    """
    check_update_keys(batch.keys())
    lengths = batch["input_ids"].offsets().diff().tolist()
    layout = plan_layout(
        lengths,
        [len(s.prompt_ids) + len(s.response_ids) for s in samples],
        dp_size,
        mini_batches,
        micro_batch_size,
    )
    template = _row(batch, 0)
    rows, kinds = [], []
    for i in layout.order:
        if i is not None and i >= 0:
            rows.append(_row(batch, i))
        else:
            sample = padding_sample() if i is None else samples[-i - 1]
            rows.append(rehearsal_row(sample, template, padding=i is None))
        kinds.append(i is None or i < 0)
    for row, extra in zip(rows, divrl_fields(rows, kinds, layout, eta), strict=True):
        row.update(extra)
    return tu.list_of_dict_to_tensordict(rows), layout


def generation_suffix(tokenizer: Any) -> list[int]:
    """The tokens verl's chat template puts after the last user message of every prompt
    (the generation prompt, e.g. ``<|im_end|>\\n<|im_start|>assistant\\n``)."""
    marker = "divrl-template-probe"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True
    )
    head = text[: text.rindex(marker) + len(marker)]
    full = tokenizer(text, add_special_tokens=False)["input_ids"]
    start = tokenizer(head, add_special_tokens=False)["input_ids"]
    if full[: len(start)] != start:  # the tokens merge across the boundary: no check
        return []
    return full[len(start) :]


def check_store_prompts(
    samples: Sequence[ReferenceSample],
    *,
    max_prompt_length: int,
    max_response_length: int,
    max_token_len: int | None = None,
    suffix: Sequence[int] = (),
) -> None:
    """Stop at start-up, with one line naming the prompt, on a stored sample verl's own
    rows could never be: a prompt longer than ``data.max_prompt_length``, a response
    longer than ``data.max_response_length``, a sequence over the actor's per-GPU token
    budget (dynamic batch sizes: verl's ``seqlen_balancing`` asserts on it), or a prompt
    that does not end in the chat template's generation prompt (``suffix``: presampled
    without verl's chat template or with another one)."""
    suffix = list(suffix)
    for s in samples:
        name = f"the reference store's prompt {s.prompt_id!r}"
        if len(s.prompt_ids) > max_prompt_length:
            raise ValueError(
                f"{name} has {len(s.prompt_ids)} tokens, over data.max_prompt_length="
                f"{max_prompt_length}: raise it or presample with the run's prompt limit"
            )
        if len(s.response_ids) > max_response_length:
            raise ValueError(
                f"{name}: its response has {len(s.response_ids)} tokens, over "
                f"data.max_response_length={max_response_length}: raise it or presample "
                "with the run's response limit"
            )
        total = len(s.prompt_ids) + len(s.response_ids)
        if max_token_len is not None and total > max_token_len:
            raise ValueError(
                f"{name}: prompt + response are {total} tokens, over "
                f"actor.ppo_max_token_len_per_gpu={max_token_len}; raise it"
            )
        if suffix and list(s.prompt_ids[-len(suffix) :]) != suffix:
            raise ValueError(
                f"{name} does not end in the generation prompt of verl's chat template: "
                "presample with the model's chat template (the one verl applies)"
            )
