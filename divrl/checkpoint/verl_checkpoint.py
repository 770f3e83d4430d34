"""A verl checkpoint read as a Hugging Face model folder, for ``divrl eval``.

verl (0.9.1) saves, under its ``trainer.default_local_dir``::

    latest_checkpointed_iteration.txt        the newest step, N
    global_step_N/actor/
        model_world_size_W_rank_R.pt         each FSDP rank's shard (DTensors, FSDP2)
        fsdp_config.json                     {"FSDP_version": 2, "world_size": W}
        huggingface/                         config and tokenizer; the full weights only
                                             when actor.checkpoint.save_contents
                                             has hf_model

:func:`find_verl_checkpoint` accepts the top folder (its newest step), a ``global_step_N``
folder or its ``actor/``. :func:`verl_model_dir` gives the folder to load: ``huggingface/``
when it holds weights, else the shards merged here, with plain torch (no verl, no process
group), into ``actor/divrl_hf/`` once (a later call reuses it while the shards are
unchanged). The merge follows verl's own ``verl.model_merger`` fsdp backend: each DTensor's
local pieces concatenated along its ``Shard`` dimension in rank order (a ``Replicate``
placement, and a plain tensor, taken from rank 0, after checking the ranks agree), on a
``("fsdp",)`` or ``("ddp", "fsdp")`` mesh; each merged tensor's shape is checked against the
DTensor's global shape. Unlike verl's merger, which writes bfloat16, the weights are written
in the dtype of the checkpoint's ``config.json`` (the dtype the model was loaded in, as
``divrl export`` does). What cannot be merged that way (a Megatron checkpoint, LoRA
adapters, tensor parallelism, a missing shard) stops with one line naming verl's merger
command and the ``actor_rollout_ref.actor.checkpoint.save_contents`` setting that makes it
unnecessary.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MERGED_DIR",
    "VerlCheckpoint",
    "VerlCheckpointError",
    "find_verl_checkpoint",
    "merge_fsdp_shards",
    "verl_model_dir",
]

#: verl's tracker file at the top of its checkpoint folder
TRACKER = "latest_checkpointed_iteration.txt"
#: the folder (in ``actor/``) the merged weights are written to
MERGED_DIR = "divrl_hf"
#: what the merged folder records about the shards it was merged from
MERGED_RECORD = "divrl_merged_from.json"
_STEP = re.compile(r"global_step_(\d+)")
_SHARD = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")
_WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")


class VerlCheckpointError(FileNotFoundError):
    """A verl checkpoint whose model weights divrl cannot read (the message says what to
    run). A ``FileNotFoundError``: the command line reports it in one line, exit code 2."""


@dataclass(frozen=True)
class VerlCheckpoint:
    """One step of a verl checkpoint folder."""

    step: int
    #: ``global_step_N/actor``
    actor_dir: Path

    @property
    def hf_dir(self) -> Path:
        """verl's ``huggingface/`` folder (config and tokenizer, weights with hf_model)."""
        return self.actor_dir / "huggingface"

    def provenance(self, weights: Path) -> dict[str, Any]:
        """What an evaluation records about the checkpoint it read ``weights`` from."""
        merged = weights.name == MERGED_DIR
        return {
            "format": "verl",
            "step": self.step,
            "actor_dir": str(self.actor_dir),
            "weights": "merged from verl's FSDP shards" if merged else "verl's huggingface/",
        }


def find_verl_checkpoint(path: str | Path) -> VerlCheckpoint | None:
    """The verl checkpoint ``path`` names, or None when it is not one.

    ``path``: verl's ``default_local_dir`` (with ``latest_checkpointed_iteration.txt``: its
    newest step), a ``global_step_N`` folder (with ``actor/``) or that ``actor/`` folder.

    Raises:
        VerlCheckpointError: the tracker file names a step whose folder is missing.
    """
    p = Path(path)
    if not p.is_dir():
        return None
    if (p / TRACKER).is_file():
        text = (p / TRACKER).read_text().strip()
        if not text.isdigit():
            raise VerlCheckpointError(f"{p / TRACKER} holds {text!r}, not a step number")
        step_dir = p / f"global_step_{int(text)}"
        if not (step_dir / "actor").is_dir():
            raise VerlCheckpointError(
                f"{p / TRACKER} names step {int(text)} but {step_dir / 'actor'} does not "
                "exist; pass one global_step_N folder of this checkpoint instead"
            )
        return VerlCheckpoint(int(text), step_dir / "actor")
    match = _STEP.fullmatch(p.name)
    if match and (p / "actor").is_dir():
        return VerlCheckpoint(int(match.group(1)), p / "actor")
    match = _STEP.fullmatch(p.parent.name)
    if p.name == "actor" and match:
        return VerlCheckpoint(int(match.group(1)), p)
    return None


