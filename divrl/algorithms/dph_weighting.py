"""How DPH-RL weighs the rollout stream against the reference stream within one step.

A DPH step accumulates gradients over micro-batches of two kinds: ``rollout`` micro-batches
(exploration rollouts, clipped policy loss) and ``reference`` micro-batches (stored samples
of the initial policy, divergence loss). Each micro-batch's loss is aggregated over its own
tokens (``l_i``, e.g. a token-mean); the step loss is ``sum_i w_i * l_i``.
:func:`micro_batch_weights` returns the ``w_i`` of three weightings:

- ``paper``: ``L_pg + eta * L_f`` with each term aggregated over its own whole stream:
  ``w_i = n_i / N_rollout`` (rollout), ``eta * n_i / N_reference`` (reference) for
  token-mean (``n_i`` = tokens, or sequences for ``micro-batch-token-mean``, of micro-batch
  i); ``1 / M_kind`` (times eta) otherwise.
- ``authors``: the balance the DPH-RL authors' actor ends up with, as ``paper`` with eta
  replaced by :func:`authors_effective_eta` of the run's :class:`AuthorsLayout`:
  ``eta * (R - R_policy) / N`` (N rollouts and R reference samples per step; R_policy of
  the reference samples land in micro-batches the authors' actor types as rollouts and
  train with the policy loss instead). Every authors' sample weighs the same (1 / mini-batch
  rows: each micro-batch's token-mean is divided by the accumulation count, or multiplied
  by its share of the mini-batch's samples under dynamic batch sizes), so the divergence
  stream's weight against the rollout stream is the ratio of the counts. The scripts' runs
  (2,048 rollouts + 256 reference samples on 8 GPUs): eta / 8 = 0.125 eta with fixed
  micro-batches of 2 (forward KL), 160 / 2,048 = 0.078 eta with dynamic batch sizes (JS,
  alpha; up to 96 reference samples go through the policy loss); on 16 GPUs 0.125 and
  224 / 2,048 = 0.109 eta. Per optimiser step the authors' weights differ
  (:func:`authors_step_etas`).
- ``concat``: one token-mean over the tokens of both streams, reference tokens times eta:
  ``w_i = n_i / (N_rollout + N_reference)`` (times eta on reference). Token-mean only.

:func:`stream_weights` sums them per stream; its ``effective_eta`` (reference weight over
rollout weight) is the eta that ``paper`` would need for the same balance, the number logged
as ``dph/effective_eta``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ROLLOUT = "rollout"
REFERENCE = "reference"
KINDS = (ROLLOUT, REFERENCE)
DIVERGENCE_WEIGHTINGS = ("authors", "paper", "concat")


@dataclass(frozen=True)
class StreamWeights:
    """Total weight of each stream in a step and their ratio.

    ``effective_eta = reference / rollout``: the eta of the ``paper`` weighting that gives the
    same balance between the two streams (0 when either stream is empty).
    """

    rollout: float
    reference: float
    effective_eta: float


@dataclass(frozen=True)
class AuthorsLayout:
    """How the DPH-RL authors' trainer lays out one step's rows: the settings the
    ``authors`` weighting is computed from (the authors' values, not divrl's).

    Their trainer appends the step's ``references`` rows after its ``rollouts`` rows, cuts
    the whole into ``gpus`` contiguous equal chunks, each chunk into mini-batches of
    ``rollouts / (mini_batches * gpus)`` rows, and each mini-batch into micro-batches
    (``micro_batch_size`` rows, or token-balanced partitions when ``dynamic``); a
    micro-batch is typed by its first row.

    Attributes:
        rollouts: rollout rows per step (prompts x samples per prompt).
        references: reference rows appended per step.
        mini_batches: optimiser steps the rollouts alone would take per step.
        gpus: the authors' GPU count (their scripts: 8).
        micro_batch_size: rows per fixed micro-batch on each GPU (their scripts: 2).
        dynamic: verl's dynamic batch sizes (on in the JS and alpha scripts).
    """

    rollouts: int
    references: int
    mini_batches: int
    gpus: int = 8
    micro_batch_size: int = 2
    dynamic: bool = False

    def __post_init__(self) -> None:
        for name in ("rollouts", "mini_batches", "gpus", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.references < 0:
            raise ValueError(f"references must be >= 0, got {self.references}")

    @property
    def even(self) -> bool:
        """Whether the authors' trainer could split these sizes (it refuses uneven ones):
        rows divisible by the GPUs, rollouts by mini-batches x GPUs. Uneven sizes are cut
        here as ``torch.chunk`` cuts (chunks of the rounded-up size, the last shorter)."""
        total = self.rollouts + self.references
        return total % self.gpus == 0 and self.rollouts % (self.mini_batches * self.gpus) == 0

    @property
    def rows_per_gpu(self) -> int:
        return -(-(self.rollouts + self.references) // self.gpus)

    @property
    def mini_batch_rows(self) -> int:
        """Rows per mini-batch on each GPU."""
        return -(-self.rollouts // (self.mini_batches * self.gpus))


def references_under_policy_loss(layout: AuthorsLayout) -> int:
    """Reference rows the authors' actor trains with the clipped policy loss (advantage
    about +1) instead of the divergence: those in a micro-batch whose first row is a rollout.

    Only the one mini-batch that holds the last rollouts and the first reference rows mixes
    the kinds. Fixed micro-batches mix at most one micro-batch there. Under dynamic batch
    sizes each of that mini-batch's token-balanced micro-batches lists its rows in index
    order and starts with a rollout as long as it holds one, which the Karmarkar-Karp
    partition gives when the rollouts there outnumber the micro-batches (32 rollouts
    against a handful of micro-batches at the scripts' scale): every reference row of that
    mini-batch is counted (an upper bound when some micro-batch holds no rollout).
    """
    per_gpu, m = layout.rows_per_gpu, layout.mini_batch_rows
    gpu_start = (layout.rollouts // per_gpu) * per_gpu
    chunk = min(per_gpu, layout.rollouts + layout.references - gpu_start)
    offset = layout.rollouts - gpu_start  # the first reference row's place in its chunk
    rollouts_here = offset % m  # rollouts in the mixed mini-batch
    if layout.references == 0 or rollouts_here == 0:
        return 0
    start = offset - rollouts_here
    references_here = min(m, chunk - start) - rollouts_here
    if layout.dynamic:
        return references_here
    tail = rollouts_here % layout.micro_batch_size
    return 0 if tail == 0 else min(references_here, layout.micro_batch_size - tail)


def authors_effective_eta(eta: float, layout: AuthorsLayout) -> float:
    """The divergence stream's weight against the rollout stream in the authors' runs:
    ``eta * (references - references_under_policy_loss) / rollouts`` (counting samples,
    which weigh the same in their actor when lengths are equal). The scripts' layouts:
    ``eta / 8`` (forward_kl.sh: fixed micro-batches of 2), ``eta * 160 / 2048 = 0.078 eta``
    (js_kl.sh, alpha.sh: dynamic batch sizes); against everything that goes through the
    policy loss (the 96 reference samples included) the latter is 160 / 2,144 = 0.075."""
    kept = layout.references - references_under_policy_loss(layout)
    return float(eta) * kept / layout.rollouts


def authors_step_etas(eta: float, layout: AuthorsLayout) -> list[float]:
    """The divergence weight against the rollout stream in each of the authors' optimiser
    steps of one batch: ``eta x (reference rows trained with the divergence) / (rollout
    rows)`` of that step, all GPUs together (0 for a step without rollouts).

    The rows are laid out as their trainer does (rollouts, then reference rows, contiguous
    chunks per GPU, mini-batches in order; see :class:`AuthorsLayout`). Fixed micro-batches
    are typed by their first row; under dynamic batch sizes every micro-batch of a
    mini-batch that holds a rollout is counted as rollout-typed (the bound
    :func:`references_under_policy_loss` takes). The scripts' step on 8 GPUs (2,048
    rollouts, 256 reference rows, 2 mini-batches): ``[96/928, 128/896, 32/224] x eta`` =
    0.103, 0.143, 0.143 eta with fixed micro-batches of 2, ``[0, 0.143, 0.143] x eta`` with
    dynamic batch sizes; divrl's default assembly gives its two steps the batch's mean
    weight (:func:`authors_effective_eta`) each.
    """
    total = layout.rollouts + layout.references
    per_gpu, m = layout.rows_per_gpu, layout.mini_batch_rows
    rollouts: list[int] = []
    divergence: list[int] = []
    for start in range(0, total, per_gpu):
        gpu = range(start, min(start + per_gpu, total))
        for k, first in enumerate(range(gpu.start, gpu.stop, m)):
            rows = range(first, min(first + m, gpu.stop))
            if k == len(rollouts):
                rollouts.append(0)
                divergence.append(0)
            n_roll = sum(1 for r in rows if r < layout.rollouts)
            rollouts[k] += n_roll
            if layout.dynamic:
                divergence[k] += 0 if n_roll else len(rows)
                continue
            size = layout.micro_batch_size
            for p in range(rows.start, rows.stop, size):
                if p >= layout.rollouts:  # typed by its first row: a reference one
                    divergence[k] += min(size, rows.stop - p)
    return [float(eta) * d / r if r else 0.0 for d, r in zip(divergence, rollouts, strict=True)]


def _check(kinds: Sequence[str], token_counts: Sequence[int], eta: float, mode: str) -> None:
    if mode not in DIVERGENCE_WEIGHTINGS:
        raise ValueError(
            f"unknown divergence weighting {mode!r}; valid: {', '.join(DIVERGENCE_WEIGHTINGS)}"
        )
    if len(kinds) != len(token_counts):
        raise ValueError(f"{len(kinds)} kinds but {len(token_counts)} token counts")
    bad = sorted({k for k in kinds if k not in KINDS})
    if bad:
        raise ValueError(f"micro-batch kinds must be {ROLLOUT!r} or {REFERENCE!r}, got {bad}")
    if any(n < 0 for n in token_counts):
        raise ValueError(f"token counts must be >= 0, got {list(token_counts)}")
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")


def micro_batch_weights(
    kinds: Sequence[str],
    token_counts: Sequence[int],
    eta: float,
    mode: str = "authors",
    token_mean: bool = True,
    layout: AuthorsLayout | None = None,
) -> list[float]:
    """Per-micro-batch loss weights ``w_i`` of one step (see the module docstring).

    Args:
        kinds: ``"rollout"`` or ``"reference"`` per micro-batch, all micro-batches of the step
            (all processes together when the step is data-parallel).
        token_counts: valid (response) tokens per micro-batch.
        eta: the divergence coefficient.
        mode: ``authors``, ``paper`` or ``concat``.
        token_mean: whether ``token_counts`` split a stream (``paper``, ``authors``: the
            counts are tokens for token-mean, sequences for micro-batch-token-mean; False:
            every micro-batch of a stream weighs the same); ``concat`` requires it.
        layout: the authors' layout, required by ``authors`` (the eta it gives is
            :func:`authors_effective_eta`).

    Returns:
        ``w_i`` per micro-batch, in order; multiply micro-batch i's aggregated loss by it.
        A micro-batch with no valid token gets weight 0 under the token-based weightings.

    Raises:
        ValueError: unknown mode or kind, mismatched lengths, negative counts or eta, or
            ``concat`` without token-mean, ``authors`` without a layout.
    """
    _check(kinds, token_counts, eta, mode)
    if mode == "authors":
        if layout is None:
            raise ValueError("the authors weighting is computed from their layout: pass layout")
        eta = authors_effective_eta(eta, layout)
    scale = {ROLLOUT: 1.0, REFERENCE: float(eta)}
    if mode == "concat":
        if not token_mean:
            raise ValueError("the concat weighting is one token-mean over both streams")
        total = sum(token_counts)
        # scale * (n / total): the trainer's historical rounding, kept bitwise
        return [
            scale[k] * (n / total) if total else 0.0
            for k, n in zip(kinds, token_counts, strict=True)
        ]
    per_kind_tokens = {
        k: sum(n for kk, n in zip(kinds, token_counts, strict=True) if kk == k) for k in KINDS
    }
    per_kind_batches = {k: sum(1 for kk in kinds if kk == k) for k in KINDS}
    weights = []
    for k, n in zip(kinds, token_counts, strict=True):
        if token_mean:
            denom = per_kind_tokens[k]
            weights.append(scale[k] * (n / denom) if denom else 0.0)
        else:
            weights.append(scale[k] / per_kind_batches[k])
    return weights


def stream_weights(
    kinds: Sequence[str],
    token_counts: Sequence[int],
    eta: float,
    mode: str = "authors",
    token_mean: bool = True,
    layout: AuthorsLayout | None = None,
) -> StreamWeights:
    """The total weight of each stream under ``mode`` and the ``effective_eta`` it implies.

    Worked example (one reference micro-batch per 8 rollout ones, eta = 0.2, equal token
    counts): ``paper`` gives rollout 1, reference 0.2, effective eta 0.2; ``concat`` gives
    8/9, 0.2/9, 0.025 (the token share); ``authors`` with the forward-KL script's layout
    gives 1, 0.025, 0.025.
    """
    weights = micro_batch_weights(kinds, token_counts, eta, mode, token_mean, layout)
    rollout = sum(w for k, w in zip(kinds, weights, strict=True) if k == ROLLOUT)
    reference = sum(w for k, w in zip(kinds, weights, strict=True) if k == REFERENCE)
    has_both = ROLLOUT in kinds and REFERENCE in kinds and rollout > 0
    return StreamWeights(rollout, reference, reference / rollout if has_both else 0.0)
