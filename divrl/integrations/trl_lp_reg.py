"""Lp-Reg inside TRL: the min-p proxy from the hidden states of a forward TRL already runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch

from divrl.algorithms import logit_stats

# Batch keys the adapter adds (off-policy Lp-Reg): TRL splits and shuffles them with the rest.
PROXY_KEY, LOG_Z_KEY = "divrl_proxy_log_probs", "divrl_proxy_log_z"
# Largest mean |log p| gap between the adapter's LM-head projection and TRL's log-probs
# before the proxy is declared inconsistent (bf16 autocast noise is far below this; a
# logit scale or soft-cap the adapter does not apply is far above).
PROXY_CONSISTENCY_TOL = 0.05
# Logits (positions x vocabulary) the proxy projects through the LM head at once: 2**25,
# 128 MiB in fp32 (220 positions at a 151,936 vocabulary). A chunk's four fp32 buffers then
# fit in one fp32 tile of TRL's own fused LM head (4,096 positions x 32,768 entries), which
# runs after the proxy in the same forward (peaks: benchmarks/trl_lp_reg_memory.py).
PROXY_CHUNK_LOGITS = 2**25


def proxy_chunk_positions(vocab: int) -> int:
    """Positions per LM-head projection of the proxy: :data:`PROXY_CHUNK_LOGITS` logits."""
    return max(1, PROXY_CHUNK_LOGITS // vocab)


# --------------------------------------------------------------------------- helpers


@dataclass
class HiddenCapture:
    """What one wrapped ``_get_per_token_logps_and_entropies`` call records."""

    want_proxy: bool
    only_model: torch.nn.Module | None = None  # record only a call on this model
    log_probs: torch.Tensor | None = None  # [B, K], with grad when the forward had it
    proxy: torch.Tensor | None = None  # [B, K] log proxy(token), detached
    log_z: torch.Tensor | None = None  # [B, K] log Z of the proxy, detached
    entropies: torch.Tensor | None = None  # [B, K] TRL's per-token entropies (when computed)
    done: bool = False
    error: BaseException | None = None  # raised by the caller, on every rank


@contextmanager
def hidden_state_hook(
    backbone: torch.nn.Module, logits_to_keep: int, on_hidden: Callable[[torch.Tensor], None]
) -> Iterator:
    """Pass the detached hidden states that predict the last ``logits_to_keep`` tokens of
    each forward of ``backbone`` (one per chunk of rows TRL runs) to ``on_hidden``, as
    they come: nothing here keeps them."""

    def hook(module, args, output):
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None:
            hidden = output[0]
        on_hidden(hidden[:, -(logits_to_keep + 1) : -1].detach())

    handle = backbone.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def proxy_from_hidden(
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    kappa: float,
    temperature: float,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Proxy log-prob, ``log Z`` and plain log-prob of ``tokens`` from ``hidden`` ``[B, K, H]``.

    The LM head runs under ``autocast()`` (the trainer passes the one TRL's forward runs
    under, so the logits match TRL's), on ``chunk`` positions at a time (``None``:
    :func:`proxy_chunk_positions` of the head's vocabulary), so the ``[B, K, vocab]``
    logits never exist at once; the three values come from one pass over each chunk
    (:func:`divrl.algorithms.logit_stats`). Returns three ``[B, K]`` fp32 tensors.
    """
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = tokens.reshape(-1)
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    # chunk None: one position first, whose logits give the vocabulary, then the budget's
    start, step = 0, chunk or 1
    while start < flat_h.shape[0]:
        with autocast():
            logits = lm_head(flat_h[start : start + step])
        toks = flat_t[start : start + logits.shape[0]]
        stats = logit_stats(logits, toks, temperature, with_entropy=False, minp_kappa=kappa)
        parts.append((stats.proxy_log_prob, stats.log_normalizer, stats.log_prob))
        start += logits.shape[0]
        step = chunk or proxy_chunk_positions(logits.shape[-1])
        del logits, stats
    return tuple(torch.cat(p).view(tokens.shape) for p in zip(*parts, strict=True))  # type: ignore[return-value]


