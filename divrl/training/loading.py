"""Stage 0 of training: the model, tokenizer, prompts, optimiser and rollout engine.

Everything here reads the config and builds objects; nothing runs a step. The paths must
be resolved already (``model.path`` and ``data.train_path`` set): the command layer fills
them with the toy world when they are null (``divrl.commands.train.with_toy_defaults``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from divrl.data.prompts import PromptItem, load_prompts
from divrl.rollout import RolloutEngine, SamplingParams, pad_token_id
from divrl.training.config import Config

__all__ = [
    "PolicyModels",
    "build_optimizer",
    "load_models",
    "load_policy",
    "make_engine",
    "pad_token_id",
    "require_paths",
    "rollout_params",
    "run_prompts",
    "run_provenance",
    "shard_model",
    "warn_if_prompts_repeat",
    "warn_if_references_repeat",
]

logger = logging.getLogger(__name__)


def require_paths(config: Config) -> tuple[str, str, str | None]:
    """(model path, train data path, db dir) of a config whose paths are set."""
    if config.model.path is None or config.data.train_path is None:
        raise ValueError(
            "model.path and data.train_path must be set (the `divrl train` and "
            "`divrl presample` commands fill them with the toy world when they are null)"
        )
    return str(config.model.path), str(config.data.train_path), config.data.db_dir


def load_policy(config: Config, model_path: str) -> tuple[torch.nn.Module, Any]:
    """The policy model (train mode) and its tokenizer.

    Raises:
        ModelSourceError: ``model_path`` is neither a local folder nor a hub id that can be
            loaded (not cached and no network): one sentence, in well under a second,
            instead of the hub's retries and a long ``OSError``.
    """
    from divrl.rollout.model_source import check_model_source

    check_model_source(model_path)  # before importing transformers (seconds)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_path, trust_remote_code=config.model.trust_remote_code
    )
    model = AutoModelForCausalLM.from_pretrained(
        model_path,
        dtype=getattr(torch, config.model.dtype),
        trust_remote_code=config.model.trust_remote_code,
    )
    if config.model.gradient_checkpointing:
        # FSDP2 needs the non-reentrant variant (its hooks must see the recomputation);
        # DDP keeps transformers' default.
        kwargs = {"use_reentrant": False} if config.train.strategy == "fsdp" else None
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model, tokenizer


def shard_model(config: Config, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``train.strategy=fsdp`` on several processes: FSDP2 ``fully_shard`` on ``model``
    (moved to ``device`` first) with the ``train.param_dtype`` / ``fsdp_*`` settings.

    Call after gradient checkpointing is enabled and before the optimiser is built (its
    state is then sharded too). The result must not go through accelerate's ``prepare``
    (which would wrap it in DDP): FSDP reduces the gradients itself.
    """
    from divrl.training.fsdp import FSDPConfig, apply_fsdp

    t = config.train
    fsdp = FSDPConfig(
        strategy=t.strategy,
        param_dtype=t.param_dtype,
        fsdp_offload=t.fsdp_offload,
        fsdp_reshard_after_forward=t.fsdp_reshard_after_forward,
    )
    return apply_fsdp(model.to(device), fsdp)


