"""Lp-Reg's min-p proxy from verl's logits, in token chunks (torch only, no verl import).

verl's engines hand the logits-processor hook the logits of a whole micro-batch,
``[tokens, vocab]`` in the engine's dtype (bf16 under FSDP's mixed precision, fp32 in a
fp32 run), already divided by the sampling temperature. At a 151,936-token vocabulary and
30,720 tokens per GPU one fp32 copy of that tensor is ~18.7 GB, so the proxy never makes
one: the rows are walked in chunks, each chunk cast to fp32 once and then worked on in
place, so the only ``[., vocab]`` buffers alive are one fp32 chunk and one boolean mask of
the same rows (5 bytes per logit of the chunk).

Per row, with ``s`` the tempered logits and ``T`` the temperature (the filter is on the
untempered probabilities, as in divrl's trainer and the authors' code):

- kept tokens: ``p_v >= kappa * max p``  <=>  ``s_v - max s >= log(kappa) / T``;
- ``log Z = log sum_{kept} exp(s_v - max s) - log sum_v exp(s_v - max s)``;
- proxy log-prob of the label ``y``: ``s_y - lse(s) - log Z`` when ``y`` is kept, else
  :data:`divrl.algorithms.logits.FILTERED_LOG_PROB`.

These equal :func:`divrl.algorithms.logit_stats`'s ``proxy_log_prob`` and
``log_normalizer`` on the untempered logits (``tests_verl/test_lp_reg_memory.py``).
"""

from __future__ import annotations

import math

import torch

from divrl.algorithms.logits import FILTERED_LOG_PROB
from divrl.integrations.verl.settings import MEGATRON_REFUSAL

#: fp32 bytes worked on per logit of a chunk: the fp32 chunk and its boolean keep mask
CHUNK_BYTES_PER_LOGIT = 5
#: a chunk's buffers take at most this share of the logits tensor's own memory
CHUNK_SHARE = 1 / 32


def auto_chunk_rows(rows: int, element_size: int) -> int:
    """Rows per chunk so that a chunk's fp32 buffers are at most :data:`CHUNK_SHARE` of the
    logits' own bytes (``rows x vocab x element_size``), at least one row.

    The vocabulary cancels out: the share only depends on how many rows there are.
    """
    return max(1, math.floor(rows * element_size * CHUNK_SHARE / CHUNK_BYTES_PER_LOGIT))


