"""Rollouts with divrl's own decode loop: a pre-allocated KV cache, one batched forward step
per token, sampling on tensors, and finished responses leaving the batch.

On a CPU, transformers ``generate`` spends as much time on per-token bookkeeping (a cache
that grows by concatenation, logits processors, stopping criteria, mask building) as on
the model's matrix products; this loop keeps only the products and a few tensor ops per
token. It returns what :class:`~divrl.rollout.hf.HFEngine` returns: the same tokens under
greedy decoding, the sampled tokens' log-probs at the sampling temperature before top-k /
top-p truncation, the same truncation flags and stop-string ends.

Supported models: the Llama and Qwen2 architectures of transformers (the toy model is a
Llama), without sliding-window layers; others are refused with the fix (``hf``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from divrl.rollout.base import PromptIds, RolloutOutput, SamplingParams, Seeds
from divrl.rollout.hf import HFEngine, HFOptions, build_hf
from divrl.rollout.registry import (
    EngineContext,
    EngineError,
    register_engine,
    register_policy_engine,
)

__all__ = ["StaticCacheEngine", "StaticOptions", "unsupported_reason", "word_log_probs"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
# Finished rows stay in the batch (their extra tokens are cut afterwards) until they are at
# least this share of it; then the batch is compacted. A compaction copies the filled cache,
# about one step's work, so compacting on every single finished row would cost more than it
# saves.
COMPACT_SHARE = 1 / 8


#: what the refusals say to do instead
USE_HF = "use the hf engine (rollout.engine=hf for divrl train and presample, --engine hf for eval)"


def unsupported_config_reason(config: Any) -> str | None:
    """Why a model of this transformers ``config`` cannot run in this engine, or None."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model_type {kind!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "the model has sliding-window attention layers"
    return None


def _model_check(config: Any) -> str | None:
    reason = unsupported_config_reason(config)
    return None if reason is None else f"{reason}; {USE_HF}"


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot run in this engine, or None when it can."""
    reason = unsupported_config_reason(getattr(model, "config", None))
    if reason is not None:
        return reason
    body = getattr(model, "model", None)
    if not all(hasattr(body, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "the model lacks the Llama layout (model.embed_tokens/layers/norm/rotary_emb)"
    return None


@dataclass
class _Net:
    """The modules of a Llama-layout causal LM that the decode loop calls directly."""

    embed: torch.nn.Module
    layers: list[torch.nn.Module]
    norm: torch.nn.Module
    rotary: torch.nn.Module
    head: torch.nn.Module

    @classmethod
    def of(cls, model: torch.nn.Module) -> _Net:
        body = model.model
        return cls(body.embed_tokens, list(body.layers), body.norm, body.rotary_emb, model.lm_head)


class _Cache:
    """Keys and values of every layer, ``[rows, kv_heads, length, head_dim]``, allocated once
    for prompt + response and filled left to right (column = token index in the padded
    row), so that a decode step writes one contiguous ``head_dim`` run per row and head."""

    def __init__(self, net: _Net, rows: int, length: int, like: torch.Tensor) -> None:
        self.k, self.v = [], []
        for layer in net.layers:
            a = layer.self_attn
            shape = (rows, a.k_proj.out_features // a.head_dim, length, a.head_dim)
            self.k.append(torch.empty(shape, dtype=like.dtype, device=like.device))
            self.v.append(torch.empty(shape, dtype=like.dtype, device=like.device))

    def keep(self, slots: torch.Tensor, filled: int) -> None:
        """Keep only the rows ``slots``, copying the ``filled`` columns that hold anything."""
        for kv in (self.k, self.v):
            for i, old in enumerate(kv):
                kv[i] = old.new_empty((len(slots), *old.shape[1:]))
                kv[i][:, :, :filled] = old[slots, :, :filled]


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention as two batched matrix products. On a CPU this beats the fused
    ``scaled_dot_product_attention`` kernel, which is made for long queries, several times
    over for the one-token query of a decode step. Grouped-query heads share their key
    head by folding the group into the query axis (no repeated keys)."""
    batch, heads, length, dim = q.shape
    groups = heads // k.shape[1]
    q = q.reshape(batch, k.shape[1], groups * length, dim)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if groups > 1:
        mask = mask.repeat(1, 1, groups, 1)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v).reshape(batch, heads, length, dim)


