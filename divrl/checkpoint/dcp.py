"""The sharded checkpoint format (``torch.distributed.checkpoint``, DCP) and its export to
a Hugging Face folder: what ``divrl export`` and ``divrl eval`` read, below the trainer.

A sharded checkpoint is a directory laid out like today's DDP checkpoints
(``<run>/checkpoints/step_NNNNNN``)::

    step_000010/
      state/            DCP: .metadata + one *.distcp file per rank (model + optimiser)
      model/            config.json, generation_config.json, tokenizer files: no weights
      ...               whatever the caller's ``extra`` writes (trainer state, scheduler)

Each rank writes only its own shard; the directory is written under a temporary name and
renamed once complete, so a run killed while saving still has its previous checkpoint.
DCP stores every tensor with its global shape under its Hugging Face name, so a checkpoint
saved on N ranks loads on M ranks (resharding), into a sharded or a plain model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from divrl.runs import RunDir

__all__ = [
    "DCP_DIR",
    "MODEL_DIR",
    "ensure_hf_weights",
    "export_hf",
    "is_sharded_checkpoint",
    "load_dcp",
    "resolve_sharded_checkpoint",
    "save_dcp",
]

DCP_DIR = "state"
MODEL_DIR = "model"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_dcp(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    tokenizer=None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``path`` atomically: model (+ optimiser) shards with DCP, config and tokenizer.

    A collective: every rank calls it. Rank 0 prepares ``<parent>/.tmp_<name>``, every rank
    writes its shard into ``state/``, rank 0 writes ``model/`` (config, generation config,
    tokenizer: what :func:`export_hf` needs besides the weights), ``extra(tmp_dir)`` runs
    on every rank (write per-rank files under rank-specific names, shared ones on rank 0
    only), then rank 0 renames the directory to ``path`` (replacing an older one).

    Returns:
        ``path``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    final = Path(path)
    tmp = final.parent / f".tmp_{final.name}"
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    if optimizer is not None:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
    else:
        state = {"model": get_model_state_dict(model)}
    dcp.save(state, checkpoint_id=str(tmp / DCP_DIR), no_dist=not dist.is_initialized())
    if _rank() == 0:
        _save_model_files(model, tokenizer, tmp / MODEL_DIR)
    if extra is not None:
        extra(tmp)
    _barrier()
    if _rank() == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    _barrier()
    return final


def _save_model_files(model: nn.Module, tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = getattr(model, "config", None)
    if config is not None:
        config.save_pretrained(out)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)


def load_dcp(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """Load a checkpoint written by :func:`save_dcp` into ``model`` (+ optimiser).

    ``model`` may be sharded over any number of ranks or not sharded at all (a single
    process): DCP reads the slices each rank needs. A collective when distributed.
    ``path``: the checkpoint (``step_NNNNNN``) or its ``state/`` directory.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    state_dir = _state_dir(Path(path))
    if optimizer is not None:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(state_dir), no_dist=not dist.is_initialized())
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    else:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(state_dir), no_dist=not dist.is_initialized())
        set_model_state_dict(model, state["model"])


def _state_dir(path: Path) -> Path:
    if (path / ".metadata").is_file():
        return path
    if (path / DCP_DIR / ".metadata").is_file():
        return path / DCP_DIR
    raise FileNotFoundError(f"{path}: not a sharded checkpoint (no .metadata or state/.metadata)")


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a DCP checkpoint (``step_NNNNNN`` with ``state/.metadata``, or the
    DCP directory itself)."""
    path = Path(path)
    return (path / ".metadata").is_file() or (path / DCP_DIR / ".metadata").is_file()


def resolve_sharded_checkpoint(path: str | Path) -> Path:
    """The sharded checkpoint that ``path`` names: itself, or a run directory's newest one.

    Accepts a DCP ``state/`` directory, a checkpoint ``step_NNNNNN``, or a run directory
    (its ``checkpoints/step_*``, newest first, the first that is sharded).
    """
    path = Path(path)
    if is_sharded_checkpoint(path):
        return path
    steps = [ckpt.path for ckpt in reversed(RunDir(path).checkpoints())]
    for step in steps:
        if is_sharded_checkpoint(step):
            return step
    found = f"{len(steps)} checkpoint(s), none sharded" if steps else "no checkpoints/step_*"
    raise FileNotFoundError(
        f"{path}: not a sharded checkpoint nor a run directory with one ({found}). "
        "DDP checkpoints already hold a Hugging Face folder: use <checkpoint>/model directly."
    )


def export_hf(
    source: str | Path,
    out_dir: str | Path,
    *,
    config_path: str | Path | None = None,
    dtype: str | None = None,
) -> Path:
    """Write a Hugging Face ``save_pretrained`` folder (safetensors) from a sharded checkpoint.

    Runs in one process, without a process group: the model is built on the meta device
    from the saved config, and DCP reads every tensor (all ranks' shards, the optimiser
    state left on disk) into one plain state dict, so the peak memory is one full model.

    Args:
        source: run directory, checkpoint ``step_NNNNNN`` or DCP directory
            (:func:`resolve_sharded_checkpoint`).
        out_dir: the folder to write (created).
        config_path: where the config and tokenizer come from; default the checkpoint's
            ``model/`` folder (needed when ``source`` is a bare DCP directory).
        dtype: ``float32``/``bfloat16``/``float16``; default the config's ``torch_dtype``.

    Returns:
        ``out_dir``.
    """
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    ckpt = resolve_sharded_checkpoint(source)
    state_dir = _state_dir(ckpt)
    config_dir = Path(config_path) if config_path else state_dir.parent / MODEL_DIR
    if not (config_dir / "config.json").is_file() and config_path is None:
        raise FileNotFoundError(
            f"{config_dir}: no config.json; pass the model's config folder (config_path / "
            "--config) when exporting a bare DCP directory"
        )
    config = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    target = dtype or _config_dtype(config)
    saved = dcp.FileSystemReader(str(state_dir)).read_metadata().state_dict_metadata
    state = {}
    for key in model.state_dict():
        meta = saved.get(f"model.{key}")
        if meta is None:
            raise KeyError(f"{state_dir}: no tensor model.{key}; is it this model's checkpoint?")
        state[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    dcp.load({"model": state}, checkpoint_id=str(state_dir), no_dist=True)
    model.load_state_dict({k: v.to(getattr(torch, target)) for k, v in state.items()}, assign=True)
    model.tie_weights()
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    with contextlib.suppress(OSError, ValueError):  # a config folder without a tokenizer
        AutoTokenizer.from_pretrained(config_dir).save_pretrained(out)
    return out


def ensure_hf_weights(checkpoint: str | Path) -> bool:
    """Complete a sharded checkpoint's ``model/`` folder (config and tokenizer, written at
    save time) with its weights, once, so that ``from_pretrained`` reads it like a DDP
    checkpoint's. Returns whether ``checkpoint`` is sharded (nothing done otherwise)."""
    checkpoint = Path(checkpoint)
    if not (checkpoint / DCP_DIR / ".metadata").is_file():
        return False
    model_dir = checkpoint / MODEL_DIR
    if not any(model_dir.glob("*.safetensors")):
        export_hf(checkpoint, model_dir)
    return True


def _config_dtype(config) -> str:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    return str(dtype) if dtype else "float32"