@torch.no_grad()
def minp_proxy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    kappa: float,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(proxy_log_prob, log_z)`` per row, each ``[rows]`` fp32, detached.

    Args:
        logits: ``[rows, vocab]`` tempered logits (``logits_raw / temperature``), any float
            dtype; never copied whole.
        labels: ``[rows]`` the token each row predicts.
        kappa: the min-p ratio, in [0, 1].
        temperature: the temperature the logits were divided by (> 0).
        chunk_rows: rows per chunk; None picks :func:`auto_chunk_rows`.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be [rows, vocab] and labels [rows], got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if not 0.0 <= kappa <= 1.0:
        raise ValueError(f"kappa must be in [0, 1] (the paper uses 0.02), got {kappa}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rows = logits.shape[0]
    if chunk_rows is None:
        chunk_rows = auto_chunk_rows(rows, logits.element_size())
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    threshold = math.log(kappa) / temperature if kappa > 0 else -math.inf
    proxy = torch.empty(rows, dtype=torch.float32, device=logits.device)
    log_z = torch.empty(rows, dtype=torch.float32, device=logits.device)
    labels = labels.to(logits.device).long()
    for start in range(0, rows, chunk_rows):
        end = min(start + chunk_rows, rows)
        proxy[start:end], log_z[start:end] = _chunk(logits[start:end], labels[start:end], threshold)
    return proxy, log_z


def _chunk(
    rows: torch.Tensor, labels: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk with a single fp32 buffer (shifted, exponentiated and masked in place), in
    the order of :func:`divrl.algorithms.logit_stats`'s arithmetic, so the two agree."""
    x = rows.to(torch.float32, copy=True)
    top = x.amax(-1, keepdim=True)
    label_logit = x.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    cut = top + threshold
    keep = x >= cut
    e = x.sub_(top).exp_()
    sum_e = e.sum(-1)
    lp = label_logit - (top.squeeze(-1) + torch.log(sum_e))
    log_z = torch.log(e.mul_(keep).sum(-1)) - torch.log(sum_e)
    kept = label_logit >= cut.squeeze(-1)
    return torch.where(kept, lp - log_z, torch.full_like(lp, FILTERED_LOG_PROB)), log_z


# ---------------------------------------------------------------- verl's logits layouts


def next_token_labels(
    logits: torch.Tensor, input_ids: torch.Tensor, data_format: str | None
) -> torch.Tensor:
    """The token each logits position predicts, shaped ``logits.shape[:-1]``.

    ``input_ids`` is verl's nested (jagged) ``[batch, length]`` micro-batch. Layouts:

    - FSDP (``data_format=None``) and Megatron ``"thd"`` (tensor and context parallel size
      1): the sequences packed end to end, ``[1, positions (+ padding)]``, labels the packed
      ids shifted by one (verl's ``input_ids_rmpad_rolled``);
    - Megatron ``"bshd"``: ``[batch, padded length]``, each row's ids padded with 0 and
      shifted by one (verl's ``preprocess_bshd_engine(need_roll=True)``).
    """
    lead = logits.shape[:-1]
    if data_format == "bshd":
        if len(lead) != 2 or lead[0] != input_ids.shape[0]:
            raise ValueError(
                f"bshd logits {tuple(logits.shape)} do not match a micro-batch of "
                f"{input_ids.shape[0]} sequences"
            )
        padded = torch.nested.to_padded_tensor(input_ids, 0, output_size=(lead[0], lead[1]))
        return torch.roll(padded, -1, dims=1).to(logits.device)
    if data_format not in (None, "thd"):
        raise ValueError(f"unknown data_format {data_format!r}: verl's are 'thd' and 'bshd'")
    flat = input_ids.values() if input_ids.is_nested else input_ids.reshape(-1)
    positions = logits.numel() // logits.shape[-1]
    if positions < flat.shape[0] or (len(lead) == 2 and lead[0] != 1):
        raise ValueError(
            f"packed logits {tuple(logits.shape)} hold fewer positions than the micro-batch's "
            f"{flat.shape[0]} tokens"
        )
    labels = torch.roll(flat, -1)
    labels = torch.nn.functional.pad(labels, (0, positions - flat.shape[0]))
    return labels.reshape(lead).to(logits.device)


def check_megatron_layout(actor_config) -> None:
    """At startup: refuse the min-p proxy (Lp-Reg) on a Megatron actor split over the vocabulary (TP > 1) or
    the sequence (CP > 1), with one line naming the keys. Other strategies pass."""
    if getattr(actor_config, "strategy", None) != "megatron":
        return
    megatron = actor_config.megatron
    tp = int(getattr(megatron, "tensor_model_parallel_size", 1) or 1)
    cp = int(getattr(megatron, "context_parallel_size", 1) or 1)
    if tp > 1 or cp > 1:
        raise ValueError(MEGATRON_REFUSAL.format(proxy="the min-p proxy", tp=tp, cp=cp))


def check_megatron_parallel() -> None:
    """In Megatron's logits-processor call: the same refusal from the live process groups
    (in case the config check was bypassed)."""
    from megatron.core import parallel_state as mpu

    tp = mpu.get_tensor_model_parallel_world_size()
    cp = mpu.get_context_parallel_world_size()
    if tp > 1 or cp > 1:
        raise ValueError(MEGATRON_REFUSAL.format(proxy="the min-p proxy", tp=tp, cp=cp))
