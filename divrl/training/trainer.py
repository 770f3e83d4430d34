"""The RL loop: roll out, score, compute advantages, update. One readable module.

One training step:

1. draw ``train.prompts_per_step`` prompts (the same global draw on every process; each
   process takes its contiguous shard) and sample ``rollout.n`` responses for each;
2. score them with the verifiers, add DAPO's overlong penalty, and (DAPO dynamic
   sampling) drop groups whose rewards are all equal, drawing more prompts to refill;
3. group-normalised advantages;
4. off-policy only (several optimiser steps per batch): one no-grad forward computes the
   old log-probs and, for Lp-Reg, the proxy log-probs from the same logits; with a
   reverse-KL term, a frozen reference model's log-probs;
5. for each of ``ppo_epochs`` x mini-batches, micro-batches of rollouts (policy loss,
   optional reverse KL and entropy bonus) and, for DPH-RL, micro-batches of reference
   samples (divergence loss) accumulate gradients; the step is skipped (and logged) when a
   loss or the gradient norm is not finite;
6. metrics to ``metrics.jsonl`` (and TensorBoard / W&B), a checkpoint every
   ``checkpoint.save_every`` steps.

Loss weighting (token-mean): every micro-batch's loss is weighted by its share of the
mini-batch's tokens counted over all processes, so the gradient is exactly the token-mean
of the whole mini-batch whatever the number of processes and micro-batches. DPH-RL's
``paper`` weighting token-means rollouts and reference samples separately
(``L_pg + eta * L_f``); ``concat`` (the authors' code) token-means both streams together.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import os
import shutil
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from divrl.algorithms import (
    aggregate,
    get_policy_loss,
    group_advantages,
    kl_estimate,
    logit_stats,
    reference_divergence_loss,
    token_log_probs,
)
from divrl.rollout import RolloutEngine, RolloutOutput, SamplingParams, collate
from divrl.training.config import Config, dump_config
from divrl.training.forward import batch_log_probs, response_logits, to_device
from divrl.training.reference_store import ReferenceStore
from divrl.training.sampling import EpochSampler, derive_seed

__all__ = ["PromptItem", "RewardFn", "Trainer", "is_correct", "load_policy", "load_prompts"]

logger = logging.getLogger(__name__)

# items -> scores; an item is a dict with data_source, solution_str, ground_truth, extra_info
RewardFn = Callable[[list[dict[str, Any]]], list[float]]
TIME_KEYS = ("time/step", "time/rollout", "time/update")


def is_correct(score: float) -> bool:
    """A response counts as correct (for Pass@1 and the DPH split) with full credit."""
    return score >= 1.0 - 1e-6


def default_reward_fn(items: list[dict[str, Any]]) -> list[float]:
    from divrl.rewards import score_batch

    return score_batch(items).scores


@dataclass
class PromptItem:
    """A tokenised training prompt with what its verifier needs."""

    id: str
    prompt_ids: list[int]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any] | None = None


# --------------------------------------------------------------------------- loading


def resolve_model_and_data(config: Config) -> tuple[str, str, str | None]:
    """(model path, train data path, db dir), the toy world filling what is null."""
    model_path, train_path, db_dir = config.model.path, config.data.train_path, config.data.db_dir
    if model_path is None or train_path is None:
        if config.model.toy_world == "countdown":
            from divrl.toy.countdown_world import ensure_countdown_world

            world = ensure_countdown_world(size=config.model.toy_size, progress=False)
        else:
            from divrl.toy import ensure_toy_world

            world = ensure_toy_world(size=config.model.toy_size, progress=False)
        model_path = model_path or str(world.model_dir)
        train_path = train_path or str(world.splits["train"])
        db_dir = db_dir or (str(world.db_dir) if world.db_dir else None)
    return str(model_path), str(train_path), db_dir


def load_policy(config: Config, model_path: str):
    """The policy model (train mode) and its tokenizer."""
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
        model.gradient_checkpointing_enable()
    return model, tokenizer


def load_prompts(
    config: Config, train_path: str, db_dir: str | None, tokenizer
) -> tuple[list[PromptItem], int]:
    """Tokenised training prompts and the number dropped for exceeding max_prompt_length."""
    from divrl.data import load_examples, render_prompt

    examples = load_examples(train_path, db_dir=db_dir, limit=config.data.limit)
    items, dropped = [], 0
    for ex in examples:
        text = render_prompt(ex, template=config.data.template, tokenizer=tokenizer)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > config.data.max_prompt_length:
            dropped += 1
            continue
        items.append(PromptItem(str(ex.id), ids, ex.data_source, ex.ground_truth, ex.extra_info))
    if not items:
        raise ValueError(f"no usable training prompts in {train_path}")
    return items, dropped


def make_engine(config: Config, model: torch.nn.Module, tokenizer, model_path: str):
    """The rollout engine named by ``rollout.engine``."""
    if config.rollout.engine == "vllm":
        from divrl.rollout.vllm import VLLMEngine

        return VLLMEngine(
            model_path,
            gpu_memory_utilization=config.rollout.gpu_memory_utilization,
            dtype=config.model.dtype,
            seed=config.train.seed,
            max_model_len=config.data.max_prompt_length + config.rollout.max_new_tokens,
            trust_remote_code=config.model.trust_remote_code,
        )
    from divrl.rollout import HFEngine

    return HFEngine(model, tokenizer, batch_size=config.rollout.batch_size)


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max_len - buffer``, then linear to -factor."""
    if buffer <= 0 or length <= max_len - buffer:
        return 0.0
    return -min(length - (max_len - buffer), buffer) / buffer * factor