def run_prompts(
    config: Config,
    train_path: str,
    db_dir: str | None,
    tokenizer: Any,
    model: torch.nn.Module | None = None,
) -> tuple[list[PromptItem], int]:
    """:func:`divrl.data.prompts.load_prompts` with the run's ``data.*`` settings; with
    ``model``, prompts that fill its context (``config.max_position_embeddings``) are
    refused when they are loaded."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return load_prompts(
        train_path,
        tokenizer,
        config.data,
        db_dir=db_dir,
        max_new_tokens=config.rollout.max_new_tokens,
        context=context if isinstance(context, int) and context > 0 else None,
    )


def run_provenance(config: Config, prompts: list[PromptItem], store: Any = None) -> dict[str, Any]:
    """:func:`divrl.provenance.provenance` of a run or store: the hash of the config as
    ``config.yaml`` holds it, the fingerprint of the kept, tokenised prompts (after the
    template, the limit and the truncation; with a DPH-RL reference ``store``, the
    fingerprint of all of them its manifest records, which the run checked against its
    own, since ``prompts`` are then the exploration prompts only) and the engine."""
    import yaml

    from divrl.data.fingerprint import prompts_fingerprint
    from divrl.provenance import provenance
    from divrl.training.config import dump_config

    stored = (store.manifest.get("fingerprint") or {}) if store is not None else {}
    return provenance(
        config=yaml.safe_load(dump_config(config)),
        data=stored.get("prompts") or prompts_fingerprint([(p.id, p.prompt_ids) for p in prompts]),
        engine=config.rollout.engine,
        data_path=config.data.train_path,
        prompts=stored.get("prompt_count") or len(prompts),
    )


def warn_if_prompts_repeat(config: Config, n_prompts: int, what: str = "training prompts") -> None:
    """Warn when one batch draws more prompts than there are (each batch then repeats some)."""
    if config.train.prompts_per_step > n_prompts:
        logger.warning(
            "train.prompts_per_step=%d is larger than the %d %s: every batch repeats "
            "prompts (more rollouts of the same prompts, not more data); lower "
            "train.prompts_per_step or add data",
            config.train.prompts_per_step,
            n_prompts,
            what,
        )


def warn_if_references_repeat(config: Config, n_samples: int) -> None:
    """Warn when one step draws more rehearsal rows than the store holds: each step then
    trains on some reference samples several times (the rows cycle through the store)."""
    per_step = config.reference.per_step
    if per_step > n_samples:
        logger.warning(
            "reference.per_step=%d is larger than the %d samples in the reference store %s: "
            "every step repeats each sample about %.1f times; lower reference.per_step, or "
            "presample more prompts (or reference.keep_presampled=true, which stores the "
            "near-perfect prompts' correct presampled responses too)",
            per_step,
            n_samples,
            config.reference_store,
            per_step / n_samples,
        )


def make_engine(
    config: Config, model: torch.nn.Module | None, tokenizer: Any, model_path: str
) -> RolloutEngine:
    """The rollout engine named by ``rollout.engine``, with ``rollout.engine_options``.

    ``model``: the policy in this process (None when the engine loads its own copy). A
    sharded (FSDP) policy comes with the hook that makes its full parameters live while
    an in-process engine generates with it.
    """
    from divrl.rollout import EngineContext, build_engine

    full_weights = None
    if model is not None:
        from divrl.training.fsdp import full_parameters, is_fsdp

        if is_fsdp(model):
            full_weights = lambda: full_parameters(model)  # noqa: E731
    context = EngineContext(
        model_path=model_path,
        model=model,
        tokenizer=tokenizer,
        dtype=config.train.param_dtype or config.model.dtype,  # fsdp: bf16 compute dtype
        seed=config.train.seed,
        max_model_len=config.data.max_prompt_length + config.rollout.max_new_tokens,
        trust_remote_code=config.model.trust_remote_code,
        full_weights=full_weights,
    )
    return build_engine(config.rollout.engine, context, config.rollout.engine_options)


def rollout_params(config: Config) -> SamplingParams:
    """The training rollouts' sampling settings."""
    return SamplingParams.from_settings(config.rollout)


def build_optimizer(config: Config, model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW and the learning-rate schedule (stepped once per training step)."""
    from transformers import get_scheduler

    opt = config.optim
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=opt.lr,
        betas=tuple(opt.betas),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
    )
    scheduler = get_scheduler(
        opt.schedule,
        optimizer,
        num_warmup_steps=opt.warmup_steps,
        num_training_steps=config.train.total_steps,
    )
    return optimizer, scheduler


@dataclass
class PolicyModels:
    """What :func:`load_models` builds: the policy as the update uses it (prepared by
    accelerate, or the FSDP model itself), its optimiser and schedule, the tokenizer, the
    frozen reference model of the online reverse-KL term (None without one)."""

    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    tokenizer: Any
    ref_model: torch.nn.Module | None
    sharded: bool


def load_models(config: Config, accelerator: Any, model_path: str) -> PolicyModels:
    """The policy, its optimiser and schedule, the tokenizer and the reference model."""
    cfg, acc = config, accelerator
    model, tokenizer = load_policy(cfg, model_path)
    # train.strategy=fsdp: shard after gradient checkpointing, before the optimiser.
    # Needs a process group (any launcher, even torchrun --nproc_per_node 1); a plain
    # single process keeps a plain model (its checkpoints are sharded all the same).
    sharded = cfg.train.strategy == "fsdp" and torch.distributed.is_initialized()
    if sharded:
        model = shard_model(cfg, model, acc.device)
    ref_model = None
    if cfg.algorithm.kl_coef > 0:
        ref_model, _ = load_policy(cfg, model_path)
        ref_model.requires_grad_(False).eval().to(acc.device)
        if sharded:  # sharded the same way as the policy; it has no optimiser
            ref_model = shard_model(cfg, ref_model, acc.device)
    optimizer, scheduler = build_optimizer(cfg, model)
    # The scheduler is not prepared: a prepared scheduler steps once per process. An
    # FSDP model is not prepared either: accelerate would wrap it in DDP, and FSDP
    # reduce-scatters the gradients itself.
    if not sharded:
        model, optimizer = acc.prepare(model, optimizer)
    return PolicyModels(model, optimizer, scheduler, tokenizer, ref_model, sharded)
