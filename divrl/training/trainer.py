"""The RL loop: roll out, score, compute advantages, update. Each stage is its own module.

One training step:

1. :mod:`~divrl.training.experience`: draw ``train.prompts_per_step`` prompts (the same
   global draw on every process; each process takes its shard), sample ``rollout.n``
   responses for each, score them, add DAPO's overlong penalty and (DAPO dynamic
   sampling) drop groups whose rewards are all equal, drawing more prompts to refill; the
   result is an ``Experience`` of padded tensors with group-normalised advantages;
2. :mod:`~divrl.training.update`: off-policy only, one no-grad forward computes the old
   log-probs (and Lp-Reg's proxy from the same logits); with a reverse-KL term, a frozen
   reference model's log-probs; then for each of ``ppo_epochs`` x mini-batches,
   micro-batches of rollouts and of DPH reference samples accumulate gradients and the
   optimiser steps (skipped, and logged, when a loss or the gradient norm is not finite);
3. :mod:`~divrl.training.metrics`: the step's metrics reduced over the processes, to
   ``metrics.jsonl`` (and TensorBoard / W&B); :mod:`~divrl.training.checkpointing`: a
   checkpoint every ``checkpoint.save_every`` steps.

Models, prompts and the optimiser are built by :mod:`~divrl.training.loading`.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from divrl.algorithms.rehearsal_control import RehearsalController
from divrl.data.reference_store import ReferenceStore
from divrl.data.sampling import EpochSampler
from divrl.distributed import Collective
from divrl.runs import RunDir
from divrl.training import authors_config, checkpointing
from divrl.training.checkpointing import CheckpointStage
from divrl.training.config import Config, check_divisibility
from divrl.training.experience import ExperienceMaker, RewardFn, default_reward_fn, overlong_penalty
from divrl.training.fsdp import iter_full_parameters
from divrl.training.loading import (
    load_models,
    make_engine,
    pad_token_id,
    require_paths,
    rollout_params,
    run_prompts,
    run_provenance,
    warn_if_prompts_repeat,
)
from divrl.training.metrics import (
    TIME_KEYS,
    MetricMeter,
    MetricWriters,
    progress_postfix,
    reduce_step_metrics,
)
from divrl.training.presample import open_reference_store
from divrl.training.run_session import RunSession
from divrl.training.update import PolicyUpdate

__all__ = ["TIME_KEYS", "RewardFn", "Trainer", "overlong_penalty"]

logger = logging.getLogger(__name__)


class Trainer:
    """GRPO/DAPO and their diversity-keeping variants on any transformers causal LM.

    Args:
        config: a validated :class:`~divrl.training.config.Config` whose ``model.path`` and
            ``data.train_path`` are set.
        reward_fn: typed requests -> ``BatchScores`` or scores (default: the verifiers).
        resume: continue from the newest checkpoint in ``logging.output_dir``.
        overwrite: delete another run's files in ``logging.output_dir`` first (without it,
            or ``resume``, a folder holding a run is refused).
        resume_with_changes: config keys that may differ from the resumed run's config.yaml.
    """

    def __init__(
        self,
        config: Config,
        *,
        reward_fn: RewardFn | None = None,
        resume: bool = False,
        overwrite: bool = False,
        resume_with_changes: tuple[str, ...] = (),
    ) -> None:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        self.config = cfg = config
        self.accelerator = acc = Accelerator(cpu=not torch.cuda.is_available())
        self.world, self.rank = acc.num_processes, acc.process_index
        self.collective = Collective(self.world, self.rank, acc.device)
        check_divisibility(cfg, self.world)
        set_seed(cfg.train.seed)
        self.run = RunDir(cfg.logging.output_dir)
        self.output_dir = self.run.root
        self.session = RunSession(
            self.run, cfg, resume=resume, overwrite=overwrite, allowed_changes=resume_with_changes
        )
        self.session.check()  # refuse mixing runs before anything is loaded
        self._corrupt_checkpoints: list = []

        self.model_path, train_path, db_dir = require_paths(cfg)
        m = load_models(cfg, acc, self.model_path)
        self.model, self.optimizer, self.scheduler = m.model, m.optimizer, m.scheduler
        self.tokenizer, self.ref_model, self.sharded = m.tokenizer, m.ref_model, m.sharded
        self.checkpoints = CheckpointStage(
            self.run, acc, m, cfg.train.strategy, cfg.checkpoint.keep_last
        )
        self.pad_id = pad_token_id(self.tokenizer)
        self.prompts, self.dropped_prompts = run_prompts(
            cfg, train_path, db_dir, self.tokenizer, self.policy
        )

        # DPH-RL: roll out only exploration prompts; reference samples come from the store.
        self.reference_store: ReferenceStore | None = None
        self.ref_sampler: EpochSampler | None = None
        if cfg.uses_reference_samples:
            vocab = self.policy.get_input_embeddings().num_embeddings
            self.reference_store, self.prompts = open_reference_store(
                cfg, self.model_path, self.prompts, log=acc.is_main_process, vocab_size=vocab
            )
            self.ref_sampler = EpochSampler(len(self.reference_store), cfg.train.seed + 1, True)
        if self.rank == 0:
            what = "exploration prompts" if cfg.uses_reference_samples else "training prompts"
            warn_if_prompts_repeat(cfg, len(self.prompts), what)
        self.sampler = EpochSampler(len(self.prompts), cfg.train.seed, cfg.data.shuffle)

        self.engine = make_engine(cfg, self.policy, self.tokenizer, self.model_path)
        self.experience = ExperienceMaker(
            cfg,
            self.engine,
            self.prompts,
            self.sampler,
            reward_fn or default_reward_fn,
            self.collective,
            rollout_params(cfg),
            self.pad_id,
        )
        self.update = PolicyUpdate(
            cfg,
            acc,
            self.model,
            self.optimizer,
            self.collective,
            ref_model=self.ref_model,
            reference_store=self.reference_store,
            pad_id=self.pad_id,
        )
        if self.update.layout is not None:
            logger.info(authors_config.authors_weight_line(cfg))
        if cfg.algorithm.options.SCOPED_SELECTION:
            logger.info("Lp-Reg selection scope: %s", cfg.algorithm.lp_reg_scope)
        self.step = 0
        if resume:
            self._load_latest_checkpoint()

    @property
    def rehearsal(self) -> RehearsalController | None:
        """DPH-RL's rehearsal controller (``algorithm.rehearsal_control``), or None."""
        return self.update.rehearsal

    @property
    def policy(self) -> torch.nn.Module:
        """The policy without accelerate's DDP wrapper (the FSDP model itself under fsdp)."""
        return self.model if self.sharded else self.accelerator.unwrap_model(self.model)

    def _sync_engine(self) -> None:
        """Hand the updated weights to the rollout engine: the full tensors, gathered one
        parameter at a time from the shards under fsdp, in the engine's dtype (a no-op
        for the hf engine, which shares the model and never consumes the iterator)."""
        t = self.config.train
        dtype = getattr(torch, t.param_dtype or self.config.model.dtype)
        self.engine.sync_weights(iter_full_parameters(self.policy, dtype=dtype, with_buffers=False))

    @property
    def metrics_path(self) -> Path:
        return self.run.metrics_path

    def train_step(self) -> dict[str, float]:
        """One rollout batch and its updates; returns the step's (global) metrics."""
        t0 = time.perf_counter()
        exp, means, counts = self.experience.make(self.step)
        t_rollout = time.perf_counter() - t0
        meter = MetricMeter()
        refs = self.ref_sampler.take(self.config.reference.per_step) if self.ref_sampler else []
        skipped = self.update.run(exp, refs, meter, self.step + 1)
        with warnings.catch_warnings():
            # the schedule counts training steps, including ones without an optimiser step
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()
        self._sync_engine()
        self.step += 1

        metrics = reduce_step_metrics(means, counts, meter.means(), self.collective)
        if self.rehearsal is not None:  # the same reduced metrics on every process
            metrics.update(self.rehearsal.observe(metrics))  # eta of the next step
        metrics["actor/skipped_steps"] = float(skipped)
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        metrics["time/rollout"] = t_rollout
        metrics["time/update"] = time.perf_counter() - t0 - t_rollout
        metrics["time/step"] = time.perf_counter() - t0
        return metrics

    def train(
        self,
        max_steps: int | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> list[dict[str, float]]:
        """Run until ``train.total_steps`` (or ``max_steps`` more steps); returns the metrics."""
        cfg, acc = self.config, self.accelerator
        end = cfg.train.total_steps
        if max_steps is not None:
            end = min(end, self.step + max_steps)
        history: list[dict[str, float]] = []
        if self.step >= end:
            logger.info("%s: already at step %d of %d", self.run.root, self.step, end)
            return history
        writers = MetricWriters(cfg, self.run) if acc.is_main_process else None
        self.session.provenance = run_provenance(cfg, self.prompts, self.reference_store)
        self.session.begin_on_all(
            self.step, self.collective, writers is not None, self._corrupt_checkpoints
        )
        bar, outcome = None, "failed"
        try:
            if writers is not None:
                writers.open()
            bar = self._progress_bar()
            while self.step < end:
                metrics = self.train_step()
                record = {"step": self.step, **metrics}
                history.append(record)
                if writers is not None:
                    writers.write(record)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(progress_postfix(metrics), refresh=False)
                if checkpointing.is_due(cfg.checkpoint, self.step, cfg.train.total_steps):
                    if writers is not None:
                        writers.sync()
                    self.save_checkpoint()
                if on_step is not None:
                    on_step(self.step, record)
            outcome = "finish" if self.step >= cfg.train.total_steps else "pause"
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        finally:
            if bar is not None:
                bar.close()
            if writers is not None:
                writers.close()
                self.session.end(outcome, self.step)
        acc.wait_for_everyone()
        return history

    def _progress_bar(self):
        if not (self.config.logging.progress and self.accelerator.is_main_process):
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=self.config.train.total_steps, initial=self.step, desc="train", dynamic_ncols=True
        )

    def save_checkpoint(self) -> Path:
        """Atomically write ``checkpoints/step_NNNNNN`` (temp dir, then rename)."""
        state = {
            "step": self.step,
            "sampler": self.sampler.state_dict(),
            "reference_cursor": self.ref_sampler.state_dict() if self.ref_sampler else None,
            "world_size": self.world,
            "run_id": self.session.run_id,
            "rehearsal_control": self.rehearsal.state_dict() if self.rehearsal else None,
        }
        return self.checkpoints.save(self.step, state)

    def _load_latest_checkpoint(self) -> None:
        ckpt, state, self._corrupt_checkpoints = self.checkpoints.load_latest()
        self.sampler.load_state_dict(state["sampler"])
        if self.ref_sampler is not None and state["reference_cursor"] is not None:
            self.ref_sampler.load_state_dict(state["reference_cursor"])
        self.step = int(state["step"])
        if self.rehearsal is not None:
            checkpointing.load_rehearsal_state(self.rehearsal, state, ckpt.path)
        checkpointing.apply_optimizer_changes(
            self.optimizer, self.scheduler, self.config.optim, self.session.changes
        )
        self._sync_engine()
        # metrics logged after the checkpoint are cut when writing starts (under the lock)
        logger.info("resumed from %s (step %d)", ckpt.path, self.step)
