"""Typed configuration of ``divrl train`` / ``divrl presample``.

A run is described by one YAML file with the sections below (any section or key may be
left out: the dataclass default applies) plus ``key=value`` overrides with dotted keys
(``algorithm.clip_high=0.28``). A YAML file may start with ``extends: other.yaml`` (a path
relative to the file): the other file is loaded first and this one is merged over it, key
by key. Unknown keys and invalid values raise :class:`ConfigError` before any work starts,
naming the key and the closest valid one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from divrl.algorithms import (
    DIVERGENCES,
    POLICY_LOSSES,
    LossOptions,
    divergence_generator,
    divergence_summaries,
)
from divrl.training import authors_config, loss_config
from divrl.training.config_io import (
    ConfigError,
    build_config,
    choice,
    dump_config,
    parse_override,
    read_config_mapping,
)
from divrl.training.sharding_config import FSDPConfig

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "ReferenceConfig",
    "RolloutConfig",
    "TrainConfig",
    "check_divisibility",
    "config_from_dict",
    "dump_config",
    "load_config",
    "parse_override",
]


def _positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def reject_non_finite(config: Any, prefix: str = "") -> None:
    """Raise :class:`ConfigError` for a NaN or infinite number anywhere in ``config`` (a
    :class:`Config`; sections are walked). No float option has a meaning for them, and
    comparisons let NaN through (``nan > 0`` and ``nan < 0`` are both false): a NaN clip
    would skip every step, a NaN max_grad_norm turn clipping off. Off switches are 0 or null."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            reject_non_finite(value, f"{prefix}{f.name}.")
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(
                    f"{prefix}{f.name}={item!r} must be a finite number (use 0 or null to "
                    "turn a feature off)"
                )