def _forward(
    net: _Net,
    ids: torch.Tensor,
    positions: torch.Tensor,
    cache: _Cache,
    start: int,
    mask: torch.Tensor,
    every_position: bool = False,
) -> torch.Tensor:
    """Run ``ids`` ``[B, S]`` into cache columns ``start .. start + S``; ``mask``
    ``[B, 1, S, start + S]`` (True = attend). Returns the last position's fp32 logits
    ``[B, V]``, or with ``every_position`` every position's, ``[B, S, V]``."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    batch, length = ids.shape
    end = start + length
    h = net.embed(ids)
    cos, sin = net.rotary(h, positions)
    for layer, k_cache, v_cache in zip(net.layers, cache.k, cache.v, strict=True):
        a = layer.self_attn
        x = layer.input_layernorm(h)
        q = a.q_proj(x).view(batch, length, -1, a.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(batch, length, -1, a.head_dim).transpose(1, 2)
        v_cache[:, :, start:end] = a.v_proj(x).view(batch, length, -1, a.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k_cache[:, :, start:end] = k
        o = _attention(q, k_cache[:, :, :end], v_cache[:, :, :end], mask, a.scaling)
        h = h + a.o_proj(o.transpose(1, 2).reshape(batch, length, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return net.head(net.norm(h if every_position else h[:, -1])).float()


@torch.no_grad()
def word_log_probs(
    model: torch.nn.Module,
    context: Sequence[int],
    starts: torch.Tensor,
    words: Sequence[Sequence[int]],
) -> list[torch.Tensor]:
    """For each word, ``log P(word | context[:s])`` at each start ``s`` of ``starts``
    (``[T]``, each from 1 to ``len(context)``): the log-probabilities of the word's tokens in
    turn after the first ``s`` context tokens, summed, for a model :func:`unsupported_reason`
    accepts.

    Scoring ``context[:s] + word`` as its own sequence for every ``s`` runs the context
    again for every start; here it runs once (its keys and values cached, every position's
    logits giving each start's first word token) and the rest of each word, one row per
    start, attends to the cached columns before its start only. Same numbers as the
    separate sequences up to the order of float sums.
    """
    net = _Net.of(model)
    length, device = len(context), net.embed.weight.device
    cache = _Cache(net, 1, length, net.embed.weight)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    ids = torch.as_tensor([list(context)], device=device)
    positions = torch.arange(length, device=device)[None]
    first = torch.log_softmax(_forward(net, ids, positions, cache, 0, causal[None, None], True), -1)
    starts = starts.to(device)
    out = []
    for word in words:
        logp = first[0, starts - 1, word[0]]
        rest = len(word) - 1
        if rest:
            rows = len(starts)
            wc = _Cache(net, rows, length + rest, net.embed.weight)
            for kv, full in ((wc.k, cache.k), (wc.v, cache.v)):
                for layer, cached in zip(kv, full, strict=True):
                    layer[:, :, :length] = cached
            mask = torch.zeros((rows, 1, rest, length + rest), dtype=torch.bool, device=device)
            mask[..., :length] = torch.arange(length, device=device) < starts[:, None, None, None]
            mask[..., length:] = torch.ones(rest, rest, dtype=torch.bool, device=device).tril()
            tail = torch.as_tensor(word[:-1], device=device).expand(rows, rest)
            pos = starts[:, None] + torch.arange(rest, device=device)
            logits = _forward(net, tail, pos, wc, length, mask, True)
            target = torch.as_tensor(word[1:], device=device).expand(rows, rest)[..., None]
            logp = logp + torch.log_softmax(logits, -1).gather(-1, target).squeeze(-1).sum(-1)
        out.append(logp.cpu())
    return out


def _sample(
    logits: torch.Tensor, params: SamplingParams, uniform: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``[B]`` and their log-probs at the sampling temperature (1 when greedy),
    before truncation. Sampling inverts the truncated distribution's CDF at ``uniform``
    ``[B]``: one number per row and token, drawn before the loop, so a row's samples do
    not depend on which other rows share its batch."""
    if params.temperature == 0:
        tokens = logits.argmax(-1, keepdim=True)
        return tokens.squeeze(-1), torch.log_softmax(logits, -1).gather(-1, tokens).squeeze(-1)
    log_probs = torch.log_softmax(logits / params.temperature, -1)
    vocab = log_probs.shape[-1]
    if params.top_k or params.top_p < 1:
        # top-k, then top-p on the renormalised top-k (transformers' order): sorted space
        values, order = log_probs.topk(min(params.top_k or vocab, vocab), dim=-1)
        probs = torch.softmax(values, -1)
        if params.top_p < 1:  # keep a token while the mass before it is below top_p
            probs = probs.masked_fill(probs.cumsum(-1) - probs >= params.top_p, 0.0)
    else:
        probs, order = log_probs.exp(), None
    cdf = probs.cumsum(-1)
    pick = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(-1), right=True)
    pick = pick.clamp(max=cdf.shape[-1] - 1)
    # u * total can round up to the total: never land on a cut (zero-probability) token
    pick = torch.where(probs.gather(-1, pick) > 0, pick, probs.argmax(-1, keepdim=True))
    tokens = pick if order is None else order.gather(-1, pick)
    return tokens.squeeze(-1), log_probs.gather(-1, tokens).squeeze(-1)


