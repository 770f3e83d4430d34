"""The loop's own sections of the training config: ``train`` (batch sizes, epochs, seed,
micro-batching; the sharding keys come from :class:`~divrl.training.sharding_config.FSDPConfig`),
``optim``, ``logging`` and ``checkpoint`` (read by the trainer and its stages)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from divrl.training.config_io import ConfigError, help_field, positive
from divrl.training.sharding_config import FSDPConfig

__all__ = ["CheckpointConfig", "LoggingConfig", "OptimConfig", "TrainConfig"]


@dataclass
class TrainConfig(FSDPConfig):  # strategy, param_dtype, fsdp_*: divrl.training.sharding_config
    total_steps: int = help_field("training steps (one rollout batch each)", 100)
    prompts_per_step: int = help_field("prompts per rollout batch, all processes together", 32)
    mini_batch_size: int | None = help_field(
        "prompts per optimiser step (null = prompts_per_step: on-policy, one step per batch)",
        None,
    )
    micro_batch_size: int = help_field(
        "sequences per forward/backward pass on each process (when micro_batch_tokens is "
        "null). The loss weighting makes token-mean losses independent of it, but not "
        "losses that select tokens within a micro-batch: Lp-Reg (algorithm.lp_reg_scope="
        "micro_batch), KL-Cov, Clip-Cov and 80/20 see a different population",
        8,
    )
    # --- fidelity to the authors' scripts: token-budget micro-batches (verl's dynamic batch size)
    micro_batch_tokens: int | None = help_field(
        "pack each process's micro-batches up to this many tokens (prompt + response) after "
        "length bucketing (verl's use_dynamic_bsz / ppo_max_token_len_per_gpu); a longer "
        "sequence gets its own micro-batch. null = micro_batch_size sequences",
        None,
    )
    ppo_epochs: int = help_field("passes over each rollout batch", 1)
    batch_assembly: Literal["divrl", "authors"] = help_field(
        "DPH-RL: 'divrl' (separate streams) or 'authors' (their batch, replicated)", "divrl"
    )
    authors_replica_omit: list[str] = field(
        default_factory=list,
        metadata={
            "help": "ablations of train.batch_assembly=authors: parts of the authors' step "
            "left out, any of cloned_references (reference rows of a rollout-typed "
            "micro-batch dropped instead of trained with the policy loss), third_step (each "
            "virtual GPU's short last mini-batch joined to the one before), "
            "micro_batch_scaling (each micro-batch weighted by its token share of a "
            "mini-batch instead of its row share)"
        },
    )
    length_bucketing: bool = help_field(
        "sort each mini-batch's sequences by length before cutting it into micro-batches, so "
        "sequences of similar length share a padded micro-batch (less padding, same loss for "
        "token-mean aggregation; per-micro-batch selections such as Lp-Reg's lowest-rho "
        "tokens and KL-Cov/Clip-Cov's top tokens then see length-sorted neighbours)",
        True,
    )
    seed: int = help_field("seed of data order, sampling and initialisation", 0)
    logits_chunk_size: int | None = help_field(
        "positions per chunk when log-softmax, entropy and the Lp-Reg proxy read the logits "
        "(null = all at once; e.g. 1024 for 150k-token vocabularies, to avoid fp32 copies "
        "of the full logits)",
        None,
    )

    max_unscorable: float = help_field(
        "the share of a step's responses (all processes and generation rounds together) "
        "that may be unscorable (a verifier timeout, a crashed worker, a verifier error: "
        "kept out of the group baselines, advantage 0, counted as reward/unscorable); a "
        "step with more stops the run with a message. 0 stops at the first one, 1 never",
        0.1,
    )

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for name in ("total_steps", "prompts_per_step", "micro_batch_size", "ppo_epochs"):
            positive(f"train.{name}", getattr(self, name))
        if not 0 <= self.seed <= MAX_SEED:  # numpy seeds are below 2**32; seeds get offsets
            raise ConfigError(f"train.seed={self.seed} must be a whole number from 0 to {MAX_SEED}")
        if not 0.0 <= self.max_unscorable <= 1.0:
            raise ConfigError(
                f"train.max_unscorable={self.max_unscorable} must be a share from 0 to 1 "
                "(e.g. 0.1: stop when more than a tenth of a step's responses are unscorable)"
            )
        if self.logits_chunk_size is not None:
            positive("train.logits_chunk_size", self.logits_chunk_size)
        if self.micro_batch_tokens is not None:
            positive("train.micro_batch_tokens", self.micro_batch_tokens)
        if self.mini_batch_size is not None:
            positive("train.mini_batch_size", self.mini_batch_size)
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


#: the largest seed a config or option takes (numpy's seeds are below 2**32, and divrl adds
#: offsets such as the process rank or the prompt index)
MAX_SEED = 2**31 - 1


@dataclass
class OptimConfig:
    lr: float = help_field("AdamW learning rate", 1e-6)
    weight_decay: float = help_field("AdamW weight decay", 0.0)
    betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999], metadata={"help": "AdamW betas"}
    )
    eps: float = help_field("AdamW epsilon", 1e-8)
    schedule: Literal["constant", "constant_with_warmup", "linear", "cosine"] = help_field(
        "learning-rate schedule (transformers.get_scheduler names)", "constant"
    )
    warmup_steps: int = help_field("warm-up steps of the schedule", 0)
    max_grad_norm: float = help_field("gradient-norm clipping (0 = off)", 1.0)

    def __post_init__(self) -> None:
        positive("optim.lr", self.lr)
        positive("optim.weight_decay", self.weight_decay, allow_zero=True)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas={self.betas} must be two numbers in [0, 1)")
        positive("optim.warmup_steps", self.warmup_steps, allow_zero=True)
        positive("optim.max_grad_norm", self.max_grad_norm, allow_zero=True)


@dataclass
class LoggingConfig:
    output_dir: str = help_field(
        "run directory: metrics.jsonl, checkpoints/, tensorboard/ (a config file that does not "
        "set it itself runs in runs/<file stem>; runs/run without a config file)",
        "runs/run",
    )
    tensorboard: bool = help_field(
        "also write TensorBoard events (if tensorboard is installed)", True
    )
    wandb: bool = help_field("also log to Weights & Biases (needs wandb installed)", False)
    wandb_project: str = help_field("W&B project name", "divrl")
    progress: bool = help_field("show a progress bar", True)


@dataclass
class CheckpointConfig:
    save_every: int = help_field("save a checkpoint every N steps (0 = only at the end)", 50)
    keep_last: int = help_field("checkpoints kept on disk (older ones are deleted)", 2)
    save_final: bool = help_field("save a checkpoint after the last step", True)

    def __post_init__(self) -> None:
        positive("checkpoint.save_every", self.save_every, allow_zero=True)
        positive("checkpoint.keep_last", self.keep_last)