def _help(text: str, default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    return field(default=default, metadata={"help": text}, **kwargs)


# --------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    path: str | None = _help(
        "Hugging Face model directory or hub name (any causal LM transformers loads); "
        "null = the toy base model built by divrl.toy",
        None,
    )
    toy_size: Literal["full", "tiny"] = _help(
        "size of the toy world used when path is null ('tiny' builds in seconds)", "full"
    )
    toy_world: str = _help(
        "which toy world path null means, a name in the registry divrl.toy.worlds.WORLDS "
        "(checked when the world is built): 'sql' (toy SQL + math) or 'countdown' "
        "(countdown arithmetic with search traces), or one registered there",
        "sql",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = _help(
        "dtype the policy is loaded in", "float32"
    )
    gradient_checkpointing: bool = _help("recompute activations in backward", False)
    trust_remote_code: bool = _help("passed to from_pretrained", False)


@dataclass
class DataConfig:
    train_path: str | None = _help(
        "training prompts, JSONL/Parquet in the verl schema; null = the toy world's train split",
        None,
    )
    db_dir: str | None = _help("SQLite databases of SQL tasks (null = the toy world's)", None)
    template: str = _help("prompt template passed to divrl.data.render_prompt", "plain")
    limit: int | None = _help("use only the first N training examples", None)
    shuffle: bool = _help("reshuffle the prompts every epoch (seeded by train.seed)", True)
    max_prompt_length: int = _help(
        "longest prompt in tokens; longer ones are handled by data.truncation", 1024
    )
    # --- fidelity to the authors' scripts: what happens to prompts over max_prompt_length
    truncation: Literal["error", "drop", "left"] = _help(
        "prompts longer than data.max_prompt_length: 'error' stops at load time naming how "
        "many; 'drop' leaves them out; 'left' keeps their last max_prompt_length tokens "
        "(verl's truncation='left'). The count dropped or truncated is always printed",
        "error",
    )
    skip_invalid: bool = _help(
        "skip training rows that fail to decode or validate (each is counted and the first "
        "logged with its file, line and field) instead of stopping",
        False,
    )

    def __post_init__(self) -> None:
        from divrl.data.templates import template_names

        if self.limit is not None:
            _positive("data.limit", self.limit)
        _positive("data.max_prompt_length", self.max_prompt_length)
        choice("data.template", self.template, template_names())


@dataclass
class RolloutConfig:
    engine: str = _help(
        "rollout engine, any registered name (divrl.rollout.engine_names()): 'auto' "
        "(static for a Llama/Qwen2 policy on a CPU, else hf), 'static' (divrl's decode "
        "loop), 'hf' (transformers generate) or 'vllm' (colocated, needs the [vllm] extra "
        "and a GPU); options of the engine go in engine_options",
        "auto",
    )
    engine_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "the engine's own options, checked by the engine (hf: batch_size; vllm: "
            "gpu_memory_utilization, enforce_eager, max_num_seqs, allow_untested_version); "
            "filled with the engine's defaults, so config.yaml shows every value used"
        },
    )
    n: int = _help("responses sampled per prompt (the GRPO group size)", 8)
    temperature: float = _help("sampling temperature (also divides the training logits)", 1.0)
    top_p: float = _help("nucleus sampling threshold (1.0 = off)", 1.0)
    top_k: int = _help("top-k sampling (0 = off)", 0)
    max_new_tokens: int = _help("maximum response length in tokens", 256)
    stop: list[str] = field(
        default_factory=list,
        metadata={"help": "stop strings; the response ends with the first one"},
    )
    seeded: bool = _help(
        "generate each prompt's n responses in their own call from a seed derived from "
        "(train.seed, step, prompt position), so that samples do not depend on the number of "
        "processes or on batching (slow: one generate call per prompt). false: batched "
        "generation seeded per (step, process), still reproducible and resumable",
        False,
    )

    def __post_init__(self) -> None:
        from divrl.rollout.registry import EngineError, engine_options

        _positive("rollout.n", self.n)
        _positive("rollout.temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"rollout.top_p={self.top_p} must be in (0, 1]")
        _positive("rollout.top_k", self.top_k, allow_zero=True)
        _positive("rollout.max_new_tokens", self.max_new_tokens)
        try:
            options = engine_options(self.engine, self.engine_options or {})
        except EngineError as exc:
            raise ConfigError(f"rollout.engine / rollout.engine_options: {exc}") from exc
        self.engine_options = dataclasses.asdict(options)

    @property
    def options(self) -> Any:
        """The engine's typed options object (its dataclass), built from ``engine_options``."""
        from divrl.rollout.registry import engine_options

        return engine_options(self.engine, self.engine_options)

    @staticmethod
    def migrate(raw: dict[str, Any]) -> dict[str, Any]:
        """Read the keys of the flat section of earlier versions (``rollout.batch_size``,
        ``rollout.gpu_memory_utilization``) as the chosen engine's options; for another
        engine they had no effect and are dropped, with a warning either way."""
        from divrl.training.rollout_migration import migrate_rollout_section

        try:
            return migrate_rollout_section(raw)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc


_UNSET = "null = the policy loss's own default (divrl.algorithms.loss_options)"


@dataclass
class AlgorithmConfig:
    policy_loss: str = _help(
        "policy-gradient term, a name in divrl.algorithms.POLICY_LOSSES (vanilla: the clipped "
        f"surrogate of GRPO/DAPO): {', '.join(sorted(POLICY_LOSSES))}",
        "vanilla",
    )
    adv_scale: Literal["group", "batch", "none"] = _help(
        "advantage normalisation: group std (GRPO), batch std, none (Dr.GRPO)", "group"
    )
    # --- fidelity to the authors' scripts: the policy loss's options, resolved by divrl.training.loss_config
    loss_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "options of algorithm.policy_loss by the loss's own names (e.g. {rho: "
            "0.01, min_k: 2} for lp_reg); unset ones keep the loss's defaults; an option the "
            "loss does not take is an error. After loading: every option the loss runs with"
        },
    )
    clip_low: float | None = _help(f"ratio clip below: r >= 1 - clip_low ({_UNSET})", None)
    clip_high: float | None = _help(
        f"ratio clip above: r <= 1 + clip_high, DAPO clip-higher 0.28 ({_UNSET})", None
    )
    dual_clip: float | None = _help(
        "dual-clip c for A < 0, verl's clip_ratio_c (null = off; gspo/lp_reg/kl_cov refuse it)",
        None,
    )
    loss_agg: str | None = _help(
        f"loss aggregation mode, verl names or micro-batch-token-mean; also aggregates the "
        f"KL, entropy and DPH terms ({_UNSET}: token-mean, gspo seq-mean-token-mean)",
        None,
    )
    lp_reg_scope: Literal["micro_batch", "mini_batch", "step", "group"] = _help(
        "Lp-Reg: the tokens of the rho-quantile selection: each micro-batch (the authors' "
        "code), mini-batch, the whole step, or groups of lp_reg_group_size sequences (the "
        "last three cost one extra no-grad forward per mini-batch)",
        "micro_batch",
    )
    lp_reg_group_size: int | None = _help(
        "Lp-Reg, lp_reg_scope=group: sequences per selection group (consecutive rows)", None
    )
    kl_coef: float = _help(
        "beta of the online reverse-KL term on policy samples (> 0 loads a frozen reference model)",
        0.0,
    )
    kl_estimator: Literal["k1", "k2", "k3"] = _help("estimator of the reverse KL", "k3")
    divergence: str | None = _help(
        f"DPH-RL divergence on reference samples (null = off), a name in "
        f"divrl.algorithms.DIVERGENCES: {divergence_summaries()}",
        None,
    )
    divergence_alpha: float | None = _help("alpha of the alpha-divergence, in (0, 1)", None)
    divergence_coef: float = _help("eta: weight of the divergence term", 0.0)
    divergence_weighting: Literal["authors", "paper", "concat"] = _help(
        "DPH-RL weight of the reference stream (docs/algorithms.md): 'authors': the authors' "
        "balance from the authors_* layout (eta/8 forward_kl.sh, 0.078 eta js_kl.sh, alpha.sh); "
        "'paper': L_pg + eta * L_f; 'concat': one token-mean over both streams",
        "authors",
    )
    authors_gpus: int = _help("the DPH-RL authors' GPU count (their scripts: 8)", 8)
    authors_dynamic_batch: bool = _help("the authors' run had dynamic batch sizes", False)
    authors_micro_batch_size: int = _help("the authors' fixed micro-batch rows per GPU", 2)
    entropy_coef: float = _help("entropy bonus: loss -= coef * aggregate(H)", 0.0)
    dynamic_sampling: bool = _help(
        "DAPO: drop groups whose rewards are all equal and refill the batch", False
    )
    max_refill_rounds: int = _help("DAPO: extra generation rounds to refill the batch", 4)
    gen_batch_factor: int = _help("DAPO: prompts per round = this x prompts_per_step", 1)
    overlong_buffer: int = _help(
        "DAPO overlong shaping: length of the penalty buffer before max_new_tokens (0 = off)", 0
    )
    overlong_penalty: float = _help("DAPO overlong shaping: penalty at max_new_tokens", 1.0)

    def __post_init__(self) -> None:
        choice("algorithm.policy_loss", self.policy_loss, sorted(POLICY_LOSSES))
        self._resolve_loss_options()
        if self.divergence is not None:
            choice("algorithm.divergence", self.divergence, sorted(DIVERGENCES))
            try:  # the divergence checks its own options
                divergence_generator(self.divergence, self.divergence_alpha)
            except ValueError as exc:
                raise ConfigError(
                    f"algorithm.divergence={self.divergence} with algorithm.divergence_alpha="
                    f"{self.divergence_alpha}: {exc}"
                ) from exc
        for name in ("kl_coef", "divergence_coef", "entropy_coef"):
            _positive(f"algorithm.{name}", getattr(self, name), allow_zero=True)
        if self.lp_reg_scope != "micro_batch" and self.policy_loss != "lp_reg":
            raise ConfigError(
                f"algorithm.lp_reg_scope={self.lp_reg_scope!r} is set but "
                f"algorithm.policy_loss={self.policy_loss!r} (not lp_reg): remove it"
            )
        _positive("algorithm.max_refill_rounds", self.max_refill_rounds, allow_zero=True)
        if problems := authors_config.algorithm_problems(self):
            raise ConfigError("; ".join(problems))
        _positive("algorithm.overlong_buffer", self.overlong_buffer, allow_zero=True)

    def _resolve_loss_options(self) -> None:
        """Typed options of the policy loss (bounds checked once, by its dataclass); the
        flat keys and loss_options are rewritten to the values the loss runs with."""
        flat = {key: getattr(self, key) for key in loss_config.FLAT_OPTION_KEYS}
        try:
            resolved = loss_config.resolved_option_fields(
                self.policy_loss, flat, dict(self.loss_options)
            )
        except ValueError as exc:
            raise ConfigError(f"algorithm: {exc}") from exc
        for key, value in resolved.items():
            setattr(self, key, value)

    @functools.cached_property
    def options(self) -> LossOptions:
        """The policy loss's validated options (``loss_kwargs()`` are its keyword args),
        built once: the section is not changed after loading."""
        return loss_config.resolve_loss_options(self.policy_loss, {}, self.loss_options)

    @staticmethod
    def migrate(raw: dict[str, Any]) -> dict[str, Any]:
        """Refuse the per-loss keys of earlier versions, naming where each went."""
        removed = {k: v for k, v in loss_config.REMOVED_KEYS.items() if k in raw}
        if removed:
            moved = ", ".join(
                f"algorithm.{k} -> algorithm.loss_options.{v}" for k, v in removed.items()
            )
            raise ConfigError(f"removed keys (CHANGELOG.md): {moved}")
        return raw


