"""DPH-RL, Lp-Reg and divrl's other policy losses inside TRL's ``GRPOTrainer`` (optional
extra ``divrl[trl]``).

Switch a TRL script from ``GRPOConfig``/``GRPOTrainer`` to :class:`DivRLGRPOConfig` /
:class:`DivRLGRPOTrainer` and set the ``divergence*`` / ``reference_*`` or ``policy_loss`` /
``loss_options`` fields. The trainer calls TRL's own code for rollouts, rewards, advantages
and the policy loss, and adds:

- **DPH-RL**: ``divergence_coef * D_f`` on reference samples of the initial policy read from a divrl
  reference store (``divrl presample``), in the same ``compute_loss`` call, scaled like TRL's
  entropy bonus (a per-micro-batch token mean divided by the gradient-accumulation steps).
  No reference model is loaded: the store holds the initial policy's log-probs.
- **a registered policy loss** (``policy_loss``): the loss replaces TRL's clipped per-token
  loss (:func:`divrl.integrations.trl_loss.loss_replacement`), given the inputs its options
  declare. For a loss that needs the min-p proxy (Lp-Reg), the proxy log-probs are computed
  under no-grad from the hidden states of a forward TRL already runs (the old-log-prob
  forward when TRL computes one, otherwise the policy forward of the loss).

Which TRL internals are used, and how their change is caught, is listed in
:data:`TRL_HOOKS` and checked by :func:`check_trl_internals`; docs/trl.md has the details.

This module holds the trainer; its pieces live beside it: ``trl_hooks`` (the TRL internals
relied on and their checks), ``trl_config`` (:class:`DivRLGRPOConfig`), ``trl_data``
(datasets with divrl's prompt ids, the exploration filter, the verifier reward), ``trl_dph`` (the
reference-sample stream), ``trl_lp_reg`` (the proxy from captured hidden states),
``trl_loss`` (what a loss needs and the replacement term) and ``trl_provenance`` (the run's
provenance record). Every public name is importable from here.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

import torch
from trl import GRPOTrainer

from divrl.algorithms import reference_divergence_loss
from divrl.distributed import Collective, release_process_group, warn_if_ddp_wrappers_live
from divrl.integrations.trl_config import LP_REG_LOSS_TYPES, DivRLGRPOConfig
from divrl.integrations.trl_control import TrlRehearsalControl
from divrl.integrations.trl_data import (
    UNSCORABLE_METRIC,
    exploration_dataset,
    rollout_arguments,
    trl_dataset,
    verifier_reward,
)
from divrl.integrations.trl_dph import ReferenceStream
from divrl.integrations.trl_hooks import (
    ALLOW_UNTESTED_ENV,
    REQUIRED_INPUT_KEYS,
    REQUIRED_TRAINER_ATTRIBUTES,
    TESTED_TRL_VERSIONS,
    TRL_HOOKS,
    check_trl_internals,
    check_trl_version,
    internal_problem,
    raise_on_internal_problems,
)
from divrl.integrations.trl_loss import TRL_LOSS_INPUTS, loss_replacement, loss_type_scale
from divrl.integrations.trl_lp_reg import (
    LOG_Z_KEY,
    PROXY_CHUNK_LOGITS,
    PROXY_CONSISTENCY_TOL,
    PROXY_KEY,
    HiddenCapture,
    hidden_state_hook,
    lm_head_projection,
    proxy_from_hidden,
    refuse_sharded_training,
    unwrapped_causal_lm,
)
from divrl.integrations.trl_provenance import ProvenanceCallback, trl_provenance
from divrl.rewards.types import UnscorableShareError, unscorable_share_message
from divrl.rollout import pad_token_id

__all__ = [
    "ALLOW_UNTESTED_ENV",
    "LOG_Z_KEY",
    "LP_REG_LOSS_TYPES",
    "PROXY_CHUNK_LOGITS",
    "PROXY_CONSISTENCY_TOL",
    "PROXY_KEY",
    "REQUIRED_INPUT_KEYS",
    "REQUIRED_TRAINER_ATTRIBUTES",
    "TESTED_TRL_VERSIONS",
    "TRL_HOOKS",
    "TRL_LOSS_INPUTS",
    "DivRLGRPOConfig",
    "DivRLGRPOTrainer",
    "ProvenanceCallback",
    "check_trl_internals",
    "check_trl_version",
    "exploration_dataset",
    "trl_dataset",
    "trl_provenance",
    "verifier_reward",
]

#: the reference draws so far, in ``TrainerState.stateful_callbacks`` (saved with checkpoints)
DRAWS_STATE_KEY = "DivRLReferenceDraws"

# --------------------------------------------------------------------------- trainer


def end_at_exit(trainer: DivRLGRPOTrainer) -> None:
    """At interpreter exit (before torch's own exit handlers, registered earlier): call
    ``trainer.end()`` (nothing when it has ended already); when the trainer was collected
    before, with its DDP wrapper, release the process group it left."""
    ref = weakref.ref(trainer)

    def end() -> None:
        alive = ref()
        if alive is not None:
            alive.end()
        elif torch.distributed.is_initialized():
            release_process_group()

    atexit.register(end)


class DivRLGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with DPH-RL and/or a divrl policy loss; takes a
    :class:`DivRLGRPOConfig`.

    Same constructor as ``GRPOTrainer``. Overrides, each calling ``super()``:
    ``_get_per_token_logps_and_entropies`` (records log-probs, entropies and the proxy from
    the forward TRL runs), ``_generate_and_score_completions`` (adds the off-policy proxy to
    the batch; stops when more than ``max_unscorable`` of it was unscorable) and
    ``_compute_loss`` (adds the policy loss's replacement and the DPH term). Metrics go to
    TRL's logger under ``divrl/``; the run's provenance goes to ``output_dir``
    (:class:`ProvenanceCallback`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_trl_version()
        raise_on_internal_problems(check_trl_internals(GRPOTrainer))
        super().__init__(*rollout_arguments(args, kwargs), **kwargs)
        if not isinstance(self.args, DivRLGRPOConfig):
            raise TypeError(
                f"DivRLGRPOTrainer needs args=DivRLGRPOConfig(...), got {type(self.args).__name__}"
            )
        missing = [a for a in REQUIRED_TRAINER_ATTRIBUTES if not hasattr(self, a)]
        raise_on_internal_problems([f"GRPOTrainer no longer sets {missing}"] if missing else [])
        self._divrl_capture: HiddenCapture | None = None
        self._reference: ReferenceStream | None = None
        self._divrl_ended = False
        options = self.args.control_options  # DPH-RL's eta from a target, or None
        self._control = TrlRehearsalControl(options, self.args.divergence_coef) if options else None
        if torch.distributed.is_initialized():
            end_at_exit(self)  # the process group released without the user's end()
        if self.args.divergence is not None:
            tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
            lm = unwrapped_causal_lm(self.accelerator, self.model)
            self._reference = ReferenceStream(
                self.args.reference_store,
                self.temperature,
                self.args.seed,
                pad_token_id(tokenizer),
                model_path=getattr(lm, "name_or_path", ""),
                allow_mismatch=self.args.allow_store_mismatch,
                vocab_size=getattr(lm.config.get_text_config(), "vocab_size", None),
            )
            self._reference_seeked = False
        self.add_callback(ProvenanceCallback(self.train_dataset))
        if self._needs_proxy:
            refuse_sharded_training(self.accelerator)
            config = unwrapped_causal_lm(self.accelerator, self.model).config
            text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
            scaled = [
                name
                for name in (
                    "final_logit_softcapping",
                    "logit_scale",
                    "output_multiplier",
                    "lm_head_multiplier",
                    "logits_scaling",
                )
                if getattr(text_config, name, None) not in (None, 1.0)
            ]
            if scaled:
                raise ValueError(
                    f"{self.args.policy_loss_options.label()} does not support models whose "
                    f"logits are rescaled ({scaled}): the proxy projects hidden states through "
                    "the LM head alone"
                )

    @property
    def _needs_proxy(self) -> bool:
        """The policy loss declares it needs the min-p proxy (NEEDS_PROXY)."""
        options = self.args.policy_loss_options
        return options is not None and options.NEEDS_PROXY

    def end(self) -> None:
        """transformers' ``Trainer.end`` (finish the trackers, destroy the process group),
        with the DDP wrapper dropped first: when the wrapper is the group's last holder a
        rank can hang at exit (:func:`divrl.distributed.release_process_group`
        says why). Under several processes the trainer calls it itself when the
        interpreter exits; calling it after the last ``train()`` / ``save_model()`` ends
        earlier, and a second call does nothing."""
        if self._divrl_ended:
            return
        self._divrl_ended = True
        if torch.distributed.is_initialized():
            self.model_wrapped = self.model
            self.accelerator.free_memory()  # its references to the prepared model
            warn_if_ddp_wrappers_live()
        super().end()

    # ------------------------------------------------------------------ hooks into TRL

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
    ):
        cap = self._divrl_capture
        if cap is None or cap.done or (cap.only_model is not None and model is not cap.only_model):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        cap.done = True
        if not cap.want_proxy:
            out = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
            cap.log_probs, cap.entropies = out[0], out[1]
            return out
        lm = unwrapped_causal_lm(self.accelerator, model)
        tokens = input_ids[:, -logits_to_keep:]
        parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

        def project(hidden: torch.Tensor) -> None:
            # each chunk's hidden states become [rows, K] proxies at once (rows in order).
            # The head's gather (FSDP2, ZeRO-3) is a collective: it runs on every call, after
            # an error on this rank too, so every rank's gathers stay paired.
            try:
                with lm_head_projection(lm) as head:
                    if cap.error is None:
                        start = sum(p[0].shape[0] for p in parts)
                        rows = tokens[start : start + hidden.shape[0]]
                        parts.append(self._proxy(head, hidden, rows))
            except Exception as exc:
                cap.error = cap.error or exc

        with hidden_state_hook(lm.base_model, logits_to_keep, project):
            out = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        # An error here is recorded, not raised: TRL's collectives after this forward must
        # run on every rank; the caller raises it on all of them (_raise_on_any_rank).
        try:
            if cap.error is None:
                self._capture_proxy(cap, out[0], parts, attention_mask, logits_to_keep)
                cap.entropies = out[1]
        except Exception as exc:
            cap.error = exc
        return out

    def _proxy(self, head, hidden: torch.Tensor, tokens: torch.Tensor):
        """Proxy log-prob, log Z and plain log-prob of ``tokens`` from ``hidden`` through
        ``head`` (:func:`lm_head_projection`: whole, or gathered from FSDP2 / ZeRO-3 shards)."""
        kappa, autocast = self.args.policy_loss_options.kappa, self.accelerator.autocast
        return proxy_from_hidden(head, hidden, tokens, kappa, self.temperature, autocast)

    def _capture_proxy(self, cap, logps, parts, attention_mask, logits_to_keep):
        """The Lp-Reg proxy of the forward TRL just ran, checked against its log-probs."""
        if not parts or sum(p[0].shape[0] for p in parts) != logps.shape[0]:
            raise_on_internal_problems(
                ["the policy forward no longer runs the backbone module (Lp-Reg proxy hook)"]
            )
        proxy, log_z, check = (torch.cat(p) for p in zip(*parts, strict=True))
        mask = attention_mask[:, -logits_to_keep:].float()
        gap = ((check - logps.detach().float()).abs() * mask).sum() / mask.sum().clamp(min=1)
        if gap > PROXY_CONSISTENCY_TOL:
            raise_on_internal_problems(
                [
                    f"the LM-head projection of the hooked hidden states differs from TRL's "
                    f"log-probs by {float(gap):.3g} nats per token (Lp-Reg proxy)"
                ]
            )
        cap.log_probs, cap.proxy, cap.log_z = logps, proxy, log_z

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        logged = len(self._metrics[mode].get(UNSCORABLE_METRIC, ()))
        output = self._scored_completions(inputs)
        shares = self._metrics[mode].get(UNSCORABLE_METRIC, ())
        if mode == "train" and len(shares) > logged:  # verifier_reward logged this batch
            self._stop_on_unscorable(shares[-1], len(inputs) * self.accelerator.num_processes)
        return output

    def _stop_on_unscorable(self, share: float, n_total: int) -> None:
        """Stop (every rank alike: ``share`` is averaged over them) when more than
        ``args.max_unscorable`` of the batch's completions were unscorable."""
        limit = self.args.max_unscorable
        if share > limit:
            step = f"step {self.state.global_step + 1}"
            message = unscorable_share_message(
                step, round(share * n_total), n_total, limit, "max_unscorable"
            )
            raise UnscorableShareError(message)

    def _scored_completions(self, inputs):
        """TRL's batch, with the off-policy Lp-Reg proxy added."""
        if not (self._needs_proxy and self.model.training):
            return super()._generate_and_score_completions(inputs)
        # TRL computes old log-probs (off-policy) with a no-grad forward of self.model here:
        # the proxy comes from that forward, i.e. from pi_old.
        cap = HiddenCapture(want_proxy=True, only_model=self.model)
        self._divrl_capture = cap
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._divrl_capture = None
        error = cap.error
        if error is None and output.get("old_per_token_logps") is not None and cap.proxy is None:
            error = internal_problem(
                ["old_per_token_logps were computed without a policy forward the adapter saw"]
            )
        self._raise_on_any_rank(error)
        if output.get("old_per_token_logps") is not None:
            output[PROXY_KEY], output[LOG_Z_KEY] = cap.proxy, cap.log_z
        return output

    def _compute_loss(self, model, inputs):
        missing = sorted(REQUIRED_INPUT_KEYS - set(inputs))
        if missing:
            raise_on_internal_problems([f"the GRPO batch no longer has the keys {missing}"])
        train = self.model.training
        cap = None
        if self.args.policy_loss_options is not None and train:
            # On-policy TRL computes no old log-probs: take the proxy from this forward.
            cap = HiddenCapture(want_proxy=self._needs_proxy and PROXY_KEY not in inputs)
            self._divrl_capture = cap
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._divrl_capture = None
        if cap is None and not (self._reference is not None and train):
            return loss
        # Each rank computes its terms, then all learn whether one failed before the next
        # collective (the DPH forward, the metrics), so an error ends every rank.
        terms: list[tuple[torch.Tensor, dict[str, float]]] = []
        error, reference = None if cap is None else cap.error, None
        try:
            if cap is not None and error is None:
                if cap.log_probs is None:
                    raise_on_internal_problems(["_compute_loss no longer computes log-probs"])
                terms.append(self._loss_replacement(inputs, cap))
            if self._reference is not None and train and error is None:
                reference = self._draw_reference()
        except Exception as exc:
            error = exc
        self._raise_on_any_rank(error)
        if reference is not None:
            try:
                if self._control is not None:
                    self._control.begin(self.state)  # closes the last optimiser step
                rollouts = int(inputs["completion_ids"].shape[0])
                terms.append(self._dph_term(model, reference, rollouts))
            except Exception as exc:
                error = exc
            self._raise_on_any_rank(error)
        for term, metrics in terms:
            loss = loss + term
            reduced = self._log_divrl(metrics)
            if self._control is not None and "dph/log_u_mean" in reduced:
                self._log_divrl(self._control.record(reduced, self.state))
        return loss

    def _raise_on_any_rank(self, error: BaseException | None) -> None:
        """Raise ``error`` on its rank and, naming it, on every other rank (one all-reduce
        of a flag per call under several processes; the messages only on failure)."""
        acc = self.accelerator
        if acc.num_processes == 1:
            if error is not None:
                raise error
            return
        collective = Collective(acc.num_processes, acc.process_index, acc.device)
        if not collective.all_reduce([0.0 if error is None else 1.0], "max")[0]:
            return
        text = None if error is None else f"{type(error).__name__}: {error}"
        messages = collective.all_gather_object(text)
        if error is not None:
            raise error
        rank = next(r for r, m in enumerate(messages) if m is not None)
        raise RuntimeError(f"divrl's TRL adapter failed on rank {rank}: {messages[rank]}")

    # ------------------------------------------------------------------ the two methods

    def _grad_accum(self) -> float:
        return float(self.current_gradient_accumulation_steps)

    def _loss_replacement(
        self, inputs: dict[str, Any], cap: HiddenCapture
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``L_loss - L_clipped`` under TRL's reduction of ``self.loss_type``
        (:func:`divrl.integrations.trl_loss.loss_replacement`).

        TRL's loss already holds the clipped surrogate on every token; adding the difference
        replaces it by the policy loss's term and, for a loss that changes only some tokens
        (Lp-Reg), changes nothing elsewhere. With vLLM's importance-sampling correction each
        token of both terms carries TRL's weight (the config refuses a loss that takes none).
        """
        options = self.args.policy_loss_options
        lp = cap.log_probs
        old = inputs.get("old_per_token_logps")
        old = lp.detach() if old is None else old  # on-policy: r = 1
        if PROXY_KEY in inputs:  # from the old-log-prob forward at rollout time
            proxy, log_z = inputs[PROXY_KEY], inputs[LOG_Z_KEY]
        else:  # from this forward (None when the loss needs no proxy)
            proxy, log_z = cap.proxy, cap.log_z
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        # TRL multiplies its per-token loss by the truncated vLLM/trainer importance
        # weights before reducing it; both divrl terms get the same factor per token.
        weights = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            weights = inputs["importance_sampling_ratio"]
        entropies = None if cap.entropies is None else cap.entropies.detach()
        available = {  # TRL_LOSS_INPUTS: what the adapter hands a loss
            "proxy_log_prob": proxy,
            "log_normalizer": log_z,
            "entropy": entropies,
            "token_weights": weights,
            "selected": None,
        }
        scale = loss_type_scale(self, mask.float(), inputs["num_items_in_batch"])
        clip = (self.epsilon_low, self.epsilon_high)
        replacement, metrics = loss_replacement(
            options, lp, old, inputs["advantages"], mask, available, clip, scale
        )
        metrics[f"{options.LOSS}/replacement"] = float(replacement.detach()) * self._grad_accum()
        return replacement, metrics

    def _dph_scale(self, rollouts: int) -> float:
        """The factor on the reference micro-batch's divergence: ``divergence_coef``
        (``paper``), or ``divergence_coef * reference_batch_size / rollouts`` (``authors``:
        the reference stream weighs
        eta times its share of the samples, as in the DPH-RL authors' actor)."""
        eta = self.args.divergence_coef if self._control is None else self._control.eta
        if self.args.divergence_weighting == "paper":
            return eta
        return eta * self.args.reference_batch_size / max(rollouts, 1)

    def _draw_reference(self):
        """This process's reference samples for the next micro-batch (a local read)."""
        ref = self._reference
        assert ref is not None
        acc = self.accelerator
        per_device = self.args.reference_batch_size
        states = self.state.stateful_callbacks
        if states is None:
            states = self.state.stateful_callbacks = {}
        if not self._reference_seeked:
            # Resume-safe: the count of draws saved with the checkpoint training resumes
            # from (exact when an epoch ended mid-accumulation); a checkpoint without it
            # (an older adapter's) gives the count of full accumulation windows.
            saved = states.get(DRAWS_STATE_KEY) if self.state.global_step > 0 else None
            ref.seek(
                int(saved["drawn"])
                if saved is not None
                else self.state.global_step
                * self.args.gradient_accumulation_steps
                * per_device
                * acc.num_processes
            )
            self._reference_seeked = True
        batch = ref.next_batch(per_device, acc.process_index, acc.num_processes, acc.device)
        # kept where transformers saves TrainerState (trainer_state.json of each checkpoint)
        states[DRAWS_STATE_KEY] = {"drawn": ref.drawn}
        return batch

    def _dph_term(
        self, model: torch.nn.Module, batch, rollouts: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``divergence_coef * D_f`` (scaled per ``divergence_weighting``) on a micro-batch
        of reference samples (``batch``, from :meth:`_draw_reference`), divided by the GA
        steps; ``rollouts`` = completions in this micro-batch. Returns it and its metrics."""
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model, batch.input_ids, batch.attention_mask, batch.logits_to_keep
        )
        lp = logps.gather(1, batch.columns)
        divergence, metrics = reference_divergence_loss(
            lp,
            batch.ref_log_probs,
            batch.mask,
            self.args.divergence,
            self.args.divergence_alpha,
        )
        term = self._dph_scale(rollouts) * divergence / self._grad_accum()
        metrics["dph/loss"] = self._dph_scale(rollouts) * metrics["dph/divergence"]
        metrics["dph/response_length"] = float(batch.mask.sum(-1).mean())
        return term, metrics

    def _log_divrl(self, metrics: dict[str, float]) -> dict[str, float]:
        """Append ``metrics`` (averaged over processes) to TRL's logger as ``divrl/<name>``;
        returns the averaged values."""
        mode = "train" if self.model.training else "eval"
        keys = sorted(metrics)
        values = torch.tensor([metrics[k] for k in keys], device=self.accelerator.device)
        values = self.accelerator.reduce(values, reduction="mean")
        reduced = dict(zip(keys, values.tolist(), strict=True))
        for key, value in reduced.items():
            self._metrics[mode][f"divrl/{key}"].append(value)
        return reduced