# --------------------------------------------------------------------------- batches


@dataclass
class RolloutBatch:
    """One process's scored rollouts, ready for the update."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    rollout_log_probs: list[list[float]] = field(default_factory=list)  # from the engine
    advantages: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None  # [N, R] off-policy only
    proxy_log_probs: torch.Tensor | None = None  # [N, R] off-policy Lp-Reg only
    log_normalizers: torch.Tensor | None = None  # [N, R] off-policy Lp-Reg only (log Z)
    ref_log_probs: torch.Tensor | None = None  # [N, R] reverse-KL only

    def __len__(self) -> int:
        return len(self.response_ids)

    def add_group(self, out: RolloutOutput, rows: Sequence[int], rewards, scores, gid) -> None:
        for r in rows:
            self.prompt_ids.append(out.prompt_ids[r])
            self.response_ids.append(out.response_ids[r])
            self.rewards.append(rewards[r])
            self.scores.append(scores[r])
            self.truncated.append(out.truncated[r])
            self.rollout_log_probs.append(out.log_probs[r])
            self.groups.append(gid)


def _padded(rows: Sequence[Sequence[float]]) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.float32)
    return out


def _chunks(indices: Sequence[int], size: int) -> list[list[int]]:
    return [list(indices[i : i + size]) for i in range(0, len(indices), size)]


def _by_length(
    indices: Sequence[int], prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
) -> list[int]:
    """``indices`` sorted (stably) by prompt + response length, for length-bucketed
    micro-batches: a padded micro-batch costs ``B x (longest prompt + longest response)``."""
    return sorted(indices, key=lambda i: len(prompts[i]) + len(responses[i]))


def _split(indices: Sequence[int], parts: int) -> list[list[int]]:
    """``parts`` contiguous pieces whose sizes differ by at most one."""
    base, extra = divmod(len(indices), parts)
    out, start = [], 0
    for p in range(parts):
        end = start + base + (1 if p < extra else 0)
        out.append(list(indices[start:end]))
        start = end
    return out


class MetricMeter:
    """Weighted means of per-micro-batch metrics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, metrics: dict[str, float], weight: float = 1.0) -> None:
        for key, value in metrics.items():
            self.sums[key] += float(value) * weight
            self.weights[key] += weight

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}


# --------------------------------------------------------------------------- the trainer