@dataclass
class ReferenceConfig:
    store: str | None = _help(
        "DPH-RL reference store written by `divrl presample` (null = <logging.output_dir>/"
        "reference)",
        None,
    )
    k: int = _help("presample: responses per training prompt from the initial model", 8)
    threshold: int | None = _help(
        "presample: a prompt is near-perfect with at least this many of k correct (null = k)",
        None,
    )
    temperature: float = _help("presample: sampling temperature", 1.0)
    top_p: float = _help("presample: nucleus threshold", 0.95)
    response_top_p: float | None = _help(
        "presample: top_p of the kept reference responses (null = top_p; DPH-RL's: 0.9)", None
    )
    per_step: int = _help("reference samples trained on per step (all processes together)", 0)
    batch_size: int = _help("presample: prompts per generation call", 16)
    failed_to_exploration: bool = _help(
        "presample: a near-perfect prompt whose extra response fails goes to the exploration "
        "set (the paper's text) instead of neither set (the authors' code)",
        False,
    )
    allow_store_mismatch: bool = _help(
        "train on a reference store presampled for another model, data, sampling settings "
        "or split rule (a warning instead of an error)",
        False,
    )
    keep_presampled: bool = _help(
        "presample: also keep the correct responses among each near-perfect prompt's k "
        "presampled ones as reference samples (false = the authors' code: only the one "
        "extra response per prompt; true for a toy world whose base solves few prompts "
        "reliably, where that leaves a store of a few samples)",
        False,
    )

    def __post_init__(self) -> None:
        _positive("reference.k", self.k)
        if self.threshold is not None and not 1 <= self.threshold <= self.k:
            raise ConfigError(f"reference.threshold={self.threshold} must be in [1, k={self.k}]")
        _positive("reference.temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"reference.top_p={self.top_p} must be in (0, 1]")
        if self.response_top_p is not None and not 0.0 < self.response_top_p <= 1.0:
            raise ConfigError(f"reference.response_top_p={self.response_top_p} must be in (0, 1]")
        _positive("reference.per_step", self.per_step, allow_zero=True)
        _positive("reference.batch_size", self.batch_size)


@dataclass
class TrainConfig(FSDPConfig):  # strategy, param_dtype, fsdp_*: divrl.training.sharding_config
    total_steps: int = _help("training steps (one rollout batch each)", 100)
    prompts_per_step: int = _help("prompts per rollout batch, all processes together", 32)
    mini_batch_size: int | None = _help(
        "prompts per optimiser step (null = prompts_per_step: on-policy, one step per batch)",
        None,
    )
    micro_batch_size: int = _help(
        "sequences per forward/backward pass on each process (when micro_batch_tokens is "
        "null). The loss weighting makes token-mean losses independent of it, but not "
        "losses that select tokens within a micro-batch: Lp-Reg (algorithm.lp_reg_scope="
        "micro_batch), KL-Cov, Clip-Cov and 80/20 see a different population",
        8,
    )
    # --- fidelity to the authors' scripts: token-budget micro-batches (verl's dynamic batch size)
    micro_batch_tokens: int | None = _help(
        "pack each process's micro-batches up to this many tokens (prompt + response) after "
        "length bucketing (verl's use_dynamic_bsz / ppo_max_token_len_per_gpu); a longer "
        "sequence gets its own micro-batch. null = micro_batch_size sequences",
        None,
    )
    ppo_epochs: int = _help("passes over each rollout batch", 1)
    batch_assembly: Literal["divrl", "authors"] = _help(
        "DPH-RL: 'divrl' (separate streams) or 'authors' (their batch, replicated)", "divrl"
    )
    length_bucketing: bool = _help(
        "sort each mini-batch's sequences by length before cutting it into micro-batches, so "
        "sequences of similar length share a padded micro-batch (less padding, same loss for "
        "token-mean aggregation; per-micro-batch selections such as Lp-Reg's lowest-rho "
        "tokens and KL-Cov/Clip-Cov's top tokens then see length-sorted neighbours)",
        True,
    )
    seed: int = _help("seed of data order, sampling and initialisation", 0)
    logits_chunk_size: int | None = _help(
        "positions per chunk when log-softmax, entropy and the Lp-Reg proxy read the logits "
        "(null = all at once; e.g. 1024 for 150k-token vocabularies, to avoid fp32 copies "
        "of the full logits)",
        None,
    )

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for name in ("total_steps", "prompts_per_step", "micro_batch_size", "ppo_epochs"):
            _positive(f"train.{name}", getattr(self, name))
        if self.logits_chunk_size is not None:
            _positive("train.logits_chunk_size", self.logits_chunk_size)
        if self.micro_batch_tokens is not None:
            _positive("train.micro_batch_tokens", self.micro_batch_tokens)
        if self.mini_batch_size is not None:
            _positive("train.mini_batch_size", self.mini_batch_size)
            if self.prompts_per_step % self.mini_batch_size:
                raise ConfigError(
                    f"train.mini_batch_size={self.mini_batch_size} must divide "
                    f"train.prompts_per_step={self.prompts_per_step}"
                )

    @property
    def num_mini_batches(self) -> int:
        return self.prompts_per_step // (self.mini_batch_size or self.prompts_per_step)

    @property
    def on_policy(self) -> bool:
        """One optimiser step per rollout batch: the old policy is the current one."""
        return self.ppo_epochs == 1 and self.num_mini_batches == 1


@dataclass
class OptimConfig:
    lr: float = _help("AdamW learning rate", 1e-6)
    weight_decay: float = _help("AdamW weight decay", 0.0)
    betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999], metadata={"help": "AdamW betas"}
    )
    eps: float = _help("AdamW epsilon", 1e-8)
    schedule: Literal["constant", "constant_with_warmup", "linear", "cosine"] = _help(
        "learning-rate schedule (transformers.get_scheduler names)", "constant"
    )
    warmup_steps: int = _help("warm-up steps of the schedule", 0)
    max_grad_norm: float = _help("gradient-norm clipping (0 = off)", 1.0)

    def __post_init__(self) -> None:
        _positive("optim.lr", self.lr)
        _positive("optim.weight_decay", self.weight_decay, allow_zero=True)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas={self.betas} must be two numbers in [0, 1)")
        _positive("optim.warmup_steps", self.warmup_steps, allow_zero=True)
        _positive("optim.max_grad_norm", self.max_grad_norm, allow_zero=True)


