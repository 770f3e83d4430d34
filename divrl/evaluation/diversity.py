"""Diagnostics across models: retention of base-solved prompts, spark-word probabilities.

**Retention** (the DPH paper's "keeps ~85%" analysis): of the prompts the base model solves
(at least one correct sample), the share the trained model still solves.

**Spark-word probability** (the Lp-Reg paper's diagnostic): how likely a model is to start
a chosen word (``wait``, ``however``, ...) inside a response. For each response in a fixed
set of texts and each token position ``t`` of the response, the probability that the word's
token sequence comes next, ``P(w_1 .. w_m | text[:t])`` (the product of the m conditional
probabilities), averaged over all positions of all responses. Measured on the same texts for
every checkpoint, it shows whether training pushes a word's probability down. The word is
tokenized on its own (``add_special_tokens=False``), so write it as it appears mid-text
(``" wait"`` with its leading space for BPE tokenizers); a character-level tokenizer (the toy
model) spells it out, which this handles the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from divrl.rollout import pad_token_id
from divrl.runs import RunDir

__all__ = [
    "DEFAULT_SPARK_WORDS",
    "checkpoint_models",
    "retention",
    "spark_word_curve",
    "spark_word_probability",
]

DEFAULT_SPARK_WORDS = (" wait", " however", " perhaps", " alternatively", " but")


def retention(
    base_results: Sequence[dict[str, Any]], model_results: Sequence[dict[str, Any]]
) -> dict[str, float | int]:
    """Share of base-solved prompts the model still solves (prompts matched by ``id``).

    Returns ``base_solved`` (count), ``retained`` (count) and ``retention`` (their ratio,
    nan when the base model solves nothing). Prompts missing from ``model_results`` count as
    not retained.
    """
    model_solved = {str(r["id"]): any(r["correct"]) for r in model_results}
    base_ids = [str(r["id"]) for r in base_results if any(r["correct"])]
    kept = sum(model_solved.get(i, False) for i in base_ids)
    return {
        "base_solved": len(base_ids),
        "retained": kept,
        "retention": kept / len(base_ids) if base_ids else math.nan,
    }


@torch.no_grad()
def spark_word_probability(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence[str],
    responses: Sequence[str],
    words: Sequence[str],
    *,
    batch_size: int = 64,
) -> dict[str, float]:
    """Mean probability of starting each word at a response position (module docstring).

    Args:
        prompts, responses: ``[R]`` texts; positions range over the response tokens.
        words: the words; each is tokenized on its own.
        batch_size: sequences per forward pass where each position is scored as its own
            sequence (a model the static rollout engine cannot run).

    Returns:
        ``{word: mean probability}`` over all response positions.
    """
    from divrl.rollout.static import unsupported_reason

    if len(prompts) != len(responses):
        raise ValueError("need one prompt per response")
    encoded = []
    for word in words:
        w = tokenizer(word, add_special_tokens=False)["input_ids"]
        if not w:
            raise ValueError(f"spark word {word!r} tokenizes to nothing")
        encoded.append(w)
    texts = [
        (tokenizer(p, add_special_tokens=False)["input_ids"],
         tokenizer(r, add_special_tokens=False)["input_ids"])
        for p, r in zip(prompts, responses, strict=True)
    ]  # fmt: skip
    max_len = getattr(model.config, "max_position_embeddings", None)
    # the cached-context scorer runs each text once for all its positions and words
    # (several times less work); it needs a start after at least one token
    if unsupported_reason(model) is None and all(p for p, _ in texts):
        totals = _cached_totals(model, texts, encoded, max_len)
    else:
        pad = pad_token_id(tokenizer)
        totals = [_separate_total(model, texts, w, max_len, pad, batch_size) for w in encoded]
    return {
        word: (math.nan if count == 0 else total / count)
        for word, (total, count) in zip(words, totals, strict=True)
    }


def _starts(p: list[int], r: list[int], word: list[int], max_len: int | None) -> range:
    """The positions where ``word`` is scored in ``p + r``: after the prompt and each
    response token, while ``p + r[:t] + word`` fits the model's context."""
    last = len(r) if max_len is None else min(len(r), max_len - len(p) - len(word))
    return range(len(p), len(p) + last + 1)


def _cached_totals(model, texts, words, max_len) -> list[tuple[float, int]]:
    """(sum of probabilities, positions) per word, through
    :func:`divrl.rollout.static.word_log_probs`: every word at every start of a text in one
    call, then each word's starts that fit the context (a prefix of them) kept."""
    from divrl.rollout.static import word_log_probs

    totals = [[0.0, 0] for _ in words]
    for p, r in texts:
        starts = torch.arange(len(p), len(p) + len(r) + 1)
        for total, w, logp in zip(
            totals, words, word_log_probs(model, p + r, starts, words), strict=True
        ):
            keep = len(_starts(p, r, w, max_len))
            total[0] += float(logp[:keep].double().exp().sum())
            total[1] += keep
    return [(t, n) for t, n in totals]


def _separate_total(model, texts, w, max_len, pad, batch_size) -> tuple[float, int]:
    """(sum of probabilities, positions) of word ``w``, each position scored as its own
    right-padded sequence ``p + r[:t] + w``."""
    device = next(model.parameters()).device
    seqs, starts = [], []
    for p, r in texts:
        for start in _starts(p, r, w, max_len):
            seqs.append(p + r[: start - len(p)] + w)
            starts.append(start)
    total = 0.0
    for b in range(0, len(seqs), batch_size):
        chunk, chunk_starts = seqs[b : b + batch_size], starts[b : b + batch_size]
        width = max(map(len, chunk))
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(chunk):  # right padding: positions need no shifting
            ids[i, : len(s)] = torch.as_tensor(s)
            mask[i, : len(s)] = 1
        logp = torch.log_softmax(
            model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float(), -1
        ).cpu()
        for i, start in enumerate(chunk_starts):
            pos = torch.arange(start - 1, start - 1 + len(w))
            total += float(logp[i, pos, torch.as_tensor(w)].sum().exp())
    return total, len(seqs)


def checkpoint_models(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, model directory) of every checkpoint of a training run, by step (a run
    trained with ``train.strategy=fsdp`` gets each checkpoint's weights exported first)."""
    from divrl.checkpoint.dcp import ensure_hf_weights

    ckpts = RunDir(run_dir).checkpoints()
    for c in ckpts:
        ensure_hf_weights(c.path)
    return [(c.step, c.model_dir) for c in ckpts if c.has_model()]


def spark_word_curve(
    models: Sequence[tuple[int, str | Path]],
    prompts: Sequence[str],
    responses: Sequence[str],
    words: Sequence[str],
) -> list[dict[str, Any]]:
    """``[{"step": s, word: probability, ...}]`` for each (step, model directory)."""
    from divrl.evaluation.runner import load_model

    curve = []
    for step, path in models:
        model, tokenizer = load_model(path)
        probs = spark_word_probability(model, tokenizer, prompts, responses, words)
        curve.append({"step": step, **probs})
    return curve
