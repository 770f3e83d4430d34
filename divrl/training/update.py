"""Stage 2 of a training step: the update (log-prob passes, losses, optimiser steps).

Loss weighting (token-mean): every micro-batch's loss is weighted by its share of the
mini-batch's tokens counted over all processes (:func:`micro_batch_weight`), so the
gradient is exactly the token-mean of the whole mini-batch whatever the number of processes
and micro-batches. DPH-RL's ``paper`` weighting token-means rollouts and reference samples
separately (``L_pg + eta * L_f``); ``concat`` (the authors' code) token-means both streams
together.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from divrl.algorithms import (
    aggregate,
    get_policy_loss,
    kl_estimate,
    logit_stats,
    reference_divergence_loss,
    token_log_probs,
)
from divrl.data.reference_store import ReferenceStore
from divrl.training.batch import Experience, PaddedPairs, ReferenceSamples
from divrl.training.collective import Collective
from divrl.training.config import Config
from divrl.training.forward import response_logits, to_device
from divrl.training.metrics import MetricMeter

__all__ = ["PolicyUpdate", "chunks", "micro_batch_weight", "split"]

logger = logging.getLogger(__name__)


def chunks(indices: Sequence[int], size: int) -> list[list[int]]:
    """Consecutive pieces of ``size`` (the last may be shorter)."""
    return [list(indices[i : i + size]) for i in range(0, len(indices), size)]


def split(indices: Sequence[int], parts: int) -> list[list[int]]:
    """``parts`` contiguous pieces whose sizes differ by at most one."""
    base, extra = divmod(len(indices), parts)
    out, start = [], 0
    for p in range(parts):
        end = start + base + (1 if p < extra else 0)
        out.append(list(indices[start:end]))
        start = end
    return out


def micro_batch_weight(
    kind: str,
    tokens: int,
    *,
    policy_tokens: float,
    reference_tokens: float,
    policy_micro_batches: int,
    reference_micro_batches: int,
    world: int,
    token_mean: bool,
    concat: bool,
    eta: float,
) -> float:
    """The factor on one micro-batch's (already token-meaned) loss.

    ``kind`` is ``"pg"`` (rollouts) or ``"ref"`` (DPH reference samples); ``tokens`` its
    response tokens; ``policy_tokens`` / ``reference_tokens`` the mini-batch's tokens of
    each stream over all ``world`` processes. Token-mean: ``tokens * world / denominator``
    (the stream's tokens, or both streams' under ``concat``); otherwise each micro-batch
    counts equally in its stream (``1 / micro-batches``). Reference micro-batches are
    multiplied by ``eta``. Summed over the processes' micro-batches and divided by
    ``world`` (DDP averages gradients), the weights of a stream add up to 1 (``eta``).
    """
    if kind == "pg":
        denom = (policy_tokens + reference_tokens) if concat else policy_tokens
        return tokens * world / denom if token_mean else 1.0 / policy_micro_batches
    denom = (policy_tokens + reference_tokens) if concat else reference_tokens
    return eta * (tokens * world / denom if token_mean else 1.0 / reference_micro_batches)


class PolicyUpdate:
    """Gradient steps of the policy on an :class:`Experience` (and DPH reference samples).

    Args:
        config: the run's config.
        accelerator: the ``accelerate.Accelerator`` that prepared ``model`` and ``optimizer``.
        model, optimizer: the (prepared) policy and its optimiser.
        collective: the processes of the run.
        ref_model: the frozen reference model (reverse-KL term only), or None.
        reference_store: DPH-RL reference samples (padded once here), or None.
        pad_id: the pad token id.
    """

    def __init__(
        self,
        config: Config,
        accelerator: Any,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        collective: Collective,
        *,
        ref_model: torch.nn.Module | None,
        reference_store: ReferenceStore | None,
        pad_id: int,
    ) -> None:
        self.config, self.accelerator, self.model = config, accelerator, model
        self.optimizer, self.collective = optimizer, collective
        self.ref_model, self.pad_id = ref_model, pad_id
        self.reference_samples = (
            None
            if reference_store is None
            else ReferenceSamples.from_samples(reference_store.samples, pad_id)
        )
        self.chunk = config.train.logits_chunk_size
        self.policy_loss_fn = get_policy_loss(config.algorithm.policy_loss)
        self._loss_params = set(inspect.signature(self.policy_loss_fn).parameters)

    def _inputs(self, pairs: PaddedPairs, idx: Sequence[int]) -> dict[str, torch.Tensor]:
        return to_device(pairs.model_inputs(idx), self.accelerator.device)

    def _order(self, exp: Experience) -> list[int]:
        order = list(range(len(exp)))
        return exp.by_length(order) if self.config.train.length_bucketing else order

    # ------------------------------------------------------------------ no-grad passes

    @torch.no_grad()
    def precompute(self, exp: Experience) -> None:
        """Old log-probs and the Lp-Reg proxy (off-policy), reference log-probs (reverse KL),
        written into ``exp`` as ``[N, R]`` tensors (zero beyond each response)."""
        cfg = self.config
        temp, micro = cfg.rollout.temperature, cfg.train.micro_batch_size
        lp_reg = cfg.algorithm.policy_loss == "lp_reg"
        if not cfg.train.on_policy:
            policy = self.accelerator.unwrap_model(self.model)
            exp.old_log_probs = torch.zeros(exp.responses.shape)
            if lp_reg:
                exp.proxy_log_probs = torch.zeros(exp.responses.shape)
                exp.log_normalizers = torch.zeros(exp.responses.shape)
            for idx in chunks(self._order(exp), micro):
                data = self._inputs(exp, idx)
                # one pass over the logits: the old log-probs and pi_old's Lp-Reg proxy
                stats = logit_stats(
                    response_logits(policy, data),
                    data["responses"],
                    temp,
                    self.chunk,
                    with_entropy=False,
                    minp_kappa=cfg.algorithm.lp_reg_kappa if lp_reg else None,
                )
                _scatter(exp.old_log_probs, idx, stats.log_prob, data["response_mask"])
                if lp_reg:
                    _scatter(exp.proxy_log_probs, idx, stats.proxy_log_prob, data["response_mask"])
                    _scatter(exp.log_normalizers, idx, stats.log_normalizer, data["response_mask"])
        if self.ref_model is not None:
            exp.ref_log_probs = torch.zeros(exp.responses.shape)
            for idx in chunks(self._order(exp), micro):
                data = self._inputs(exp, idx)
                logits = response_logits(self.ref_model, data)
                lp = token_log_probs(logits, data["responses"], temp, self.chunk)
                _scatter(exp.ref_log_probs, idx, lp, data["response_mask"])

    # ------------------------------------------------------------------ losses

    def _loss_options(self, entropy: torch.Tensor, proxy, log_z) -> dict[str, Any]:
        """The config's settings under the loss functions' argument names (only those the
        configured loss takes are passed)."""
        algo = self.config.algorithm
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
        return {k: v for k, v in options.items() if k in self._loss_params}

    def policy_micro(self, exp: Experience, idx: list[int]) -> tuple[torch.Tensor, dict, int]:
        """(loss, metrics, response tokens) of the rollout rows ``idx``."""
        cfg, algo = self.config, self.config.algorithm
        data = self._inputs(exp, idx)
        responses, mask = data["responses"], data["response_mask"]
        width = responses.shape[1]
        proxy_here = cfg.train.on_policy and algo.policy_loss == "lp_reg"
        # One pass over the logits: log-probs, entropy and, on-policy Lp-Reg, the current
        # policy's proxy (detached) from this very forward.
        stats = logit_stats(
            response_logits(self.model, data),
            responses,
            cfg.rollout.temperature,
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
            old = stored(exp.old_log_probs)
            proxy, log_z = stored(exp.proxy_log_probs), stored(exp.log_normalizers)
        # keywords throughout: the registered losses agree on names, not on positions
        loss, metrics = self.policy_loss_fn(
            log_prob=lp,
            old_log_prob=old,
            advantages=exp.advantages[idx].to(lp.device),
            mask=mask,
            **self._loss_options(entropy, proxy, log_z),
        )
        metrics = dict(metrics)
        attention = data["attention_mask"]
        metrics["perf/padding_frac"] = 1.0 - float(attention.sum()) / attention.numel()
        metrics["actor/entropy"] = float((entropy.detach() * mask).sum() / mask.sum())
        # the engine's sampling log-probs vs the old log-probs the loss uses: ~0 for the hf
        # engine; a large value flags a sampler/trainer mismatch (e.g. vLLM kernels, dtype)
        metrics["rollout/log_prob_diff"] = float(
            ((old - stored(exp.rollout_log_probs)).abs() * mask).sum() / mask.sum()
        )
        if algo.kl_coef > 0:
            kl = aggregate(
                kl_estimate(lp, stored(exp.ref_log_probs), algo.kl_estimator), mask, algo.loss_agg
            )
            loss = loss + algo.kl_coef * kl
            metrics["actor/ref_kl"] = float(kl.detach())
        if algo.entropy_coef > 0:
            loss = loss - algo.entropy_coef * aggregate(entropy, mask, algo.loss_agg)
        return loss, metrics, int(mask.sum().item())

    def reference_micro(self, rows: list[int]) -> tuple[torch.Tensor, dict, int]:
        """(divergence loss, metrics, response tokens) of the DPH reference samples ``rows``."""
        algo, samples = self.config.algorithm, self.reference_samples
        data = self._inputs(samples, rows)
        logits = response_logits(self.model, data)
        lp = token_log_probs(logits, data["responses"], self.config.rollout.temperature, self.chunk)
        ref = samples.ref_log_probs[rows, : lp.shape[1]].to(lp.device)
        loss, metrics = reference_divergence_loss(
            lp, ref, data["response_mask"], algo.divergence, algo.divergence_alpha, algo.loss_agg
        )
        return loss, metrics, int(data["response_mask"].sum().item())

    # ------------------------------------------------------------------ the optimiser step

    def _jobs(self, exp: Experience, seqs: list[int], refs: list[int]) -> list[tuple[str, list]]:
        micro = self.config.train.micro_batch_size
        if self.config.train.length_bucketing:
            seqs = exp.by_length(seqs)
            if refs:
                refs = self.reference_samples.by_length(refs)
        return [("pg", c) for c in chunks(seqs, micro)] + [("ref", c) for c in chunks(refs, micro)]

    def _token_counts(self, exp: Experience, seqs: list[int], refs: list[int]) -> list[float]:
        tok_pg = int(exp.response_lengths[seqs].sum()) if seqs else 0
        tok_ref = int(self.reference_samples.response_lengths[refs].sum()) if refs else 0
        return self.collective.all_reduce([tok_pg, tok_ref])

    def step(
        self, exp: Experience, seqs: list[int], refs: list[int], meter: MetricMeter, step: int
    ) -> bool:
        """Accumulate one mini-batch's gradients (rollout rows ``seqs``, reference rows
        ``refs``) and step the optimiser; False when the step was skipped (a non-finite loss
        or gradient norm)."""
        algo, world = self.config.algorithm, self.collective.world
        jobs = self._jobs(exp, seqs, refs)
        tok_pg, tok_ref = self._token_counts(exp, seqs, refs)
        n_pg = sum(1 for k, _ in jobs if k == "pg")
        weigh = {
            "policy_tokens": tok_pg,
            "reference_tokens": tok_ref,
            "policy_micro_batches": n_pg,
            "reference_micro_batches": len(jobs) - n_pg,
            "world": world,
            "token_mean": algo.loss_agg == "token-mean",
            "concat": algo.divergence_weighting == "concat",
            "eta": algo.divergence_coef,
        }
        nonfinite = objective = 0.0
        for j, (kind, idx) in enumerate(jobs):
            sync = j == len(jobs) - 1
            with contextlib.nullcontext() if sync else self.accelerator.no_sync(self.model):
                micro = self.policy_micro(exp, idx) if kind == "pg" else self.reference_micro(idx)
                loss, metrics, ntok = micro
                weight = micro_batch_weight(kind, ntok, **weigh)
                self.accelerator.backward(loss * weight)
            value = float(loss.detach())
            nonfinite = max(nonfinite, 0.0 if math.isfinite(value) else 1.0)
            objective += value * weight / world
            meter.add(metrics, weight=ntok)
        return self._apply(step, nonfinite, objective, meter)

    def _apply(self, step: int, nonfinite: float, objective: float, meter: MetricMeter) -> bool:
        max_norm = self.config.optim.max_grad_norm
        if max_norm > 0:
            norm = self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)
        else:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads)
        grad_norm = _global_value(norm)
        (nonfinite,) = self.collective.all_reduce([nonfinite], op="max")
        (objective,) = self.collective.all_reduce([objective])
        skip = nonfinite > 0 or not math.isfinite(grad_norm)
        if skip:
            logger.warning(
                "step %d: non-finite loss or gradient norm; optimiser step skipped", step
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


def _scatter(dest: torch.Tensor, idx: list[int], values: torch.Tensor, mask: torch.Tensor) -> None:
    """``dest[idx, :w] = values`` on response tokens, 0 on padding (w = values' width)."""
    values = torch.where(mask > 0, values.float(), torch.zeros_like(values, dtype=torch.float32))
    dest[idx, : values.shape[1]] = values.cpu()


def _global_value(norm: torch.Tensor) -> float:
    """A gradient norm as a float; under FSDP it is a DTensor over the shards' norms, whose
    full value is the norm of the whole gradient (every rank gets the same number)."""
    from torch.distributed.tensor import DTensor

    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