class Trainer:
    """GRPO/DAPO and their diversity-keeping variants on any transformers causal LM.

    Args:
        config: a validated :class:`~divrl.training.config.Config`.
        reward_fn: ``items -> scores`` (default: :func:`divrl.rewards.score_batch`).
        resume: continue from the newest checkpoint in ``logging.output_dir``.
    """

    def __init__(
        self, config: Config, *, reward_fn: RewardFn | None = None, resume: bool = False
    ) -> None:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        self.config = config
        cfg = config
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
        acc = self.accelerator
        self.world, self.rank = acc.num_processes, acc.process_index
        self._check_divisibility()
        set_seed(cfg.train.seed)
        self.reward_fn = reward_fn or default_reward_fn
        self.output_dir = Path(cfg.logging.output_dir)

        model_path, train_path, db_dir = resolve_model_and_data(cfg)
        self.model_path = model_path
        model, self.tokenizer = load_policy(cfg, model_path)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        self.prompts, self.dropped_prompts = load_prompts(cfg, train_path, db_dir, self.tokenizer)
        if self.dropped_prompts:
            logger.warning(
                "dropped %d prompts longer than data.max_prompt_length=%d tokens",
                self.dropped_prompts,
                cfg.data.max_prompt_length,
            )

        # DPH-RL: roll out only exploration prompts; reference samples come from the store.
        self.reference_store: ReferenceStore | None = None
        self.ref_sampler: EpochSampler | None = None
        if cfg.uses_reference_samples:
            store = ReferenceStore(cfg.reference_store)
            temp = store.manifest.get("log_prob_temperature")
            if temp is not None and abs(temp - cfg.rollout.temperature) > 1e-9:
                raise ValueError(
                    f"the reference store's log-probs are at temperature {temp} but "
                    f"rollout.temperature={cfg.rollout.temperature}: presample again"
                )
            if len(store) == 0:
                raise ValueError(f"the reference store {store.path} holds no samples")
            keep = store.exploration_ids
            self.prompts = [p for p in self.prompts if p.id in keep]
            if not self.prompts:
                raise ValueError("no exploration prompts left after the DPH-RL split")
            self.reference_store = store
            self.ref_sampler = EpochSampler(len(store), cfg.train.seed + 1, shuffle=True)
        self.sampler = EpochSampler(len(self.prompts), cfg.train.seed, cfg.data.shuffle)

        # The frozen reference model exists only for the online reverse-KL term.
        self.ref_model = None
        if cfg.algorithm.kl_coef > 0:
            self.ref_model, _ = load_policy(cfg, model_path)
            self.ref_model.requires_grad_(False).eval().to(acc.device)

        opt = cfg.optim
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=opt.lr,
            betas=tuple(opt.betas),
            eps=opt.eps,
            weight_decay=opt.weight_decay,
        )
        from transformers import get_scheduler

        # Not passed through accelerator.prepare: a prepared scheduler steps once per process.
        self.scheduler = get_scheduler(
            opt.schedule,
            optimizer,
            num_warmup_steps=opt.warmup_steps,
            num_training_steps=cfg.train.total_steps,
        )
        self.model, self.optimizer = acc.prepare(model, optimizer)
        self.engine: RolloutEngine = make_engine(
            cfg, acc.unwrap_model(self.model), self.tokenizer, model_path
        )
        self.chunk = cfg.train.logits_chunk_size
        self.policy_loss_fn = get_policy_loss(cfg.algorithm.policy_loss)
        self._loss_params = set(inspect.signature(self.policy_loss_fn).parameters)
        self.params = SamplingParams(
            n=cfg.rollout.n,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            max_new_tokens=cfg.rollout.max_new_tokens,
            stop=tuple(cfg.rollout.stop),
        )
        self.step = 0
        if resume:
            self._load_latest_checkpoint()
        self._writers: list[Any] = []

    # ------------------------------------------------------------------ helpers

    def _check_divisibility(self) -> None:
        t, w = self.config.train, self.world
        mini = t.mini_batch_size or t.prompts_per_step
        if t.prompts_per_step % w or mini % w:
            raise ValueError(
                f"train.prompts_per_step={t.prompts_per_step} and the mini-batch size {mini} "
                f"must be divisible by the number of processes ({w})"
            )
        if self.config.reference.per_step % w:
            raise ValueError(
                f"reference.per_step={self.config.reference.per_step} must be divisible by the "
                f"number of processes ({w})"
            )

    def _all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        if self.world > 1:
            ops = {
                "sum": torch.distributed.ReduceOp.SUM,
                "min": torch.distributed.ReduceOp.MIN,
                "max": torch.distributed.ReduceOp.MAX,
            }
            torch.distributed.all_reduce(t, op=ops[op])
        return t.tolist()

    def _global_mean(self, metrics: dict[str, float]) -> dict[str, float]:
        """Mean of each metric over the processes that report it."""
        keys = set(metrics)
        if self.world > 1:  # a metric may exist on some processes only (e.g. a dropped group)
            gathered: list[Any] = [None] * self.world
            torch.distributed.all_gather_object(gathered, sorted(keys))
            keys = set().union(*gathered)
        keys = sorted(keys)
        sums = self._all_reduce([metrics.get(k, 0.0) for k in keys])
        counts = self._all_reduce([float(k in metrics) for k in keys])
        return {k: v / c for k, v, c in zip(keys, sums, counts, strict=True)}

    # ------------------------------------------------------------------ rollouts

    def _cuda_devices(self) -> list[torch.device]:
        return [self.accelerator.device] if self.accelerator.device.type == "cuda" else []

    def _shard_positions(self) -> list[int]:
        """Positions in the global prompt batch that this process rolls out.

        Each mini-batch (a contiguous block of the global batch) is split evenly over the
        processes, so a process's k-th mini-batch is its piece of the global k-th one and
        every optimiser step sees the same prompts whatever the number of processes.
        """
        t = self.config.train
        mini = t.mini_batch_size or t.prompts_per_step
        piece = mini // self.world
        return [
            k * mini + self.rank * piece + j
            for k in range(t.num_mini_batches)
            for j in range(piece)
        ]

    def collect(self) -> tuple[RolloutBatch, dict[str, float]]:
        """Roll out, score and (DAPO) filter this process's share of one step's prompts."""
        cfg, algo = self.config, self.config.algorithm
        per_rank = cfg.train.prompts_per_step // self.world
        batch = RolloutBatch()
        stats: dict[str, float] = defaultdict(float)
        if algo.dynamic_sampling:
            stats["dapo/dropped_groups"] = 0.0
        round_ = 0
        while True:
            global_idx = self.sampler.take(cfg.train.prompts_per_step)
            positions = self._shard_positions()
            mine = [global_idx[q] for q in positions]
            seeds = [derive_seed(cfg.train.seed, self.step, round_, q) for q in positions]
            if cfg.rollout.seeded:
                out = self.engine.generate(
                    [self.prompts[i].prompt_ids for i in mine], self.params, seeds
                )
            else:
                # batched: one seed per (step, round, process), independent of the global RNG
                with torch.random.fork_rng(devices=self._cuda_devices()):
                    torch.manual_seed(
                        derive_seed(cfg.train.seed, self.step, round_, self.world, self.rank, 1)
                    )
                    out = self.engine.generate(
                        [self.prompts[i].prompt_ids for i in mine], self.params
                    )
            items = [
                {
                    "data_source": self.prompts[mine[p]].data_source,
                    "solution_str": text,
                    "ground_truth": self.prompts[mine[p]].ground_truth,
                    "extra_info": self.prompts[mine[p]].extra_info,
                }
                for p, text in zip(out.prompt_index, out.texts, strict=True)
            ]
            scores = [float(s) for s in self.reward_fn(items)]
            rewards = [
                s
                + overlong_penalty(
                    len(r), cfg.rollout.max_new_tokens, algo.overlong_buffer, algo.overlong_penalty
                )
                for s, r in zip(scores, out.response_ids, strict=True)
            ]
            if round_ == 0:  # the current policy's batch statistics, before any filtering
                lengths = [len(r) for r in out.response_ids]
                stats["reward/score"] = sum(scores) / len(scores)
                stats["reward/pass@1"] = sum(map(is_correct, scores)) / len(scores)
                stats["reward/shaped"] = sum(rewards) / len(rewards)
                stats["response/length"] = sum(lengths) / len(lengths)
                stats["response/truncated"] = sum(out.truncated) / len(out.truncated)
            n = cfg.rollout.n
            for p in range(len(mine)):
                rows = range(p * n, (p + 1) * n)
                if algo.dynamic_sampling and len({rewards[r] for r in rows}) == 1:
                    stats["dapo/dropped_groups"] += 1
                    continue
                if len(batch) // n < per_rank:
                    batch.add_group(out, rows, rewards, scores, gid=round_ * 10**9 + positions[p])
            round_ += 1
            if not algo.dynamic_sampling:
                break
            (least,) = self._all_reduce([len(batch) // n], op="min")
            if least >= per_rank or round_ > algo.max_refill_rounds:
                break
        if algo.dynamic_sampling:
            # Every process must run the same number of micro-batches (DDP): trim to the
            # smallest process's count of kept groups.
            (least,) = self._all_reduce([len(batch) // cfg.rollout.n], op="min")
            keep = int(least) * cfg.rollout.n
            for name in (
                "prompt_ids",
                "response_ids",
                "rewards",
                "scores",
                "groups",
                "truncated",
                "rollout_log_probs",
            ):
                setattr(batch, name, getattr(batch, name)[:keep])
            stats["dapo/rounds"] = round_
            stats["dapo/kept_groups"] = keep // cfg.rollout.n
        if len(batch):
            batch.advantages = group_advantages(
                torch.tensor(batch.rewards), torch.tensor(batch.groups), scale=algo.adv_scale
            ).float()
        return batch, dict(stats)

    def _device_batch(
        self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]
    ) -> dict[str, torch.Tensor]:
        """Padded (prompt, response) tensors on this process's device (see ``collate``)."""
        return to_device(collate(prompt_ids, response_ids, self.pad_id), self.accelerator.device)

    @torch.no_grad()
    def _precompute(self, batch: RolloutBatch) -> dict[str, float]:
        """Old log-probs / Lp-Reg proxy (off-policy) and reference log-probs (reverse KL)."""
        cfg = self.config
        micro, temp = cfg.train.micro_batch_size, cfg.rollout.temperature
        metrics = MetricMeter()
        if not cfg.train.on_policy:
            policy = self.accelerator.unwrap_model(self.model)
            n = len(batch)
            olds, proxies = [[] for _ in range(n)], [[] for _ in range(n)]
            log_zs = [[] for _ in range(n)]
            order = range(n)
            if cfg.train.length_bucketing:
                order = _by_length(order, batch.prompt_ids, batch.response_ids)
            lp_reg = cfg.algorithm.policy_loss == "lp_reg"
            for idx in _chunks(order, micro):
                data = self._device_batch(
                    [batch.prompt_ids[i] for i in idx], [batch.response_ids[i] for i in idx]
                )
                logits = response_logits(policy, data)
                # one pass over the logits: the old log-probs and pi_old's Lp-Reg proxy
                stats = logit_stats(
                    logits,
                    data["responses"],
                    temp,
                    self.chunk,
                    with_entropy=False,
                    minp_kappa=cfg.algorithm.lp_reg_kappa if lp_reg else None,
                )
                lp = stats.log_prob.cpu()
                px = stats.proxy_log_prob.cpu() if lp_reg else None
                log_z = stats.log_normalizer.cpu() if lp_reg else None
                for j, i in enumerate(idx):
                    length = len(batch.response_ids[i])
                    olds[i] = lp[j, :length].tolist()
                    if lp_reg:
                        proxies[i] = px[j, :length].tolist()
                        log_zs[i] = log_z[j, :length].tolist()
            batch.old_log_probs = _padded(olds)
            if lp_reg:
                batch.proxy_log_probs, batch.log_normalizers = _padded(proxies), _padded(log_zs)
        if self.ref_model is not None:
            ref = batch_log_probs(
                self.ref_model,
                batch.prompt_ids,
                batch.response_ids,
                pad_token_id=self.pad_id,
                temperature=temp,
                micro_batch_size=micro,
                chunk_size=self.chunk,
                length_bucketing=cfg.train.length_bucketing,
            )
            batch.ref_log_probs = _padded(ref)
        return metrics.means()

    # ------------------------------------------------------------------ losses

    def _policy_micro(self, batch: RolloutBatch, idx: list[int]) -> tuple[torch.Tensor, dict, int]:
        cfg, algo = self.config, self.config.algorithm
        temp = cfg.rollout.temperature
        data = self._device_batch(
            [batch.prompt_ids[i] for i in idx], [batch.response_ids[i] for i in idx]
        )
        responses, mask = data["responses"], data["response_mask"]
        width = responses.shape[1]
        logits = response_logits(self.model, data)
        proxy_here = cfg.train.on_policy and algo.policy_loss == "lp_reg"
        # One pass over the logits: log-probs, entropy and, on-policy Lp-Reg, the current
        # policy's proxy (detached) from this very forward.
        stats = logit_stats(
            logits,
            responses,
            temp,
            self.chunk,
            minp_kappa=algo.lp_reg_kappa if proxy_here else None,
        )
        lp = stats.log_prob
        entropy = stats.entropy if algo.entropy_coef > 0 else stats.entropy.detach()

        def stored(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx, :width].to(lp.device)

        proxy = log_z = None
        if cfg.train.on_policy:
            old = lp.detach()
            if proxy_here:
                proxy, log_z = stats.proxy_log_prob, stats.log_normalizer
        else:
            old = stored(batch.old_log_probs)
            proxy, log_z = stored(batch.proxy_log_probs), stored(batch.log_normalizers)
        options = {
            "clip_low": algo.clip_low,
            "clip_high": algo.clip_high,
            "dual_clip": algo.dual_clip,
            "agg": algo.loss_agg,
            "rho": algo.lp_reg_rho,
            "beta": algo.lp_reg_beta,
            "proxy_log_prob": proxy,
            "log_normalizer": log_z,
            "kl_cov_ratio": algo.kl_cov_ratio,
            "ppo_kl_coef": algo.kl_cov_coef,
            "clip_ratio": algo.clip_cov_ratio,
            "clip_cov_lb": algo.clip_cov_lb,
            "clip_cov_ub": algo.clip_cov_ub,
            "entropy": entropy.detach(),
            "top_fraction": algo.high_entropy_fraction,
        }
        adv = batch.advantages[idx].to(lp.device)
        # keywords throughout: the registered losses agree on names, not on positions
        loss, metrics = self.policy_loss_fn(
            log_prob=lp,
            old_log_prob=old,
            advantages=adv,
            mask=mask,
            **{k: v for k, v in options.items() if k in self._loss_params},
        )
        metrics = dict(metrics)
        attention = data["attention_mask"]
        metrics["perf/padding_frac"] = 1.0 - float(attention.sum()) / attention.numel()
        metrics["actor/entropy"] = float((entropy.detach() * mask).sum() / mask.sum())
        # the engine's sampling log-probs vs the old log-probs the loss uses: ~0 for the hf
        # engine; a large value flags a sampler/trainer mismatch (e.g. vLLM kernels, dtype)
        engine_lp = _padded([batch.rollout_log_probs[i] for i in idx])[:, :width].to(lp.device)
        metrics["rollout/log_prob_diff"] = float(
            ((old - engine_lp).abs() * mask).sum() / mask.sum()
        )
        if algo.kl_coef > 0:
            kl = aggregate(
                kl_estimate(lp, stored(batch.ref_log_probs), algo.kl_estimator), mask, algo.loss_agg
            )
            loss = loss + algo.kl_coef * kl
            metrics["actor/ref_kl"] = float(kl.detach())
        if algo.entropy_coef > 0:
            loss = loss - algo.entropy_coef * aggregate(entropy, mask, algo.loss_agg)
        return loss, metrics, int(mask.sum().item())

    def _reference_micro(self, rows: list[int]) -> tuple[torch.Tensor, dict, int]:
        algo = self.config.algorithm
        samples = [self.reference_store.samples[r] for r in rows]
        data = self._device_batch(
            [s.prompt_ids for s in samples], [s.response_ids for s in samples]
        )
        logits = response_logits(self.model, data)
        lp = token_log_probs(logits, data["responses"], self.config.rollout.temperature, self.chunk)
        ref = _padded([s.ref_log_probs for s in samples])[:, : lp.shape[1]].to(lp.device)
        loss, metrics = reference_divergence_loss(
            lp, ref, data["response_mask"], algo.divergence, algo.divergence_alpha, algo.loss_agg
        )
        return loss, metrics, int(data["response_mask"].sum().item())

    # ------------------------------------------------------------------ update

    def _optimizer_step(
        self, batch: RolloutBatch, seqs: list[int], refs: list[int], meter: MetricMeter
    ) -> bool:
        """Accumulate one mini-batch's gradients and step; False when the step was skipped."""
        cfg, algo = self.config, self.config.algorithm
        micro = cfg.train.micro_batch_size
        if cfg.train.length_bucketing:
            seqs = _by_length(seqs, batch.prompt_ids, batch.response_ids)
            if refs:
                store = self.reference_store.samples
                refs = sorted(
                    refs, key=lambda r: len(store[r].prompt_ids) + len(store[r].response_ids)
                )
        jobs = [("pg", c) for c in _chunks(seqs, micro)] + [
            ("ref", c) for c in _chunks(refs, micro)
        ]
        tok_pg = sum(len(batch.response_ids[i]) for i in seqs)
        tok_ref = (
            sum(len(self.reference_store.samples[r].response_ids) for r in refs) if refs else 0
        )
        tok_pg, tok_ref = self._all_reduce([tok_pg, tok_ref])
        n_pg = sum(1 for k, _ in jobs if k == "pg")
        n_ref = len(jobs) - n_pg
        token_mean = algo.loss_agg == "token-mean"
        concat = algo.divergence_weighting == "concat"
        eta = algo.divergence_coef
        nonfinite = 0.0
        objective = 0.0
        for j, (kind, idx) in enumerate(jobs):
            sync = j == len(jobs) - 1
            with contextlib.nullcontext() if sync else self.accelerator.no_sync(self.model):
                if kind == "pg":
                    loss, metrics, ntok = self._policy_micro(batch, idx)
                    denom = (tok_pg + tok_ref) if concat else tok_pg
                    weight = ntok * self.world / denom if token_mean else 1.0 / n_pg
                else:
                    loss, metrics, ntok = self._reference_micro(idx)
                    denom = (tok_pg + tok_ref) if concat else tok_ref
                    weight = eta * (ntok * self.world / denom if token_mean else 1.0 / n_ref)
                self.accelerator.backward(loss * weight)
            value = float(loss.detach())
            nonfinite = max(nonfinite, 0.0 if math.isfinite(value) else 1.0)
            objective += value * weight / self.world
            meter.add(metrics, weight=ntok)
        max_norm = cfg.optim.max_grad_norm
        params = [p for p in self.model.parameters() if p.grad is not None]
        if max_norm > 0:
            grad_norm = float(self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm))
        else:
            grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
        (nonfinite,) = self._all_reduce([nonfinite], op="max")
        (objective,) = self._all_reduce([objective])
        skip = nonfinite > 0 or not math.isfinite(grad_norm)
        if skip:
            logger.warning(
                "step %d: non-finite loss or gradient norm; optimiser step skipped", self.step + 1
            )
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        meter.add(
            {
                "actor/grad_norm": grad_norm if math.isfinite(grad_norm) else float("nan"),
                "loss/total": objective,
                "actor/skipped_steps": float(skip),
            }
        )
        return not skip

    def train_step(self) -> dict[str, float]:
        """One rollout batch and its updates; returns the step's (global) metrics."""
        cfg = self.config
        t0 = time.perf_counter()
        batch, stats = self.collect()
        t_rollout = time.perf_counter() - t0
        ref_rows: list[int] = []
        if self.ref_sampler is not None:
            global_rows = self.ref_sampler.take(cfg.reference.per_step)
            share = cfg.reference.per_step // self.world
            ref_rows = global_rows[self.rank * share : (self.rank + 1) * share]
        meter = MetricMeter()
        skipped = 0
        if len(batch):
            meter.add(self._precompute(batch))
            minis = cfg.train.num_mini_batches
            seq_parts = _split(range(len(batch)), minis)
            ref_parts = _split(ref_rows, minis)
            self.model.train()
            for _ in range(cfg.train.ppo_epochs):
                for seqs, refs in zip(seq_parts, ref_parts, strict=True):
                    skipped += not self._optimizer_step(batch, seqs, refs, meter)
        with warnings.catch_warnings():
            # the schedule counts training steps, including ones without an optimiser step
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()
        self.engine.sync_weights(self.accelerator.unwrap_model(self.model))
        self.step += 1

        update = meter.means()
        update.pop("actor/skipped_steps", None)
        local = {**stats, **update}
        metrics = self._global_mean(local)
        for key in ("dapo/kept_groups", "dapo/dropped_groups"):  # counts: totals, not means
            if key in metrics:
                metrics[key] *= self.world
        metrics["actor/skipped_steps"] = float(skipped)
        if "loss/total" in metrics:  # already a sum over processes
            metrics["loss/total"] = local["loss/total"]
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        metrics["time/rollout"] = t_rollout
        metrics["time/update"] = time.perf_counter() - t0 - t_rollout
        metrics["time/step"] = time.perf_counter() - t0
        return metrics

    # ------------------------------------------------------------------ the loop

    def train(
        self,
        max_steps: int | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> list[dict[str, float]]:
        """Run until ``train.total_steps`` (or ``max_steps`` more steps); returns the metrics."""
        cfg, acc = self.config, self.accelerator
        end = (
            cfg.train.total_steps
            if max_steps is None
            else min(cfg.train.total_steps, self.step + max_steps)
        )
        history = []
        self._open_loggers()
        bar = self._progress_bar()
        try:
            while self.step < end:
                metrics = self.train_step()
                record = {"step": self.step, **metrics}
                history.append(record)
                self._log(record)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(self._postfix(metrics), refresh=False)
                every = cfg.checkpoint.save_every
                if (every and self.step % every == 0) or (
                    self.step == cfg.train.total_steps and cfg.checkpoint.save_final
                ):
                    self.save_checkpoint()
                if on_step is not None:
                    on_step(self.step, record)
        finally:
            if bar is not None:
                bar.close()
            self._close_loggers()
        acc.wait_for_everyone()
        return history

    # ------------------------------------------------------------------ logging

    @staticmethod
    def _postfix(m: dict[str, float]) -> dict[str, str]:
        out = {
            "reward": f"{m.get('reward/shaped', float('nan')):.3f}",
            "pass@1": f"{m.get('reward/pass@1', float('nan')):.3f}",
            "ent": f"{m.get('actor/entropy', float('nan')):.3f}",
        }
        kl = m.get("actor/ref_kl", m.get("pg/approx_kl"))
        if kl is not None:
            out["kl"] = f"{kl:.2e}"
        out["s/step"] = f"{m['time/step']:.1f}"
        return out

    def _progress_bar(self):
        if not (self.config.logging.progress and self.accelerator.is_main_process):
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=self.config.train.total_steps, initial=self.step, desc="train", dynamic_ncols=True
        )

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / "metrics.jsonl"

    def _open_loggers(self) -> None:
        if not self.accelerator.is_main_process:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "config.yaml").write_text(dump_config(self.config))
        if self.config.logging.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                logger.info("tensorboard is not installed; metrics go to metrics.jsonl only")
            else:
                self._writers.append(("tb", SummaryWriter(str(self.output_dir / "tensorboard"))))
        if self.config.logging.wandb:
            import wandb

            run = wandb.init(
                project=self.config.logging.wandb_project,
                config=self.config.to_dict(),
                dir=str(self.output_dir),
                resume="allow",
            )
            self._writers.append(("wandb", run))

    def _log(self, record: dict[str, float]) -> None:
        if not self.accelerator.is_main_process:
            return
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for kind, writer in self._writers:
            if kind == "tb":
                for k, v in record.items():
                    if k != "step":
                        writer.add_scalar(k, v, record["step"])
            else:
                writer.log(record, step=record["step"])

    def _close_loggers(self) -> None:
        for kind, writer in self._writers:
            writer.close() if kind == "tb" else writer.finish()
        self._writers = []

    # ------------------------------------------------------------------ checkpoints

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    def save_checkpoint(self) -> Path:
        """Atomically write ``checkpoints/step_NNNNNN`` (temp dir, then rename)."""
        acc = self.accelerator
        final = self.checkpoint_dir / f"step_{self.step:06d}"
        tmp = self.checkpoint_dir / f".tmp_step_{self.step:06d}"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp / "state"))  # model, optimiser, every process's RNG states
        state_dict = acc.get_state_dict(self.model)
        if acc.is_main_process:
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            trainer_state = {
                "step": self.step,
                "sampler": self.sampler.state_dict(),
                "reference_cursor": self.ref_sampler.state_dict() if self.ref_sampler else None,
                "world_size": self.world,
            }
            (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
            # a plain transformers directory, for evaluation and as a starting point
            acc.unwrap_model(self.model).save_pretrained(tmp / "model", state_dict=state_dict)
            self.tokenizer.save_pretrained(tmp / "model")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            self._prune_checkpoints()
        acc.wait_for_everyone()
        return final

    def _prune_checkpoints(self) -> None:
        ckpts = sorted(self.checkpoint_dir.glob("step_*"))
        for old in ckpts[: -self.config.checkpoint.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def _load_latest_checkpoint(self) -> None:
        ckpts = sorted(self.checkpoint_dir.glob("step_*"))
        if not ckpts:
            raise FileNotFoundError(f"--resume: no checkpoint in {self.checkpoint_dir}")
        ckpt = ckpts[-1]
        state = json.loads((ckpt / "trainer_state.json").read_text())
        self.accelerator.load_state(str(ckpt / "state"))
        self.scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=True))
        self.sampler.load_state_dict(state["sampler"])
        if self.ref_sampler is not None and state["reference_cursor"] is not None:
            self.ref_sampler.load_state_dict(state["reference_cursor"])
        self.step = int(state["step"])
        self.engine.sync_weights(self.accelerator.unwrap_model(self.model))
        # Steps logged after the checkpoint are redone: drop them from the metrics file.
        if self.accelerator.is_main_process and self.metrics_path.is_file():
            lines = self.metrics_path.read_text().splitlines()
            kept = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] <= self.step]
            self.metrics_path.write_text("".join(ln + "\n" for ln in kept))
        self.accelerator.wait_for_everyone()
        logger.info("resumed from %s (step %d)", ckpt, self.step)
