"""The model and the rollout engine that ``divrl eval`` samples with.

A model argument may be a model folder, a checkpoint or a run directory
(:func:`resolve_model_path`); the engine is any registered one (:func:`make_engine`), and
only what it needs is loaded (:func:`load_for_engine`: no transformers model for an engine
that loads its own copy, such as vLLM).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

from divrl.checkpoint.verl_checkpoint import find_verl_checkpoint, verl_model_dir
from divrl.evaluation.pinning import pin_newest_model
from divrl.runs import Checkpoint, RunDir

__all__ = [
    "engine_options_with_batch",
    "load_for_engine",
    "load_model",
    "make_engine",
    "model_checkpoint",
    "model_context",
    "resolve_model_path",
]

logger = logging.getLogger(__name__)
# (run directory, checkpoint) pairs already named in the log
_ANNOUNCED: set[tuple[str, str]] = set()


def resolve_model_path(path: str | Path) -> str:
    """A ``from_pretrained`` directory for ``path``.

    Accepts a model directory, a checkpoint (``step_N/`` holding ``model/``), or a training
    run directory (its newest ``checkpoints/step_*/model``, pinned so that pruning cannot
    remove it while it loads: :mod:`divrl.evaluation.pinning`); anything else is passed on
    as is (a hub name). A run or checkpoint trained with ``train.strategy=fsdp`` has a
    ``model/`` without weights: they are exported into it once, from the sharded state.
    A verl checkpoint (its top folder: the newest step; a ``global_step_N`` folder or its
    ``actor/``) gives its ``huggingface/`` folder, or its FSDP shards merged once
    (:mod:`divrl.checkpoint.verl_checkpoint`).
    """
    p = Path(path)
    verl = find_verl_checkpoint(p)
    if verl is not None:
        folder = verl_model_dir(verl)
        if (str(p), str(folder)) not in _ANNOUNCED:
            _ANNOUNCED.add((str(p), str(folder)))
            logger.info("%s is a verl checkpoint: evaluating step %d (%s)", p, verl.step, folder)
        return str(folder)
    _export_sharded_weights(p)
    if (p / "config.json").is_file():
        return str(p)
    if Checkpoint.at(p).has_model():
        return str(Checkpoint.at(p).model_dir)
    # a running training may prune the checkpoint while it loads: load a pinned copy
    pinned = pin_newest_model(p) if p.is_dir() else None
    if pinned is not None:
        # resolved again per eval set and for eval_config.json: named once per checkpoint
        if (str(p), str(pinned[1].path)) not in _ANNOUNCED:
            _ANNOUNCED.add((str(p), str(pinned[1].path)))
            logger.info("%s is a run directory: evaluating its checkpoint %s", p, pinned[1].path)
        return str(pinned[0])
    if p.exists():
        raise FileNotFoundError(
            f"{p} is neither a model directory (config.json), a checkpoint (model/) nor a "
            "run directory (checkpoints/step_*/model)"
        )
    return str(path)


def model_checkpoint(path: str | Path | None) -> dict[str, Any] | None:
    """What an evaluation records about a verl checkpoint ``path`` names (its step, its
    ``actor/`` folder and where the weights came from); None for any other model."""
    verl = None if path is None else find_verl_checkpoint(path)
    return None if verl is None else verl.provenance(Path(resolve_model_path(path)))


def _export_sharded_weights(path: Path) -> None:
    """Write the weights of a sharded (fsdp) checkpoint into its ``model/`` folder, if
    ``path`` is such a checkpoint or a run whose newest checkpoint is one."""
    from divrl.checkpoint.dcp import ensure_hf_weights

    if not path.is_dir() or ensure_hf_weights(path):
        return
    latest = RunDir(path).latest()
    if latest is not None:
        ensure_hf_weights(latest.path)


def load_model(path: str | Path):
    """(model in eval mode, tokenizer) for a model directory, checkpoint or run directory.

    Raises:
        ModelSourceError: neither a local folder nor a loadable hub id (one sentence, fast).
    """
    from divrl.rollout.model_source import check_model_source

    resolved = check_model_source(resolve_model_path(path))  # before importing transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolved)
    model = AutoModelForCausalLM.from_pretrained(resolved, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def load_for_engine(path: str | Path, engine: str) -> tuple[Any, Any, int | None]:
    """(model or None, tokenizer, context length) for sampling with ``engine``.

    An engine that loads its own copy of the model (``vllm``) gets no transformers model
    here, only the tokenizer and the context length from ``config.json``.
    """
    from divrl.rollout import get_engine

    if get_engine(engine).uses_model:
        model, tokenizer = load_model(path)
        return model, tokenizer, model_context(model)
    from divrl.rollout.model_source import check_model_source

    resolved = check_model_source(resolve_model_path(path))
    from transformers import AutoConfig, AutoTokenizer

    context = getattr(AutoConfig.from_pretrained(resolved), "max_position_embeddings", None)
    return None, AutoTokenizer.from_pretrained(resolved), context


def model_context(model: Any) -> int | None:
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def make_engine(
    cfg: Any,
    model: Any,
    tokenizer: Any,
    model_path: str | Path | None = None,
    context_length: int | None = None,
):
    """The rollout engine ``cfg.engine`` (with ``cfg.engine_options``; ``cfg`` an
    :class:`~divrl.evaluation.runner.EvalConfig`) for sampling.

    ``model``: the transformers model for engines that generate with it (``hf``);
    ``model_path``: the folder engines that load their own copy read (``vllm``, which also
    gets ``context_length`` as its ``max_model_len`` and the checkpoint's dtype).
    """
    from divrl.rollout import EngineContext, build_engine

    if model_path is None:
        model_path = getattr(model, "name_or_path", None) or ""
    context = EngineContext(
        model_path=str(model_path),
        model=model,
        tokenizer=tokenizer,
        dtype="auto",
        seed=cfg.seed,
        max_model_len=context_length or model_context(model),
    )
    return build_engine(cfg.engine, context, cfg.engine_options)


def engine_options_with_batch(
    engine: str, raw: dict[str, Any] | None, batch_size: int
) -> dict[str, Any]:
    """Every option of ``engine`` with its value; ``batch_size`` fills the engine's own
    ``batch_size`` when it has one and it is not given (so the hf engine batches as before)."""
    from divrl.rollout import EngineError, engine_options, get_engine

    try:
        raw = dict(raw or {})
        if "batch_size" in {f.name for f in fields(get_engine(engine).options)}:
            raw.setdefault("batch_size", batch_size)
        return asdict(engine_options(engine, raw))
    except EngineError as exc:
        raise ValueError(str(exc)) from exc