class StaticCacheEngine(HFEngine):
    """Samples with its own decode loop on the training model itself (no weight copy).

    Takes the arguments of :class:`~divrl.rollout.hf.HFEngine` (``batch_size``,
    ``full_weights``) and keeps its behaviour at the model's context. With ``seeds``,
    prompts are batched too (``batch_size`` per call): each prompt's random numbers come
    from its own generator, so its samples depend on its seed, not on its batch, except
    where a row's logits computed in another batch differ in the last bits and a draw
    falls exactly between two tokens.

    Raises:
        EngineError: the model is not a supported architecture (use ``hf``).
    """

    batched_seeds = True  # seeded prompts share a batch: seeds cost nothing extra

    def __init__(self, model: torch.nn.Module, tokenizer, **kwargs) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise EngineError(
                f"the static rollout engine cannot run this model: {reason}; {USE_HF}"
            )
        super().__init__(model, tokenizer, **kwargs)
        self._eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long)

    def _generate_all(
        self, prompt_ids: PromptIds, params: SamplingParams, seeds: Seeds, out: RolloutOutput
    ) -> None:
        for start in range(0, len(prompt_ids), self.batch_size):
            chunk = prompt_ids[start : start + self.batch_size]
            chunk_seeds = None if seeds is None else seeds[start : start + self.batch_size]
            out.extend(self._generate_batch(chunk, params, chunk_seeds), index_offset=start)

    def _uniforms(self, prompts: int, params: SamplingParams, seeds: Seeds) -> torch.Tensor | None:
        """``[prompts * n, T]`` numbers in [0, 1) that drive the sampling: ``T`` is
        ``max_new_tokens`` capped by the model's context (no response is longer), the same
        for every batch, so a seed gives the same numbers whatever shares its batch."""
        if params.temperature == 0:
            return None
        steps = min(params.max_new_tokens, self.context_length or params.max_new_tokens)
        shape = (params.n, steps)
        if seeds is None:
            return torch.rand((prompts * params.n, steps))
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        return torch.cat([torch.rand(shape, generator=g) for g in generators])

    @torch.no_grad()
    def _generate_batch(
        self, prompt_ids: PromptIds, params: SamplingParams, seeds: Seeds = None
    ) -> RolloutOutput:
        caps = self._response_caps(prompt_ids, params.max_new_tokens)
        steps = max(caps) if caps else params.max_new_tokens
        room = torch.tensor(caps or [steps] * len(prompt_ids)).repeat_interleave(params.n)
        uniforms = self._uniforms(len(prompt_ids), params, seeds)
        ids, valid, positions = self._left_padded(prompt_ids, params.n, steps)
        plen, device = ids.shape[1], self.device
        ids, valid, positions = ids.to(device), valid.to(device), positions.to(device)
        net = _Net.of(self.model)
        cache = _Cache(net, len(ids), plen + steps, net.embed.weight)
        # prefill: causal over the real tokens; a padding query sees itself (no empty row)
        eye = torch.eye(plen, dtype=torch.bool, device=device)
        mask = (valid[:, None, None, :plen] & eye.cumsum(0).bool()) | eye
        logits = _forward(net, ids, positions, cache, 0, mask)
        slots = torch.arange(len(ids))  # the output row that each batch slot holds
        position = positions[:, -1] + 1
        tokens = torch.full((len(ids), steps), self.pad_id, dtype=torch.long)
        log_probs = torch.zeros((len(ids), steps))
        ended = torch.zeros(len(ids), dtype=torch.bool)
        for t in range(steps):
            u = None if uniforms is None else uniforms[slots, t].to(device)
            token, log_prob = _sample(logits, params, u)
            tokens[slots, t], log_probs[slots, t] = token.cpu(), log_prob.cpu()
            ended |= torch.isin(tokens[slots, t], self._eos) | (room[slots] <= t + 1)
            if params.stop:
                ended |= self._stopped(tokens[slots, : t + 1], ended, params.stop)
            done = int(ended.sum())
            if done == len(slots) or t + 1 == steps:
                break
            if done >= max(1, COMPACT_SHARE * len(slots)):  # finished rows leave the batch
                keep = (~ended).nonzero().squeeze(1)
                slots, token, position = slots[keep], token[keep], position[keep]
                ended, valid = ended[keep], valid[keep.to(device)]
                cache.keep(keep.to(device), plen + t)
            valid[:, plen + t] = True
            logits = _forward(
                net, token[:, None], position[:, None], cache, plen + t,
                valid[:, None, None, : plen + t + 1],
            )  # fmt: skip
            position = position + 1
        return self._outputs(prompt_ids, params, caps, tokens, log_probs)

    def _left_padded(
        self, prompt_ids: PromptIds, n: int, steps: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each prompt ``n`` times, left-padded: ids and positions ``[rows, P]``, and the
        keys each row may attend to, ``[rows, P + steps]`` (response columns off until
        written)."""
        plen = max(len(p) for p in prompt_ids)
        rows = len(prompt_ids) * n
        ids = torch.full((rows, plen), self.pad_id, dtype=torch.long)
        valid = torch.zeros((rows, plen + steps), dtype=torch.bool)
        for i, p in enumerate(prompt_ids):
            ids[i * n : (i + 1) * n, plen - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            valid[i * n : (i + 1) * n, plen - len(p) : plen] = True
        positions = (valid[:, :plen].long().cumsum(-1) - 1).clamp(min=0)
        return ids, valid, positions

    def _stopped(
        self, tokens: torch.Tensor, ended: torch.Tensor, stop: Sequence[str]
    ) -> torch.Tensor:
        """Rows not yet ended whose decoded response contains a stop string."""
        hit = torch.zeros_like(ended)
        for slot in (~ended).nonzero().squeeze(1).tolist():
            text = self._decode(tokens[slot].tolist())
            hit[slot] = any(s in text for s in stop)
        return hit


@dataclass(frozen=True)
class StaticOptions(HFOptions):
    """Options of the ``static`` engine (the ``hf`` engine's fields and checks).

    ``batch_size``: prompts per decode loop, seeded or not (``n`` rows each); larger
    batches use the matrix products better, finished rows leave the batch as they end.
    """


build_static = register_policy_engine(
    "static",
    StaticCacheEngine,
    options=StaticOptions,
    summary="divrl's decode loop on the policy itself (pre-allocated KV cache, batched "
    "seeds); Llama and Qwen2 models, fastest on a CPU",
    model_check=_model_check,
)


@register_engine(
    "auto",
    options=StaticOptions,
    summary="the default: static for a Llama or Qwen2 policy on a CPU, else hf",
)
def build_auto(context: EngineContext, options: StaticOptions) -> HFEngine:
    """``static`` where it runs and measured faster (a CPU policy it supports), else ``hf``
    (GPU policies, other architectures)."""
    model = context.model
    on_cpu = model is not None and next(model.parameters()).device.type == "cpu"
    if on_cpu and unsupported_reason(model) is None:
        return build_static(context, options)
    return build_hf(context, HFOptions(batch_size=options.batch_size))
