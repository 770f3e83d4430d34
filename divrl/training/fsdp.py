"""Sharded data parallelism with PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

Under ``strategy="fsdp"`` each decoder layer and the model's root become one FSDP unit:
parameters, gradients and optimiser state are split across the ranks (each holds ~1/N),
and a unit's full parameters exist only while its forward/backward runs (all-gather before,
free after). This module holds the building blocks, independent of the trainer:

- :class:`FSDPConfig`: the settings (``train.*`` of the trainer's config, which extends it;
  defined in :mod:`divrl.training.sharding_config`, free of torch);
- :func:`apply_fsdp`: shard a Hugging Face causal LM in place;
- :func:`full_parameters`: a context manager for ``generate()`` with the full weights;
- :func:`gathered_copy`: the alternative (an unsharded copy per rank), kept for measurement;
- :func:`iter_full_parameters`: ``(name, full tensor)`` one parameter at a time, for
  vLLM's ``load_weights``.

Checkpoints (``torch.distributed.checkpoint``) live in :mod:`divrl.checkpoint`.

Why ``unshard()`` for rollouts rather than a gathered copy: measured at 26M parameters
on 2 CPU ranks (docs/benchmarks.md), both peak at one full float32 model above the shard
(108 vs 106 MiB); ``unshard()`` needs no second model object, works for any model class and
gathers in ``param_dtype`` (bf16 under mixed precision). Once every unit is unsharded,
``generate(..., synced_gpus=False)`` issues no collective at all, so ranks may generate
different lengths.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn

from divrl.training.sharding_config import FSDPConfig

__all__ = [
    "FSDPConfig",
    "apply_fsdp",
    "decoder_layers",
    "fsdp_modules",
    "full_parameters",
    "gathered_copy",
    "is_fsdp",
    "iter_full_parameters",
    "strip_wrapper_prefixes",
]

# Prefixes that wrappers add to parameter names; Hugging Face / vLLM names have none.
# (FSDP2 adds none itself: fully_shard swaps the module's class in place.)
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.", "module.")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a Hugging Face model.

    Found by the classes the model names in ``_no_split_modules`` (``LlamaDecoderLayer``,
    ``Qwen2DecoderLayer``...: the same rule accelerate's FSDP auto-wrap uses), else the
    first ``nn.ModuleList`` under ``model.model.layers`` / ``transformer.h`` /
    ``gpt_neox.layers``.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        module: nn.Module | None = model
        for part in path.split("."):
            module = getattr(module, part, None)
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            return list(module)
    raise ValueError(
        f"{type(model).__name__}: no decoder layers found (no _no_split_modules and no "
        "model.layers / transformer.h); pass layers= to apply_fsdp"
    )


def apply_fsdp(
    model: nn.Module,
    config: FSDPConfig,
    *,
    mesh=None,
    layers: list[nn.Module] | None = None,
) -> nn.Module:
    """Shard ``model`` in place with FSDP2: every decoder layer, then the root.

    The root unit owns what is outside the layers (embeddings, final norm, ``lm_head``),
    so tied ``lm_head``/``embed_tokens`` weights stay one parameter in one unit (sharding
    them in two units would all-gather and reduce the same tensor twice). Call it after
    ``gradient_checkpointing_enable()`` or before, both work, and before building the
    optimiser (whose state then is sharded too).

    Args:
        model: a causal LM on its device (CPU for gloo).
        config: the settings; ``strategy`` must be ``"fsdp"``.
        mesh: a 1-D ``DeviceMesh``; default: every rank of the default process group.
        layers: the modules to shard as units; default :func:`decoder_layers`.

    Returns:
        ``model`` itself (its class now also an ``FSDPModule``).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if config.strategy != "fsdp":
        raise ValueError(f"apply_fsdp needs strategy='fsdp', got {config.strategy!r}")
    kwargs: dict = {"mesh": mesh}
    if config.param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=getattr(torch, config.param_dtype), reduce_dtype=torch.float32
        )
    if config.fsdp_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for layer in layers if layers is not None else decoder_layers(model):
        fully_shard(layer, reshard_after_forward=config.fsdp_reshard_after_forward, **kwargs)
    # The root's parameters are needed first by the backward anyway: FSDP keeps them.
    fully_shard(model, **kwargs)
    return model


