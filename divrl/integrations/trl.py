"""DPH-RL and Lp-Reg inside TRL's ``GRPOTrainer`` (optional extra ``divrl[trl]``).

Switch a TRL script from ``GRPOConfig``/``GRPOTrainer`` to :class:`DivRLGRPOConfig` /
:class:`DivRLGRPOTrainer` and set the ``dph_*`` or ``lp_reg*`` fields. The trainer calls
TRL's own code for rollouts, rewards, advantages and the policy loss, and adds:

- **DPH-RL**: ``dph_eta * D_f`` on reference samples of the initial policy read from a divrl
  reference store (``divrl presample``), in the same ``compute_loss`` call, scaled like TRL's
  entropy bonus (a per-micro-batch token mean divided by the gradient-accumulation steps).
  No reference model is loaded: the store holds the initial policy's log-probs.
- **Lp-Reg**: the min-p proxy log-probs are computed under no-grad from the hidden states of
  a forward TRL already runs (the old-log-prob forward when TRL computes one, otherwise the
  policy forward of the loss) and :func:`divrl.algorithms.lp_reg_loss` replaces TRL's
  per-token loss on the selected negative-advantage low-probability tokens.

Which TRL internals are used, and how their change is caught, is listed in
:data:`TRL_HOOKS` and checked by :func:`check_trl_internals`; docs/trl.md has the details.
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from trl import GRPOConfig, GRPOTrainer

from divrl.algorithms import (
    DIVERGENCES,
    divergence_generator,
    lp_reg_loss,
    minp_log_normalizer,
    policy_loss,
    proxy_log_prob,
    reference_divergence_loss,
    token_log_probs,
)
from divrl.data.reference_store import ReferenceStore
from divrl.data.sampling import EpochSampler

__all__ = [
    "TESTED_TRL_VERSIONS",
    "DivRLGRPOConfig",
    "DivRLGRPOTrainer",
    "check_trl_internals",
    "check_trl_version",
]

# The TRL releases this adapter was tested against; pyproject's `trl` extra pins the same.
TESTED_TRL_VERSIONS = SpecifierSet(">=1.16,<1.17")
# Set to 1 to run an untested TRL release anyway (a warning instead of an error).
ALLOW_UNTESTED_ENV = "DIVRL_ALLOW_UNTESTED_TRL"

# TRL methods the adapter overrides or calls, with the parameters it passes or relies on.
TRL_HOOKS: dict[str, tuple[str, ...]] = {
    "_compute_loss": ("model", "inputs"),
    "_get_per_token_logps_and_entropies": (
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ),
    "_generate_and_score_completions": ("inputs",),
}
# Keys of the batch dict that `_generate_and_score_completions` returns and the adapter reads.
REQUIRED_INPUT_KEYS = frozenset(
    {
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "advantages",
        "num_items_in_batch",
    }
)
# Trainer attributes set by GRPOTrainer.__init__ that the adapter reads.
REQUIRED_TRAINER_ATTRIBUTES = (
    "_metrics",
    "accelerator",
    "temperature",
    "loss_type",
    "epsilon_low",
    "epsilon_high",
    "max_completion_length",
    "beta",
)
# Batch keys the adapter adds (off-policy Lp-Reg): TRL splits and shuffles them with the rest.
PROXY_KEY, LOG_Z_KEY = "divrl_proxy_log_probs", "divrl_proxy_log_z"

# Loss types whose per-token loss is the clipped surrogate Lp-Reg replaces, with the divrl
# aggregation mode that matches TRL's reduction (a further scale is applied in the trainer).
LP_REG_LOSS_TYPES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "token-mean",
    "dapo": "token-mean",
}
# Proxy positions projected through the LM head at once (bounds the fp32 logits' memory).
PROXY_CHUNK_POSITIONS = 1024
# Largest mean |log p| gap between the adapter's LM-head projection and TRL's log-probs
# before the proxy is declared inconsistent (bf16 autocast noise is far below this; a
# logit scale or soft-cap the adapter does not apply is far above).
PROXY_CONSISTENCY_TOL = 0.05


# --------------------------------------------------------------------------- checks


def check_trl_version(version: str | None = None) -> None:
    """Raise if the installed TRL is outside :data:`TESTED_TRL_VERSIONS`.

    Set the environment variable ``DIVRL_ALLOW_UNTESTED_TRL=1`` to get a warning instead;
    the internals check (:func:`check_trl_internals`) still runs.
    """
    version = trl.__version__ if version is None else version
    if Version(version) in TESTED_TRL_VERSIONS:
        return
    message = (
        f"divrl's TRL integration is tested with trl{TESTED_TRL_VERSIONS}, found trl {version}: "
        f'install a tested release (pip install "divrl[trl]") or set {ALLOW_UNTESTED_ENV}=1 '
        "to try this one"
    )
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        warnings.warn(message, stacklevel=2)
        return
    raise RuntimeError(message)


def check_trl_internals(trainer_cls: type = GRPOTrainer) -> list[str]:
    """Problems with the TRL internals the adapter relies on (empty when all is well).

    Checks that every method in :data:`TRL_HOOKS` exists on ``trainer_cls`` and accepts the
    listed parameters. The batch keys (:data:`REQUIRED_INPUT_KEYS`) and trainer attributes
    (:data:`REQUIRED_TRAINER_ATTRIBUTES`) are checked at run time by the trainer itself.
    """
    problems = []
    for name, params in TRL_HOOKS.items():
        method = getattr(trainer_cls, name, None)
        if not callable(method):
            problems.append(f"{trainer_cls.__name__}.{name} is missing")
            continue
        accepted = inspect.signature(method).parameters
        missing = [p for p in params if p not in accepted]
        if missing:
            problems.append(f"{trainer_cls.__name__}.{name} no longer accepts {missing}")
    return problems


def _raise_on_internal_problems(problems: list[str]) -> None:
    if problems:
        raise RuntimeError(
            f"trl {trl.__version__} changed internals divrl's TRL integration relies on: "
            + "; ".join(problems)
            + f". Use trl{TESTED_TRL_VERSIONS} (see docs/trl.md)."
        )


# --------------------------------------------------------------------------- config


@dataclass
class DivRLGRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus the DPH-RL and Lp-Reg fields (see docs/trl.md).

    DPH-RL is on when ``dph_divergence`` is set, Lp-Reg when ``lp_reg`` is true; both may
    be on together. Everything else is TRL's own configuration.
    """

    dph_divergence: str | None = field(
        default=None,
        metadata={
            "help": "DPH-RL divergence on the reference samples: 'forward_kl' (DPH-F), 'js' "
            "(DPH-JS), 'reverse_kl' or 'alpha'. None (default) turns DPH-RL off.",
        },
    )
    dph_eta: float = field(
        default=0.2,
        metadata={
            "help": "Weight of the divergence term: loss = TRL's loss + dph_eta * D_f. The "
            "authors use 0.2 for JS (0.05 to 0.2 recommended) and 0.01 to 0.05 for forward "
            "KL. 0 computes and logs the divergence without training on it.",
        },
    )
    dph_alpha: float | None = field(
        default=None,
        metadata={"help": "alpha in (0, 1) for dph_divergence='alpha' (paper: 0.2, 0.5, 0.8)."},
    )
    dph_reference_store: str | None = field(
        default=None,
        metadata={
            "help": "Directory of a divrl reference store (written by `divrl presample`): "
            "responses of the initial policy with their per-token log-probs. Required with "
            "dph_divergence.",
        },
    )
    dph_batch_size: int = field(
        default=1,
        metadata={
            "help": "Reference samples per device per micro-batch (each compute_loss call). "
            "They cycle through the store in a seeded order (args.seed).",
        },
    )
    lp_reg: bool = field(
        default=False,
        metadata={
            "help": "Turn Lp-Reg on: regularise the lowest-probability negative-advantage tokens "
            "toward a min-p proxy of the policy. The authors also set epsilon=1.0 and "
            "epsilon_high=9.0 (the clip range of every other token).",
        },
    )
    lp_reg_kappa: float = field(
        default=0.02,
        metadata={"help": "Min-p ratio of the Lp-Reg proxy: keep tokens with p >= kappa * max p."},
    )
    lp_reg_rho: float = field(
        default=0.01,
        metadata={
            "help": "Share of the micro-batch's negative-advantage tokens selected (lowest "
            "probability first); paper 0.01, 0.005 for 32B models. As in the authors' code "
            "nothing is selected while floor(rho * N_negative) < 2.",
        },
    )
    lp_reg_beta: float = field(
        default=1.0,
        metadata={"help": "Weight of the Lp-Reg penalty toward the proxy (paper: 1.0)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._validate_dph()
        if self.lp_reg:
            self._validate_lp_reg()

    def _validate_dph(self) -> None:
        if self.dph_divergence is None:
            if self.dph_reference_store is not None:
                raise ValueError(
                    "dph_reference_store is set but dph_divergence is None: set dph_divergence "
                    f"(one of {sorted(DIVERGENCES)}) to use the store, or drop the store"
                )
            return
        if self.dph_divergence not in DIVERGENCES:
            raise ValueError(
                f"unknown dph_divergence {self.dph_divergence!r}: use one of {sorted(DIVERGENCES)}"
            )
        divergence_generator(self.dph_divergence, self.dph_alpha)  # validates alpha
        if self.dph_reference_store is None:
            raise ValueError(
                "DPH-RL needs a reference store: set dph_reference_store to the directory "
                "`divrl presample` wrote"
            )
        if not (self.dph_eta >= 0 and math.isfinite(self.dph_eta)):
            raise ValueError(f"dph_eta must be a finite number >= 0, got {self.dph_eta}")
        if self.dph_batch_size < 1:
            raise ValueError(f"dph_batch_size must be >= 1, got {self.dph_batch_size}")
        if self.beta != 0.0:
            raise ValueError(
                f"beta={self.beta} loads a reference model for TRL's reverse-KL term; DPH-RL "
                "replaces it with the divergence on stored reference samples: set beta=0.0"
            )

    def _validate_lp_reg(self) -> None:
        if not 0.0 <= self.lp_reg_kappa <= 1.0:
            raise ValueError(
                f"lp_reg_kappa must be in [0, 1] (paper: 0.02), got {self.lp_reg_kappa}"
            )
        if not 0.0 < self.lp_reg_rho <= 1.0:
            raise ValueError(f"lp_reg_rho must be in (0, 1] (paper: 0.01), got {self.lp_reg_rho}")
        if not self.lp_reg_beta >= 0.0:
            raise ValueError(f"lp_reg_beta must be >= 0 (paper: 1.0), got {self.lp_reg_beta}")
        # Lp-Reg replaces TRL's clipped per-token loss on a few tokens; the settings below
        # change that per-token loss in ways the replacement would not reproduce.
        if self.loss_type not in LP_REG_LOSS_TYPES:
            raise ValueError(
                f"lp_reg needs a clipped-surrogate loss_type, one of {sorted(LP_REG_LOSS_TYPES)}; "
                f"got {self.loss_type!r}"
            )
        unsupported = {
            "importance_sampling_level='sequence' (set 'token')": (
                self.importance_sampling_level != "token"
            ),
            "delta (set delta=None)": self.delta is not None,
            "off_policy_mask_threshold (set it to None)": self.off_policy_mask_threshold
            is not None,
            "top_entropy_quantile < 1 (set 1.0)": self.top_entropy_quantile < 1.0,
            "vLLM importance-sampling correction (set vllm_importance_sampling_correction=False)": (
                self.use_vllm and self.vllm_importance_sampling_correction
            ),
        }
        bad = [name for name, on in unsupported.items() if on]
        if bad:
            raise ValueError("lp_reg does not support " + "; ".join(bad))


# --------------------------------------------------------------------------- helpers


@dataclass
class _Capture:
    """What one wrapped ``_get_per_token_logps_and_entropies`` call records."""

    want_proxy: bool
    only_model: torch.nn.Module | None = None  # record only a call on this model
    log_probs: torch.Tensor | None = None  # [B, K], with grad when the forward had it
    proxy: torch.Tensor | None = None  # [B, K] log proxy(token), detached
    log_z: torch.Tensor | None = None  # [B, K] log Z of the proxy, detached
    done: bool = False


@contextmanager
def _hidden_state_hook(backbone: torch.nn.Module, logits_to_keep: int, out: list) -> Iterator:
    """Collect the detached hidden states that predict the last ``logits_to_keep`` tokens."""

    def hook(module, args, output):
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None:
            hidden = output[0]
        out.append(hidden[:, -(logits_to_keep + 1) : -1].detach())

    handle = backbone.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def _proxy_from_hidden(
    lm_head: torch.nn.Module,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    kappa: float,
    temperature: float,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
    chunk: int = PROXY_CHUNK_POSITIONS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Proxy log-prob, ``log Z`` and plain log-prob of ``tokens`` from ``hidden`` ``[B, K, H]``.

    The LM head runs under ``autocast()`` (the trainer passes the one TRL's forward runs
    under, so the logits match TRL's), on ``chunk`` positions at a time, so the
    ``[B, K, vocab]`` logits never exist at once. Returns three ``[B, K]`` fp32 tensors.
    """
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = tokens.reshape(-1)
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for start in range(0, flat_h.shape[0], chunk):
        with autocast():
            logits = lm_head(flat_h[start : start + chunk])
        logits = logits.float()
        toks = flat_t[start : start + chunk]
        parts.append(
            (
                proxy_log_prob(logits, toks, kappa, temperature),
                minp_log_normalizer(logits, kappa, temperature),
                token_log_probs(logits, toks, temperature),
            )
        )
    return tuple(torch.cat(p).view(tokens.shape) for p in zip(*parts, strict=True))  # type: ignore[return-value]


def _unwrapped_causal_lm(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    unwrapped = accelerator.unwrap_model(model)
    get_base = getattr(unwrapped, "get_base_model", None)  # PEFT
    return get_base() if callable(get_base) else unwrapped


@dataclass
class _ReferenceBatch:
    input_ids: torch.Tensor  # [B, T] prompt + response, right-padded
    attention_mask: torch.Tensor  # [B, T]
    logits_to_keep: int  # the last K positions hold every response token
    columns: torch.Tensor  # [B, R] column of each response token in the [B, K] log-probs
    ref_log_probs: torch.Tensor  # [B, R]
    mask: torch.Tensor  # [B, R]


class _ReferenceStream:
    """Seeded, cycling draws from a divrl reference store, identical on every process.

    Draw ``n`` (counted over the run, all processes together) is a pure function of the seed
    and ``n``, so a resumed run continues the same order (the count restarts from the resumed
    optimizer step).
    """

    def __init__(self, path: str, temperature: float, seed: int, pad_token_id: int) -> None:
        store = ReferenceStore.open(path, temperature=temperature)
        self.samples = store.samples
        self.sampler = EpochSampler(len(store), seed, shuffle=True)
        self.pad_token_id = pad_token_id
        self.drawn = 0  # samples drawn so far, all processes

    def seek(self, drawn: int) -> None:
        n = len(self.samples)
        self.sampler.load_state_dict({"epoch": drawn // n, "position": drawn % n, "size": n})
        self.drawn = drawn

    def next_batch(
        self, per_device: int, rank: int, world: int, device: torch.device
    ) -> _ReferenceBatch:
        indices = self.sampler.take(per_device * world)[rank * per_device : (rank + 1) * per_device]
        self.drawn += per_device * world
        rows = [self.samples[i] for i in indices]
        prompt_lens = [len(r.prompt_ids) for r in rows]
        resp_lens = [len(r.response_ids) for r in rows]
        if min(resp_lens) == 0:
            raise ValueError("the reference store holds an empty response; presample again")
        total = max(p + r for p, r in zip(prompt_lens, resp_lens, strict=True))
        # Right padding keeps every row's positions at 0..len-1, as when the reference
        # log-probs were computed, so u = pi_theta / pi_ref is exactly 1 at initialisation.
        input_ids = torch.full((len(rows), total), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), total), dtype=torch.long)
        width = max(resp_lens)
        ref = torch.zeros((len(rows), width), dtype=torch.float32)
        mask = torch.zeros((len(rows), width), dtype=torch.float32)
        keep = total - min(prompt_lens)
        columns = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            seq = list(row.prompt_ids) + list(row.response_ids)
            input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attention[i, : len(seq)] = 1
            if len(row.ref_log_probs) != resp_lens[i]:
                raise ValueError(
                    f"reference sample of prompt {row.prompt_id!r} has {resp_lens[i]} response "
                    f"tokens but {len(row.ref_log_probs)} log-probs"
                )
            ref[i, : resp_lens[i]] = torch.tensor(row.ref_log_probs, dtype=torch.float32)
            mask[i, : resp_lens[i]] = 1.0
            first = prompt_lens[i] - (total - keep)
            columns[i] = torch.clamp(torch.arange(first, first + width), max=keep - 1)
        return _ReferenceBatch(
            input_ids.to(device),
            attention.to(device),
            keep,
            columns.to(device),
            ref.to(device),
            mask.to(device),
        )


# --------------------------------------------------------------------------- trainer


class DivRLGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with DPH-RL and/or Lp-Reg; takes a :class:`DivRLGRPOConfig`.

    Same constructor as ``GRPOTrainer``. Overrides, each calling ``super()``:
    ``_get_per_token_logps_and_entropies`` (records log-probs and the Lp-Reg proxy from the
    forward TRL runs), ``_generate_and_score_completions`` (adds the off-policy proxy to the
    batch) and ``_compute_loss`` (adds the Lp-Reg replacement and the DPH term). Metrics go
    to TRL's logger under ``divrl/``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_trl_version()
        _raise_on_internal_problems(check_trl_internals(GRPOTrainer))
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, DivRLGRPOConfig):
            raise TypeError(
                f"DivRLGRPOTrainer needs args=DivRLGRPOConfig(...), got {type(self.args).__name__}"
            )
        missing = [a for a in REQUIRED_TRAINER_ATTRIBUTES if not hasattr(self, a)]
        _raise_on_internal_problems([f"GRPOTrainer no longer sets {missing}"] if missing else [])
        self._divrl_capture: _Capture | None = None
        self._reference: _ReferenceStream | None = None
        if self.args.dph_divergence is not None:
            tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
            pad = getattr(tokenizer, "pad_token_id", None)
            if pad is None:
                pad = getattr(tokenizer, "eos_token_id", None)
            self._reference = _ReferenceStream(
                self.args.dph_reference_store,
                self.temperature,
                self.args.seed,
                0 if pad is None else int(pad),
            )
            self._reference_seeked = False
        if self.args.lp_reg:
            config = _unwrapped_causal_lm(self.accelerator, self.model).config
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
                    f"lp_reg does not support models whose logits are rescaled ({scaled}): the "
                    "proxy projects hidden states through the LM head alone"
                )

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
            cap.log_probs = out[0]
            return out
        lm = _unwrapped_causal_lm(self.accelerator, model)
        hidden: list[torch.Tensor] = []
        with _hidden_state_hook(lm.base_model, logits_to_keep, hidden):
            out = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        logps = out[0]
        if not hidden or sum(h.shape[0] for h in hidden) != logps.shape[0]:
            _raise_on_internal_problems(
                ["the policy forward no longer runs the backbone module (Lp-Reg proxy hook)"]
            )
        tokens = input_ids[:, -logits_to_keep:]
        proxy, log_z, check = _proxy_from_hidden(
            lm.get_output_embeddings(),
            torch.cat(hidden),
            tokens,
            self.args.lp_reg_kappa,
            self.temperature,
            self.accelerator.autocast,
        )
        mask = attention_mask[:, -logits_to_keep:].float()
        gap = ((check - logps.detach().float()).abs() * mask).sum() / mask.sum().clamp(min=1)
        if gap > PROXY_CONSISTENCY_TOL:
            _raise_on_internal_problems(
                [
                    f"the LM-head projection of the hooked hidden states differs from TRL's "
                    f"log-probs by {float(gap):.3g} nats per token (Lp-Reg proxy)"
                ]
            )
        cap.log_probs, cap.proxy, cap.log_z = logps, proxy, log_z
        return out

    def _generate_and_score_completions(self, inputs):
        if not (self.args.lp_reg and self.model.training):
            return super()._generate_and_score_completions(inputs)
        # TRL computes old log-probs (off-policy) with a no-grad forward of self.model here:
        # the proxy comes from that forward, i.e. from pi_old.
        cap = _Capture(want_proxy=True, only_model=self.model)
        self._divrl_capture = cap
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._divrl_capture = None
        if output.get("old_per_token_logps") is not None:
            if cap.proxy is None:
                _raise_on_internal_problems(
                    ["old_per_token_logps were computed without a policy forward the adapter saw"]
                )
            output[PROXY_KEY], output[LOG_Z_KEY] = cap.proxy, cap.log_z
        return output

    def _compute_loss(self, model, inputs):
        missing = sorted(REQUIRED_INPUT_KEYS - set(inputs))
        if missing:
            _raise_on_internal_problems([f"the GRPO batch no longer has the keys {missing}"])
        train = self.model.training
        cap = None
        if self.args.lp_reg and train:
            # On-policy TRL computes no old log-probs: take the proxy from this forward.
            cap = _Capture(want_proxy=PROXY_KEY not in inputs)
            self._divrl_capture = cap
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._divrl_capture = None
        if cap is not None:
            if cap.log_probs is None:
                _raise_on_internal_problems(["_compute_loss no longer computes log-probs"])
            loss = loss + self._lp_reg_replacement(inputs, cap)
        if self._reference is not None and train:
            loss = loss + self._dph_term(model)
        return loss

    # ------------------------------------------------------------------ the two methods

    def _grad_accum(self) -> float:
        return float(self.current_gradient_accumulation_steps)

    def _lp_reg_replacement(self, inputs: dict[str, Any], cap: _Capture) -> torch.Tensor:
        """``L_lp_reg - L_clipped`` under TRL's reduction of ``self.loss_type``.

        TRL's loss already holds the clipped surrogate on every token; adding the difference
        replaces it by Lp-Reg's term on the regularised tokens and changes nothing elsewhere
        (both divrl losses share one clipped surrogate with TRL's epsilons).
        """
        lp = cap.log_probs
        old = inputs.get("old_per_token_logps")
        old = lp.detach() if old is None else old  # on-policy: r = 1
        if PROXY_KEY in inputs:  # from the old-log-prob forward at rollout time
            proxy, log_z = inputs[PROXY_KEY], inputs[LOG_Z_KEY]
        else:  # from this forward
            proxy, log_z = cap.proxy, cap.log_z
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        agg = LP_REG_LOSS_TYPES[self.loss_type]
        clip = {"clip_low": self.epsilon_low, "clip_high": self.epsilon_high, "agg": agg}
        lp_loss, metrics = lp_reg_loss(
            lp,
            old,
            proxy,
            inputs["advantages"],
            mask,
            rho=self.args.lp_reg_rho,
            beta=self.args.lp_reg_beta,
            log_normalizer=log_z,
            **clip,
        )
        pg_loss, _ = policy_loss(lp, old, inputs["advantages"], mask, **clip)
        mask = mask.float()
        rows = mask.shape[0]
        ga = self._grad_accum()
        # TRL's reductions (grpo_trainer._compute_loss) expressed as scale * divrl's `agg`.
        if self.loss_type == "grpo":  # divrl leaves out empty rows, TRL counts them as 0
            scale = float((mask.sum(-1) > 0).sum()) / rows / ga
        elif self.loss_type == "bnpo":
            scale = 1.0 / ga
        elif self.loss_type == "dr_grpo":
            scale = float(mask.sum()) / (rows * self.max_completion_length) / ga
        else:  # dapo: token sum over the accumulated global batch's token count
            normalizer = (
                inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            )
            normalizer = normalizer * ga / self.args.steps_per_generation
            scale = float(mask.sum() / normalizer)
        replacement = (lp_loss - pg_loss) * scale
        metrics = {k: v for k, v in metrics.items() if k.startswith("lp_reg/")}
        metrics["lp_reg/replacement"] = float(replacement.detach()) * ga
        self._log_divrl(metrics)
        return replacement

    def _dph_term(self, model: torch.nn.Module) -> torch.Tensor:
        """``dph_eta * D_f`` on a micro-batch of reference samples, divided by the GA steps."""
        ref = self._reference
        assert ref is not None
        acc = self.accelerator
        per_device = self.args.dph_batch_size
        if not self._reference_seeked:
            # Resume-safe: the first draw follows from the optimizer step training starts at.
            ref.seek(
                self.state.global_step
                * self.args.gradient_accumulation_steps
                * per_device
                * acc.num_processes
            )
            self._reference_seeked = True
        batch = ref.next_batch(per_device, acc.process_index, acc.num_processes, acc.device)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model, batch.input_ids, batch.attention_mask, batch.logits_to_keep
        )
        lp = logps.gather(1, batch.columns)
        divergence, metrics = reference_divergence_loss(
            lp,
            batch.ref_log_probs,
            batch.mask,
            self.args.dph_divergence,
            self.args.dph_alpha,
        )
        term = self.args.dph_eta * divergence / self._grad_accum()
        metrics["dph/loss"] = self.args.dph_eta * metrics["dph/divergence"]
        metrics["dph/response_length"] = float(batch.mask.sum(-1).mean())
        self._log_divrl(metrics)
        return term

    def _log_divrl(self, metrics: dict[str, float]) -> None:
        """Append ``metrics`` (averaged over processes) to TRL's logger as ``divrl/<name>``."""
        mode = "train" if self.model.training else "eval"
        keys = sorted(metrics)
        values = torch.tensor([metrics[k] for k in keys], device=self.accelerator.device)
        values = self.accelerator.reduce(values, reduction="mean")
        for key, value in zip(keys, values.tolist(), strict=True):
            self._metrics[mode][f"divrl/{key}"].append(value)