@dataclass
class LoggingConfig:
    output_dir: str = _help("run directory: metrics.jsonl, checkpoints/, tensorboard/", "runs/run")
    tensorboard: bool = _help("also write TensorBoard events (if tensorboard is installed)", True)
    wandb: bool = _help("also log to Weights & Biases (needs wandb installed)", False)
    wandb_project: str = _help("W&B project name", "divrl")
    progress: bool = _help("show a progress bar", True)


@dataclass
class CheckpointConfig:
    save_every: int = _help("save a checkpoint every N steps (0 = only at the end)", 50)
    keep_last: int = _help("checkpoints kept on disk (older ones are deleted)", 2)
    save_final: bool = _help("save a checkpoint after the last step", True)

    def __post_init__(self) -> None:
        _positive("checkpoint.save_every", self.save_every, allow_zero=True)
        _positive("checkpoint.keep_last", self.keep_last)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        reject_non_finite(self)
        algo = self.algorithm
        if algo.divergence is not None and algo.divergence_coef > 0 and self.reference.per_step < 1:
            raise ConfigError(
                "algorithm.divergence is set but reference.per_step=0: set reference.per_step "
                "to the number of reference samples per step"
            )
        if algo.divergence_weighting == "concat" and algo.loss_agg != "token-mean":
            raise ConfigError(
                "algorithm.divergence_weighting=concat is one token-mean over both streams: "
                "it needs algorithm.loss_agg=token-mean"
            )
        problems = authors_config.authors_assembly_problems(self)
        if self.train.batch_assembly == "authors" and problems:
            raise ConfigError("train.batch_assembly=authors: " + "; ".join(problems))
        if algo.dynamic_sampling and self.rollout.n < 2:
            raise ConfigError("algorithm.dynamic_sampling needs rollout.n >= 2")
        if algo.overlong_buffer >= self.rollout.max_new_tokens:
            raise ConfigError(
                f"algorithm.overlong_buffer={algo.overlong_buffer} must be smaller than "
                f"rollout.max_new_tokens={self.rollout.max_new_tokens}"
            )

    @property
    def uses_reference_samples(self) -> bool:
        """DPH-RL: a divergence term on presampled reference responses."""
        return self.algorithm.divergence is not None and self.algorithm.divergence_coef > 0

    @property
    def reference_store(self) -> Path:
        return Path(self.reference.store or Path(self.logging.output_dir) / "reference")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_divisibility(config: Config, world: int) -> None:
    """Every process must get the same share of the prompts and reference samples
    (checked at launch, once the number of processes ``world`` is known)."""
    t = config.train
    mini = t.mini_batch_size or t.prompts_per_step
    if t.prompts_per_step % world or mini % world:
        raise ValueError(
            f"train.prompts_per_step={t.prompts_per_step} and the mini-batch size {mini} "
            f"must be divisible by the number of processes ({world})"
        )
    if config.reference.per_step % world:
        raise ValueError(
            f"reference.per_step={config.reference.per_step} must be divisible by the "
            f"number of processes ({world})"
        )
    # Under FSDP every forward is a collective: each process must run as many
    # micro-batches (rollouts and reference samples) in each mini-batch as the others.
    if problems := authors_config.launch_problems(config, world):
        raise ValueError("; ".join(problems))
    if t.strategy != "fsdp" or world == 1:
        return
    if config.reference.per_step % (world * t.num_mini_batches):
        raise ValueError(
            f"train.strategy=fsdp: reference.per_step={config.reference.per_step} must be "
            f"divisible by processes x mini-batches ({world} x {t.num_mini_batches})"
        )
    if t.micro_batch_tokens is not None:
        raise ValueError(
            "train.strategy=fsdp on several processes needs train.micro_batch_tokens=null: "
            "token-budget micro-batches differ in number between processes"
        )


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Build a validated :class:`Config` from a nested mapping."""
    return build_config(Config, raw)


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Load a YAML config (or the defaults when ``path`` is None) and apply overrides
    (``section.key=value``; reading: :mod:`divrl.training.config_io`)."""
    return config_from_dict(read_config_mapping(path, overrides))