def is_fsdp(model: nn.Module) -> bool:
    """Whether ``model`` was sharded with FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """Every FSDP unit under (and including) ``model``."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def full_parameters(model: nn.Module) -> Iterator[nn.Module]:
    """Make ``model``'s full parameters live for the body (``generate()`` for rollouts).

    Every unit is all-gathered once on entry (a collective: all ranks must enter), and
    resharding after each forward is switched off, so the forward passes need no further
    communication. Pass ``synced_gpus=False`` to ``generate()``: transformers sees an FSDP
    module and would otherwise keep all ranks stepping together (an all-reduce per token,
    dummy forwards on finished ranks); with it, ranks generate different lengths
    independently (tested). On exit the full
    parameters are freed and each unit's ``reshard_after_forward`` restored. A model that
    is not sharded is yielded unchanged.
    """
    units = fsdp_modules(model)
    if not units:
        yield model
        return
    saved = [_reshard_after_forward(u) for u in units]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield model
    finally:
        for unit, flag in zip(units, saved, strict=True):
            unit.reshard()
            unit.set_reshard_after_forward(flag, recurse=False)


def _reshard_after_forward(unit: nn.Module) -> bool:
    groups = unit._get_fsdp_state()._fsdp_param_groups
    return bool(groups and groups[0]._reshard_after_forward)


@contextlib.contextmanager
def gathered_copy(model: nn.Module, *, dtype: torch.dtype | None = None) -> Iterator[nn.Module]:
    """An unsharded copy of ``model`` on every rank, freed on exit (for ``generate()``).

    The alternative to :func:`full_parameters` (both measured by ``benchmarks/fsdp.py``):
    a plain instance of the model's class is built on the meta device and filled from
    :func:`iter_full_parameters`, one gathered parameter at a time, cast to ``dtype``
    (default: the parameters' own dtype, e.g. the float32 masters). A collective on entry.
    """
    if not is_fsdp(model):
        yield model
        return
    with torch.device("meta"):
        clone = _meta_clone(model)
    state = dict(iter_full_parameters(model, dtype=dtype, with_buffers=False))
    clone.load_state_dict(state, strict=False, assign=True)
    del state
    for name, buffer in model.named_buffers():  # persistent and not (rotary inv_freq)
        parent, _, leaf = name.rpartition(".")
        clone.get_submodule(parent)._buffers[leaf] = buffer
    if getattr(clone.config, "tie_word_embeddings", False):
        clone.tie_weights()
    missing = [n for n, p in clone.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"gathered_copy: parameters not filled: {missing[:5]}")
    try:
        yield clone.eval()
    finally:
        del clone


def _meta_clone(model: nn.Module) -> nn.Module:
    """A plain (not FSDP) instance of ``model``'s Hugging Face class, on the meta device."""
    from torch.distributed.fsdp import FSDPModule

    plain_cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    clone = plain_cls(copy.deepcopy(model.config))
    if getattr(model, "generation_config", None) is not None:
        clone.generation_config = copy.deepcopy(model.generation_config)
    return clone


def strip_wrapper_prefixes(name: str) -> str:
    """``"_orig_mod.model.layers.0..."`` -> ``"model.layers.0..."`` (Hugging Face names)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


@torch.no_grad()
def iter_full_parameters(
    model: nn.Module, *, dtype: torch.dtype | None = None, with_buffers: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for each parameter, gathered from the shards one at a time.

    A collective: every rank must consume the whole iterator in the same order. At most
    one full parameter (cast to ``dtype`` if given) exists at a time besides the shards,
    as long as the consumer does not keep it (vLLM's ``load_weights`` copies it into its
    own weights). Names are the Hugging Face ones (no wrapper prefixes); a tied parameter
    is yielded under each of its names (``lm_head.weight`` and
    ``model.embed_tokens.weight``), gathered once. With ``with_buffers``, persistent
    buffers follow, so the names are exactly those of ``model.state_dict()``.
    """
    from torch.distributed.tensor import DTensor

    aliases: dict[int, list[str]] = {}
    params: dict[int, nn.Parameter] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(strip_wrapper_prefixes(name))
        params.setdefault(id(param), param)
    for key, param in params.items():
        tensor = _full_tensor(param) if isinstance(param, DTensor) else param.detach()
        if dtype is not None:
            tensor = tensor.to(dtype)
        for name in aliases[key]:
            yield name, tensor
        del tensor
    if with_buffers:
        for name, buffer in _persistent_buffers(model):
            cast = dtype is not None and buffer.is_floating_point()
            yield strip_wrapper_prefixes(name), buffer.to(dtype) if cast else buffer


def _full_tensor(param) -> torch.Tensor:
    """All-gather a sharded parameter; a CPU-offloaded shard first goes to the mesh's device
    (NCCL cannot gather host tensors)."""
    from torch.distributed.tensor import DTensor

    mesh = param.device_mesh
    local = param.to_local()
    if local.device.type != mesh.device_type:
        param = DTensor.from_local(
            local.to(mesh.device_type),
            mesh,
            param.placements,
            run_check=False,
            shape=param.shape,
            stride=param.stride(),
        )
    return param.full_tensor()


def _persistent_buffers(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for module_name, module in model.named_modules():
        skip = getattr(module, "_non_persistent_buffers_set", set())
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and name not in skip:
                yield (f"{module_name}.{name}" if module_name else name), buffer