def _has_weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(
        any(folder.glob(pattern)) for pattern in _WEIGHTS
    )


def merger_hint(ckpt: VerlCheckpoint, backend: str = "fsdp") -> str:
    """verl's command that writes the Hugging Face folder, and the setting that saves it."""
    return (
        f"merge it with verl's merger (`python -m verl.model_merger merge --backend {backend} "
        f"--local_dir {ckpt.actor_dir} --target_dir {ckpt.actor_dir.parent / 'hf_model'}`) "
        "and pass --model that target folder, or train with "
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model] "
        "so that huggingface/ holds the weights"
    )


def verl_model_dir(ckpt: VerlCheckpoint) -> Path:
    """A ``from_pretrained`` folder with ``ckpt``'s weights (see the module docstring).

    Raises:
        VerlCheckpointError: no weights in ``huggingface/`` and the shards cannot be merged
            here (the message names verl's merger command).
    """
    for folder in (ckpt.hf_dir, ckpt.actor_dir / "model" / "huggingface"):
        if _has_weights(folder):
            return folder
    shards = _shard_files(ckpt)
    merged = ckpt.actor_dir / MERGED_DIR
    record = _shards_record(shards)
    if _has_weights(merged) and _read_record(merged) == record:
        return merged
    if not (ckpt.hf_dir / "config.json").is_file():
        raise VerlCheckpointError(
            f"{ckpt.hf_dir} has no config.json (verl writes it with every checkpoint); "
            + merger_hint(ckpt)
        )
    state = merge_fsdp_shards(ckpt, shards)
    tmp = merged.with_name(f".{MERGED_DIR}.tmp-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        _save_merged(ckpt, state, tmp)
        (tmp / MERGED_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        if merged.exists() and _read_record(merged) != record:
            shutil.rmtree(merged, ignore_errors=True)  # divrl's own earlier merge, stale
        try:
            tmp.rename(merged)
        except OSError:
            # another evaluation merged the same shards meanwhile (and may be reading
            # them): its folder is this merge
            if not (_has_weights(merged) and _read_record(merged) == record):
                raise
    except PermissionError as exc:
        raise VerlCheckpointError(
            f"{ckpt.actor_dir} is not writable ({exc.strerror}), so its shards cannot be "
            "merged there; " + merger_hint(ckpt)
        ) from exc
    finally:  # nothing half-written is left beside verl's files
        shutil.rmtree(tmp, ignore_errors=True)
    return merged


def _shard_files(ckpt: VerlCheckpoint) -> list[Path]:
    """Every rank's model shard, in rank order."""
    found = {}
    for f in ckpt.actor_dir.glob("model_world_size_*_rank_*.pt"):
        match = _SHARD.fullmatch(f.name)
        if match:
            found.setdefault(int(match.group(1)), {})[int(match.group(2))] = f
    if not found:
        backend = "megatron" if any(ckpt.actor_dir.glob("*dist_ckpt*")) else "fsdp"
        raise VerlCheckpointError(
            f"{ckpt.actor_dir} holds neither Hugging Face weights (huggingface/) nor FSDP "
            "shards (model_world_size_W_rank_R.pt); " + merger_hint(ckpt, backend)
        )
    if len(found) > 1:
        raise VerlCheckpointError(
            f"{ckpt.actor_dir} holds shards of several world sizes ({sorted(found)}); "
            + merger_hint(ckpt)
        )
    [(world, ranks)] = found.items()
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        raise VerlCheckpointError(
            f"{ckpt.actor_dir}: the shards of ranks {missing} of {world} are missing; "
            + merger_hint(ckpt)
        )
    return [ranks[r] for r in range(world)]


def _shards_record(shards: list[Path]) -> list[list[Any]]:
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in shards]


def _read_record(folder: Path) -> Any:
    try:
        return json.loads((folder / MERGED_RECORD).read_text())
    except (OSError, ValueError):
        return None


def merge_fsdp_shards(ckpt: VerlCheckpoint, shards: list[Path] | None = None) -> dict:
    """The full state dict of ``ckpt``'s FSDP shards (plain tensors, the shards' dtype).

    Raises:
        VerlCheckpointError: a layout verl's fsdp merger does not take either (a mesh other
            than ``("fsdp",)`` / ``("ddp", "fsdp")``, a ``Partial`` placement, LoRA-only
            shards), or a merged shape that is not the saved global shape.
    """
    import torch
    from torch.distributed.tensor import DTensor

    shards = shards or _shard_files(ckpt)
    states = [torch.load(f, map_location="cpu", weights_only=False) for f in shards]
    if any("lora_" in key for key in states[0]):
        raise VerlCheckpointError(f"{ckpt.actor_dir} holds LoRA adapters; " + merger_hint(ckpt))
    merged = {}
    for key, first in states[0].items():
        pieces = [state[key] for state in states]
        if isinstance(first, DTensor):
            merged[key] = _merge_dtensor(ckpt, key, pieces)
            continue
        for rank, piece in enumerate(pieces[1:], start=1):
            if piece.shape != first.shape or not torch.equal(piece, first):
                raise VerlCheckpointError(
                    f"{shards[rank]}: {key} differs from rank 0's, and it is not sharded; "
                    + merger_hint(ckpt)
                )
        merged[key] = first
    return merged


def _merge_dtensor(ckpt: VerlCheckpoint, key: str, pieces: list) -> Any:
    """One DTensor's global tensor from every rank's piece (verl's fsdp merger's rule)."""
    import torch

    mesh = pieces[0].device_mesh
    names = tuple(mesh.mesh_dim_names or ())
    placements = tuple(pieces[0].placements)
    if names == ("ddp", "fsdp"):  # the first replica's ranks, along the sharded dimension
        ranks = [int(r) for r in mesh.mesh[0].tolist()]
        placements = placements[1:]
    elif names == ("fsdp",):
        ranks = [int(r) for r in mesh.mesh.tolist()]
    else:
        raise VerlCheckpointError(
            f"{ckpt.actor_dir}: {key} is sharded over a {names} device mesh, which only "
            "verl's merger reads; " + merger_hint(ckpt)
        )
    (placement,) = placements
    local = [pieces[r]._local_tensor for r in ranks]
    if placement.is_replicate():
        tensor = local[0]
    elif placement.is_shard():
        tensor = torch.cat(local, dim=placement.dim).contiguous()
    else:
        raise VerlCheckpointError(
            f"{ckpt.actor_dir}: {key} has placement {placement}; " + merger_hint(ckpt)
        )
    if tuple(tensor.shape) != tuple(pieces[0].shape):
        raise VerlCheckpointError(
            f"{ckpt.actor_dir}: {key}'s shards join to {tuple(tensor.shape)}, not its saved "
            f"shape {tuple(pieces[0].shape)}; " + merger_hint(ckpt)
        )
    return tensor


def _save_merged(ckpt: VerlCheckpoint, state: dict, out: Path) -> None:
    """``save_pretrained`` of the model in ``huggingface/``'s config with ``state``, in the
    config's dtype, with verl's tokenizer files beside it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(ckpt.hf_dir)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32"
    dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = set(model.state_dict())
    unexpected = sorted(set(state) - expected)
    missing = sorted(expected - set(state) - _tied_keys(model))
    if unexpected or missing:
        raise VerlCheckpointError(
            f"{ckpt.actor_dir}: the shards do not fit huggingface/config.json "
            f"(unexpected {unexpected[:3]}, missing {missing[:3]}); " + merger_hint(ckpt)
        )
    state = {k: v.to(dtype) for k, v in state.items() if k in expected}
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    for f in ckpt.hf_dir.iterdir():  # tokenizer, chat template, generation config
        if f.is_file() and not (out / f.name).exists():
            shutil.copy2(f, out / f.name)


def _tied_keys(model: Any) -> set[str]:
    """The parameter names that alias another (tied embeddings): a state dict may omit them."""
    first: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied.add(name)
        else:
            first[id(param)] = name
    return tied
