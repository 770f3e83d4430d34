"""How DPH-RL weighs the rollout stream against the reference stream within one step.

A DPH step accumulates gradients over micro-batches of two kinds: ``rollout`` micro-batches
(exploration rollouts, clipped policy loss) and ``reference`` micro-batches (stored samples
of the initial policy, divergence loss). Each micro-batch's loss is aggregated over its own
tokens (``l_i``, e.g. a token-mean); the step loss is ``sum_i w_i * l_i``.
:func:`micro_batch_weights` returns the ``w_i`` of three weightings:

- ``authors`` (the DPH-RL authors' actor): every micro-batch holds one kind and is
  token-meaned on its own; the step loss is the mean over ALL micro-batches of both kinds,
  reference ones times eta: ``w_i = 1/M`` (rollout), ``eta/M`` (reference), ``M`` = number
  of micro-batches. The reference stream's weight is thus eta times its share of
  micro-batches (about 1/9 at one reference sample per 8 rollouts), and the eta values in the
  paper and the authors' scripts were tuned under it.
- ``paper``: ``L_pg + eta * L_f`` with each term aggregated over its own whole stream:
  ``w_i = n_i / N_rollout`` (rollout), ``eta * n_i / N_reference`` (reference) for
  token-mean (``n_i`` = tokens of micro-batch i); ``1 / M_kind`` (times eta) otherwise.
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
) -> list[float]:
    """Per-micro-batch loss weights ``w_i`` of one step (see the module docstring).

    Args:
        kinds: ``"rollout"`` or ``"reference"`` per micro-batch, all micro-batches of the step
            (all processes together when the step is data-parallel).
        token_counts: valid (response) tokens per micro-batch.
        eta: the divergence coefficient.
        mode: ``authors``, ``paper`` or ``concat``.
        token_mean: whether each micro-batch loss is a token-mean (the ``paper`` weighting
            splits a stream by tokens then, by micro-batches otherwise; ``concat`` requires
            it; ``authors`` does not depend on it).

    Returns:
        ``w_i`` per micro-batch, in order; multiply micro-batch i's aggregated loss by it.
        A micro-batch with no valid token gets weight 0 under the token-based weightings.

    Raises:
        ValueError: unknown mode or kind, mismatched lengths, negative counts or eta, or
            ``concat`` without token-mean.
    """
    _check(kinds, token_counts, eta, mode)
    scale = {ROLLOUT: 1.0, REFERENCE: float(eta)}
    if mode == "authors":
        total = len(kinds)
        return [scale[k] / total for k in kinds]
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
) -> StreamWeights:
    """The total weight of each stream under ``mode`` and the ``effective_eta`` it implies.

    Worked example (one reference micro-batch per 8 rollout ones, eta = 0.2, equal token
    counts): ``authors`` gives rollout 8/9, reference 0.2/9, effective eta 0.2/8 = 0.025;
    ``paper`` gives 1, 0.2, 0.2; ``concat`` gives 8/9, 0.2/9, 0.025 (the token share).
    """
    weights = micro_batch_weights(kinds, token_counts, eta, mode, token_mean)
    rollout = sum(w for k, w in zip(kinds, weights, strict=True) if k == ROLLOUT)
    reference = sum(w for k, w in zip(kinds, weights, strict=True) if k == REFERENCE)
    has_both = ROLLOUT in kinds and REFERENCE in kinds and rollout > 0
    return StreamWeights(rollout, reference, reference / rollout if has_both else 0.0)
