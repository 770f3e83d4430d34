"""Stage 2 of a training step: the update (log-prob passes, losses, optimiser steps).

Micro-batches: ``train.micro_batch_size`` sequences, or packed up to
``train.micro_batch_tokens`` tokens (:func:`pack_by_tokens`), after length bucketing; a
micro-batch holds rollouts or DPH reference samples, never both.

Loss weighting: each micro-batch's aggregated loss is multiplied by its weight from
:func:`divrl.algorithms.micro_batch_weights`, computed over the micro-batches of ALL
processes (kinds and token counts gathered), times ``world`` because DDP averages the
processes' gradients. Without reference samples that is each micro-batch's share of the
mini-batch's tokens (token-mean): the gradient is exactly the token-mean of the whole
mini-batch whatever the number of processes and micro-batches; its share of the
mini-batch's sequences under ``loss_agg: micro-batch-token-mean`` (verl's actor). With reference samples
``algorithm.divergence_weighting`` decides the reference stream's weight (``authors``,
``paper``, ``concat``; docs/algorithms.md), logged as ``dph/effective_eta``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from divrl.algorithms import (
    aggregate,
    kl_estimate,
    logit_stats,
    lp_reg_selection,
    micro_batch_weights,
    policy_loss_spec,
    reference_divergence_loss,
    rollout_is_weights,
    stream_weights,
    token_log_probs,
)
from divrl.algorithms.dph_weighting import REFERENCE, ROLLOUT
from divrl.algorithms.rehearsal_control import RehearsalController
from divrl.data.reference_store import ReferenceStore
from divrl.distributed import Collective
from divrl.training import authors_config
from divrl.training.authors_assembly import AuthorsAssembly, balanced_order, karmarkar_karp
from divrl.training.batch import Experience, PaddedPairs, ReferenceSamples
from divrl.training.config import Config
from divrl.training.forward import response_logits, to_device
from divrl.training.metrics import MetricMeter

__all__ = ["PolicyUpdate", "chunks", "pack_by_tokens", "reference_parts", "split"]

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


def reference_parts(
    global_rows: Sequence[int], minis: int, world: int, rank: int
) -> list[list[int]]:
    """This process's DPH reference samples for each of the step's ``minis`` mini-batches.

    The step's global draw is cut into one contiguous block per mini-batch and each block
    is spread evenly over the processes (as the prompts are), so every optimiser step sees
    the same reference samples whatever the number of processes (the authors' code put
    them all on the last rank: ``train.batch_assembly: authors`` does that).
    """
    return [split(block, world)[rank] for block in split(list(global_rows), minis)]


def pack_by_tokens(indices: Sequence[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive pieces of ``indices`` whose ``lengths`` add up to at most ``budget`` (a
    sequence longer than the budget is a piece of its own).

    Like verl's dynamic batch size (``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``),
    which also caps the sum of the sequences' tokens; verl balances the pieces
    (Karmarkar-Karp), this packs greedily in the given (length-sorted) order.
    """
    pieces: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in indices:
        n = int(lengths[i])
        if current and used + n > budget:
            pieces.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        pieces.append(current)
    return pieces


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
        control = config.algorithm.control  # eta set each step from a target
        self.rehearsal = (
            RehearsalController(control, config.algorithm.divergence_coef) if control else None
        )
        self.loss_spec = policy_loss_spec(config.algorithm.policy_loss)
        self.loss_options = config.algorithm.options  # typed, validated once by the config
        self.agg = self.loss_options.agg  # also aggregates the KL, entropy and DPH terms
        self.kappa = getattr(self.loss_options, "kappa", None)  # Lp-Reg's proxy only
        authors = config.algorithm.divergence_weighting == "authors"
        layout = authors_config.authors_layout(config)
        self.layout = layout if config.uses_reference_samples and authors else None
        self.assembly = (
            AuthorsAssembly(self, layout) if config.train.batch_assembly == "authors" else None
        )

    @property
    def eta(self) -> float:
        """eta of the divergence term: the rehearsal controller's, else divergence_coef."""
        if self.rehearsal is not None:
            return self.rehearsal.eta
        return self.config.algorithm.divergence_coef

    def run(
        self, exp: Experience | None, references: Sequence[int], meter: MetricMeter, step: int
    ) -> int:
        """Every optimiser step of training step ``step`` on ``exp`` (None or empty: none)
        and the step's global draw of reference samples; returns how many were skipped."""
        if self.assembly is not None:  # the DPH-RL authors' batch, replicated
            if exp is None or not len(exp):
                return 0
            self.precompute(exp)
            self.model.train()
            return self.assembly.run(exp, references, meter, step)
        train, coll = self.config.train, self.collective
        parts = reference_parts(references, train.num_mini_batches, coll.world, coll.rank)
        if exp is None or not len(exp):
            return 0
        self.precompute(exp)
        self.model.train()
        skipped = 0
        order = self.step_rows(exp)
        for _ in range(train.ppo_epochs):
            seq_parts = split(order, train.num_mini_batches)
            for seqs, refs in zip(seq_parts, parts, strict=True):
                skipped += not self.step(exp, seqs, refs, meter, step)
        return skipped

    def step_rows(self, exp: Experience) -> list[int]:
        """This process's rows of the step in the order its mini-batches take them: as
        generated, or dealt to Lp-Reg's virtual GPUs as verl's ``balance_batch`` deals rows
        to ranks (``algorithm.lp_reg_balance_batch``), each mini-batch then holding every
        virtual GPU's next ``lp_reg_group_size`` rows."""
        algo, mini_batches = self.config.algorithm, self.config.train.num_mini_batches
        rows = list(range(len(exp)))
        if not (self._scoped_lp_reg and algo.lp_reg_balance_batch):
            return rows
        per_gpu = algo.lp_reg_group_size * mini_batches
        if len(exp) % per_gpu:  # a short step (dynamic sampling ran out of groups)
            logger.warning(
                "Lp-Reg balance_batch: %d rows are not whole virtual GPUs of %d rows; this "
                "step keeps the rows in generation order",
                len(exp),
                per_gpu,
            )
            return rows
        lengths = (exp.prompt_lengths + exp.response_lengths).tolist()
        return balanced_order(lengths, len(exp) // per_gpu, mini_batches)

    def _inputs(self, pairs: PaddedPairs, idx: Sequence[int]) -> dict[str, torch.Tensor]:
        return to_device(pairs.model_inputs(idx), self.accelerator.device)

    def micro_batches(self, pairs: PaddedPairs, rows: Sequence[int]) -> list[list[int]]:
        """``rows`` cut into micro-batches: length-bucketed (``train.length_bucketing``),
        then ``train.micro_batch_tokens`` tokens or ``train.micro_batch_size`` rows each."""
        train = self.config.train
        rows = pairs.by_length(rows) if train.length_bucketing else list(rows)
        if train.micro_batch_tokens is None:
            return chunks(rows, train.micro_batch_size)
        lengths = (pairs.prompt_lengths + pairs.response_lengths).tolist()
        return pack_by_tokens(rows, lengths, train.micro_batch_tokens)

    # ------------------------------------------------------------------ no-grad passes

    @torch.no_grad()
    def precompute(self, exp: Experience) -> None:
        """Old log-probs and the Lp-Reg proxy (off-policy), reference log-probs (reverse KL),
        written into ``exp`` as ``[N, R]`` tensors (zero beyond each response)."""
        cfg = self.config
        temp = cfg.rollout.temperature
        lp_reg = self.loss_options.NEEDS_PROXY  # pi_old's proxy beside its log-probs
        # a loss that declares it reads no pi_old skips this pass (unless the proxy or the
        # rollout correction needs it); its old_log_prob is then the current policy's
        needs_old = self.loss_options.NEEDS_OLD_LOG_PROBS or cfg.algorithm.rollout_correction
        if not cfg.train.on_policy and (needs_old or lp_reg):
            policy = self.accelerator.unwrap_model(self.model)
            exp.old_log_probs = torch.zeros(exp.responses.shape)
            if lp_reg:
                exp.proxy_log_probs = torch.zeros(exp.responses.shape)
                exp.log_normalizers = torch.zeros(exp.responses.shape)
            for idx in self.micro_batches(exp, range(len(exp))):
                data = self._inputs(exp, idx)
                # one pass over the logits: the old log-probs and pi_old's Lp-Reg proxy
                stats = logit_stats(
                    response_logits(policy, data),
                    data["responses"],
                    temp,
                    self.chunk,
                    with_entropy=False,
                    minp_kappa=self.kappa if lp_reg else None,
                )
                _scatter(exp.old_log_probs, idx, stats.log_prob, data["response_mask"])
                if lp_reg:
                    _scatter(exp.proxy_log_probs, idx, stats.proxy_log_prob, data["response_mask"])
                    _scatter(exp.log_normalizers, idx, stats.log_normalizer, data["response_mask"])
        if self.ref_model is not None:
            exp.ref_log_probs = torch.zeros(exp.responses.shape)
            for idx in self.micro_batches(exp, range(len(exp))):
                data = self._inputs(exp, idx)
                logits = response_logits(self.ref_model, data)
                lp = token_log_probs(logits, data["responses"], temp, self.chunk)
                _scatter(exp.ref_log_probs, idx, lp, data["response_mask"])

    # ------------------------------------------------------------------ Lp-Reg scope

    @property
    def _scoped_lp_reg(self) -> bool:
        algo = self.config.algorithm
        return self.loss_options.SCOPED_SELECTION and algo.lp_reg_scope != "micro_batch"

    @torch.no_grad()
    def select_lp_reg(self, exp: Experience, seqs: list[int], meter: MetricMeter) -> None:
        """Lp-Reg's selection over ``algorithm.lp_reg_scope`` (the mini-batch ``seqs`` or
        the whole step, over all processes) instead of each micro-batch: the current
        policy's log-probs of the population's negative-advantage tokens (one no-grad
        pass), the rho-share threshold, and ``exp.lp_reg_selected`` for the loss."""
        step_wide = self.config.algorithm.lp_reg_scope == "step"
        population = list(range(len(exp))) if step_wide else list(seqs)
        policy = self.accelerator.unwrap_model(self.model)
        lp = torch.zeros(exp.responses.shape)
        for idx in self.micro_batches(exp, population):
            data = self._inputs(exp, idx)
            values = token_log_probs(
                response_logits(policy, data),
                data["responses"],
                self.config.rollout.temperature,
                self.chunk,
            )
            _scatter(lp, idx, values, data["response_mask"])
        scope = self.config.algorithm.lp_reg_scope
        if scope in ("group", "authors"):
            groups = chunks(seqs, self.config.algorithm.lp_reg_group_size)
            if scope == "authors":
                groups, count = self._authors_micro_batches(exp, groups)
                meter.add({"lp_reg/authors_micro_batches": float(count)})
            in_population, population_size = self._select_in_groups(exp, lp, groups)
        else:
            rows = torch.as_tensor(population, dtype=torch.long)
            negative = exp.advantages[rows] < 0
            candidates = (exp.response_mask[rows] > 0) & negative.view(-1, 1)
            threshold, population_size = self._lowest_share(lp[rows][candidates])
            in_population = torch.zeros(exp.responses.shape, dtype=torch.bool)
            in_population[rows] = candidates & (lp[rows] <= threshold)
        # the mini-batch's rows only: the next mini-batch selects again, after this update
        exp.lp_reg_selected = torch.zeros_like(in_population)
        exp.lp_reg_selected[seqs] = in_population[seqs]
        meter.add({"lp_reg/population_negative": population_size})

    def _select_in_groups(
        self, exp: Experience, lp: torch.Tensor, groups: list[list[int]]
    ) -> tuple[torch.Tensor, float]:
        """(selected, mean candidates per group): Lp-Reg's selection (the k lowest of the
        negative-advantage tokens, as the loss selects in a micro-batch) within each group
        of rows: consecutive ``algorithm.lp_reg_group_size`` rows of the mini-batch, or the
        authors' micro-batches cut from them. A process holds whole groups (checked at
        launch), so the groups are the same on any number of processes."""
        opts = self.loss_options
        selected = torch.zeros(exp.responses.shape, dtype=torch.bool)
        sizes = []
        for group in groups:
            rows, here = torch.as_tensor(group, dtype=torch.long), lp[group]
            # the proxy only decides which selected tokens are regularised: not needed here
            pick = lp_reg_selection(
                here, here, exp.advantages[rows], exp.response_mask[rows], opts.rho, opts.min_k
            )
            selected[rows] = pick.selected
            sizes.append(float(pick.candidates.sum()))
        return selected, sum(sizes) / max(1, len(sizes))

    def _authors_micro_batches(
        self, exp: Experience, gpus: list[list[int]]
    ) -> tuple[list[list[int]], int]:
        """The Lp-Reg authors' micro-batches of a mini-batch: each virtual GPU's rows (``gpus``)
        cut into Karmarkar-Karp partitions balancing prompt + response tokens, as many as the
        most any virtual GPU of any process needs for the token budget (verl's
        ``rearrange_micro_batches``: ``min(rows, ceil(tokens / budget))``, max over ranks),
        and that count."""
        algo = self.config.algorithm
        budget = algo.lp_reg_micro_batch_tokens or self.config.train.micro_batch_tokens
        lengths = (exp.prompt_lengths + exp.response_lengths).tolist()
        need = max(
            (min(len(g), math.ceil(sum(lengths[r] for r in g) / budget)) for g in gpus), default=1
        )
        (count,) = self.collective.all_reduce([float(need)], op="max")
        parts = []
        for g in gpus:
            for part in karmarkar_karp([lengths[r] for r in g], min(int(count), len(g))):
                parts.append([g[i] for i in part])
        return parts, int(count)

    def _lowest_share(self, values: torch.Tensor) -> tuple[float, float]:
        """(threshold, N): the k-th lowest of the candidates' log-probs of all processes,
        ``k = max(1, floor(rho * N))`` (``-inf`` when ``k < min_k``), and ``N``."""
        rho, min_k = self.loss_options.rho, self.loss_options.min_k
        (total,) = self.collective.all_reduce([float(values.numel())])
        k = max(1, math.floor(rho * total))
        if total == 0 or k < min_k:
            return -math.inf, total
        # only a process's own k lowest can be among the k lowest of all
        lowest = torch.topk(values, min(k, values.numel()), largest=False).values.tolist()
        pooled = sorted(v for part in self.collective.all_gather_object(lowest) for v in part)
        return pooled[k - 1], total

    # ------------------------------------------------------------------ losses

    def policy_micro(self, exp: Experience, idx: list[int]) -> tuple[torch.Tensor, dict, int]:
        """(loss, metrics, response tokens) of the rollout rows ``idx``."""
        cfg, algo = self.config, self.config.algorithm
        data = self._inputs(exp, idx)
        responses, mask = data["responses"], data["response_mask"]
        width = responses.shape[1]
        proxy_here = cfg.train.on_policy and self.loss_options.NEEDS_PROXY
        # One pass over the logits: log-probs, entropy and, on-policy Lp-Reg, the current
        # policy's proxy (detached) from this very forward.
        stats = logit_stats(
            response_logits(self.model, data),
            responses,
            cfg.rollout.temperature,
            self.chunk,
            minp_kappa=self.kappa if proxy_here else None,
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
            old = lp.detach() if old is None else old  # the loss reads no pi_old
            proxy, log_z = stored(exp.proxy_log_probs), stored(exp.log_normalizers)
        rollout_lp = stored(exp.rollout_log_probs)
        weights, is_metrics = self._rollout_weights(old, rollout_lp, mask)
        # the tensors a loss may take; it gets those its options declare (INPUTS)
        available = {
            "proxy_log_prob": proxy,
            "log_normalizer": log_z,
            "entropy": entropy.detach(),
            "selected": stored(exp.lp_reg_selected),
            "token_weights": weights,
        }
        loss, metrics = self.loss_spec.fn(
            log_prob=lp,
            old_log_prob=old,
            advantages=exp.advantages[idx].to(lp.device),
            mask=mask,
            **self.loss_options.loss_kwargs(),
            **{k: available[k] for k in self.loss_options.INPUTS if available[k] is not None},
        )
        metrics = dict(metrics)
        attention = data["attention_mask"]
        metrics["perf/padding_frac"] = 1.0 - float(attention.sum()) / attention.numel()
        metrics["actor/entropy"] = float((entropy.detach() * mask).sum() / mask.sum())
        # the engine's sampling log-probs vs the old log-probs the loss uses: ~0 for the hf
        # engine; a large value flags a sampler/trainer mismatch (e.g. vLLM kernels, dtype)
        metrics["rollout/log_prob_diff"] = float(
            ((old - rollout_lp).abs() * mask).sum() / mask.sum()
        )
        metrics.update(is_metrics)
        if algo.kl_coef > 0:
            kl = aggregate(
                kl_estimate(lp, stored(exp.ref_log_probs), algo.kl_estimator), mask, self.agg
            )
            loss = loss + algo.kl_coef * kl
            metrics["actor/ref_kl"] = float(kl.detach())
        if algo.entropy_coef > 0:
            loss = loss - algo.entropy_coef * aggregate(entropy, mask, self.agg)
        return loss, metrics, int(mask.sum().item())

    def _rollout_weights(
        self, old: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The rollout correction's per-token weights of the policy loss (None when it is
        off): the engine's sampling log-probs against the trainer's old log-probs. The KL,
        entropy and DPH terms are not reweighed (as in TRL)."""
        algo = self.config.algorithm
        if not algo.rollout_correction:
            return None, {}
        return rollout_is_weights(
            old,
            rollout_lp,
            mask,
            algo.rollout_is,
            algo.rollout_is_threshold,
            algo.rollout_rs_threshold,
        )

    def reference_micro(self, rows: list[int]) -> tuple[torch.Tensor, dict, int]:
        """(divergence loss, metrics, response tokens) of the DPH reference samples ``rows``."""
        algo, samples = self.config.algorithm, self.reference_samples
        data = self._inputs(samples, rows)
        logits = response_logits(self.model, data)
        lp = token_log_probs(logits, data["responses"], self.config.rollout.temperature, self.chunk)
        ref = samples.ref_log_probs[rows, : lp.shape[1]].to(lp.device)
        loss, metrics = reference_divergence_loss(
            lp, ref, data["response_mask"], algo.divergence, algo.divergence_alpha, self.agg
        )
        return loss, metrics, int(data["response_mask"].sum().item())

    # ------------------------------------------------------------------ the optimiser step

    def _jobs(self, exp: Experience, seqs: list[int], refs: list[int]) -> list[tuple[str, list]]:
        jobs = [(ROLLOUT, c) for c in self.micro_batches(exp, seqs)] if seqs else []
        if refs:
            jobs += [(REFERENCE, c) for c in self.micro_batches(self.reference_samples, refs)]
        return jobs

    def _weights(self, exp: Experience, jobs: list[tuple[str, list]]) -> tuple[list[float], float]:
        """This process's micro-batch weights (times ``world``: DDP averages gradients) from
        all processes' micro-batch kinds and token counts, and the step's effective eta."""
        algo = self.config.algorithm
        pairs = {ROLLOUT: exp, REFERENCE: self.reference_samples}
        # the unit that splits a stream: tokens (token-mean), sequences (the per-micro-batch
        # token-mean of verl's actor)
        by_rows = self.agg == "micro-batch-token-mean"
        mine = [
            (kind, len(idx) if by_rows else int(pairs[kind].response_lengths[idx].sum()))
            for kind, idx in jobs
        ]
        parts = self.collective.all_gather_object(mine)
        offset = sum(len(p) for p in parts[: self.collective.rank])
        kinds = [k for part in parts for k, _ in part]
        tokens = [n for part in parts for _, n in part]
        # without reference samples every weighting is the rollouts' token share ('paper')
        mode = algo.divergence_weighting if REFERENCE in kinds else "paper"
        args = (kinds, tokens, self.eta, mode)
        kw = {"token_mean": self.agg == "token-mean" or by_rows, "layout": self.layout}
        weights = micro_batch_weights(*args, **kw)
        world = self.collective.world
        local = [w * world for w in weights[offset : offset + len(jobs)]]
        return local, stream_weights(*args, **kw).effective_eta

    def step(
        self, exp: Experience, seqs: list[int], refs: list[int], meter: MetricMeter, step: int
    ) -> bool:
        """Accumulate one mini-batch's gradients (rollout rows ``seqs``, reference rows
        ``refs``) and step the optimiser; False when the step was skipped (a non-finite loss
        or gradient norm)."""
        world = self.collective.world
        if self._scoped_lp_reg:
            self.select_lp_reg(exp, seqs, meter)
        jobs = self._jobs(exp, seqs, refs)
        weights, effective_eta = self._weights(exp, jobs)
        if self.reference_samples is not None:
            meter.add({"dph/effective_eta": effective_eta})
        nonfinite = objective = 0.0
        for j, ((kind, idx), weight) in enumerate(zip(jobs, weights, strict=True)):
            sync = j == len(jobs) - 1
            with contextlib.nullcontext() if sync else self.accelerator.no_sync(self.model):
                micro = (
                    self.policy_micro(exp, idx) if kind == ROLLOUT else self.reference_micro(idx)
                )
                loss, metrics, ntok = micro
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