def unwrapped_causal_lm(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    unwrapped = accelerator.unwrap_model(model)
    get_base = getattr(unwrapped, "get_base_model", None)  # PEFT
    return get_base() if callable(get_base) else unwrapped


SHARDED_HEAD_MESSAGE = (
    "lp_reg through TRL needs the full LM head outside the model's forward, but the policy "
    "is sharded ({how}): the head's weight there is a shard, and the proxy would be wrong. "
    "Run the TRL adapter with DDP, DeepSpeed ZeRO-1/2/3 or FSDP2 (fsdp_version=2), or use "
    "`divrl train` with train.strategy=fsdp, whose Lp-Reg proxy comes from the model's own "
    "forward"
)


def refuse_sharded_training(accelerator) -> None:
    """Raise when accelerate shards the parameters in a way the proxy cannot read the head
    through: FSDP1 (flattened parameters). FSDP2 (``fsdp_version=2``) and DeepSpeed ZeRO-3
    are taken: :func:`lm_head_projection` reads or gathers the whole head."""
    from accelerate.utils import DistributedType

    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    if (
        accelerator.distributed_type == DistributedType.FSDP
        and getattr(fsdp, "fsdp_version", 1) != 2
    ):
        raise ValueError(SHARDED_HEAD_MESSAGE.format(how="accelerate FSDP1: set fsdp_version=2"))


@contextmanager
def lm_head_projection(lm: torch.nn.Module) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """``hidden -> logits`` through ``lm``'s whole LM head, for the hook on the backbone.

    Inside the model's forward FSDP2 has gathered the root's parameters (the head among
    them, when it is not a ``fully_shard`` unit of its own), so the head is whole there;
    a head still sharded as an FSDP2 ``DTensor`` is gathered (``full_tensor``) for the
    projection and dropped after it. A DeepSpeed ZeRO-3 head is read as it is where ZeRO-3
    holds it whole when the hook runs, and otherwise gathered for the projection and
    partitioned again after it (:func:`zero3_gathered`). Both gathers are collectives; they
    match across ranks because the hook fires once per backbone forward and every rank runs
    the same number of forwards (FSDP2 and ZeRO-3 gather each layer's parameters in each
    of them, so ranks that differed would already wait on each other there).
    FSDP1 flattened views are refused (:func:`full_lm_head`).
    """
    from torch.distributed.tensor import DTensor

    head = lm.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    if isinstance(weight, DTensor):
        full = weight.full_tensor()
        full_bias = bias.full_tensor() if isinstance(bias, DTensor) else bias
        yield lambda hidden: torch.nn.functional.linear(hidden, full, full_bias)
        return
    with zero3_gathered(weight, bias):
        yield full_lm_head(lm)


def zero3_gathered(*params: torch.Tensor | None) -> AbstractContextManager:
    """The DeepSpeed ZeRO-3 parameters among ``params`` whole for the context; a null
    context when none is a ZeRO-3 parameter, so deepspeed is imported only where it already
    runs the model.

    A partitioned parameter (outside any forward that uses it) is gathered with
    ``deepspeed.zero.GatheredParameters``, an all-gather every rank must enter, and
    partitioned again after the context. One ZeRO-3 holds whole (inside the model's forward,
    where the hook runs) is read as it is: partitioning it on exit would take it from under
    the module ZeRO-3 gathered it for. A parameter's status is the same on every rank (ZeRO-3
    fetches and releases in the same module order on all of them), so the ranks gather
    together. One still in flight (prefetched) is refused rather than read half-gathered.
    """
    zero3 = list({id(p): p for p in params if p is not None and hasattr(p, "ds_id")}.values())
    if not zero3:
        return nullcontext()
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    if any(p.ds_status == ZeroParamStatus.INFLIGHT for p in zero3):
        raise RuntimeError(
            "lp_reg: the ZeRO-3 LM head is still being prefetched when the backbone's forward "
            "ends; set stage3_prefetch_bucket_size to 0 in the DeepSpeed config"
        )
    missing = [p for p in zero3 if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
    if not missing:
        return nullcontext()
    return deepspeed.zero.GatheredParameters(missing, modifier_rank=None)


def full_lm_head(lm: torch.nn.Module) -> torch.nn.Module:
    """``lm``'s output embeddings, checked to hold the whole weight (not an FSDP2 DTensor
    shard, an FSDP1 flattened view or a ZeRO-3 placeholder that is not gathered)."""
    from torch.distributed.tensor import DTensor

    head = lm.get_output_embeddings()
    weight = head.weight
    if isinstance(weight, DTensor):
        raise ValueError(SHARDED_HEAD_MESSAGE.format(how="FSDP2 DTensor"))
    vocab = getattr(lm.config.get_text_config(), "vocab_size", None)
    placeholder = hasattr(weight, "ds_id") and weight.numel() != getattr(weight, "ds_numel", -1)
    if weight.dim() != 2 or weight.numel() == 0 or placeholder:
        raise ValueError(SHARDED_HEAD_MESSAGE.format(how=f"head weight {tuple(weight.shape)}"))
    if vocab is not None and weight.shape[0] < vocab:
        raise ValueError(SHARDED_HEAD_MESSAGE.format(how=f"head weight {tuple(weight.shape)}"))
    return head
