"""DPH-RL's offline data split: ``divrl presample`` (ALGORITHMS.md section 2).

1. Sample ``reference.k`` responses per training prompt from the initial policy
   (T = 1.0, top_p = 0.95, k = 8 by default) and score them.
2. A prompt with at least ``reference.threshold`` (default k) correct is near-perfect
   (D_pef); every other prompt, all-wrong ones included, is an exploration prompt (D_exp).
3. For each near-perfect prompt draw one more response and keep it if correct (the
   authors' code; ``failed_to_exploration=True`` moves a prompt whose extra response
   fails to D_exp, as the paper describes). The kept responses' tokens and per-token
   log-probs under the initial policy (a teacher-forced forward at the training
   temperature, the same computation the trainer does) form the reference store.
   With ``reference.keep_presampled`` the correct ones among a near-perfect prompt's k
   presampled responses are kept too (not the authors' code; for a base model that
   solves few prompts reliably, whose store would otherwise hold a few samples).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from divrl.data.reference_store import ReferenceSample, write_reference_store
from divrl.data.sampling import derive_seed
from divrl.rollout import SamplingParams
from divrl.training.config import Config
from divrl.training.experience import (
    RewardFn,
    default_reward_fn,
    is_correct,
    rollout_requests,
    score_requests,
)
from divrl.training.forward import batch_log_probs
from divrl.training.loading import (
    load_policy,
    load_prompts,
    make_engine,
    pad_token_id,
    require_paths,
)

__all__ = ["presample"]

logger = logging.getLogger(__name__)

# distinguishes the presampling seeds from the training seeds
_PRESAMPLE_STREAM, _EXTRA_STREAM = 7_000_001, 7_000_002


def _score(reward_fn: RewardFn, prompts, out) -> list[float]:
    scores, failures = score_requests(
        reward_fn, rollout_requests(prompts, range(len(prompts)), out)
    )
    if failures:
        logger.info("presample: verifier failures %s", failures)
    return scores


def _generate(engine, prompts, params, seed: int, stream: int, batch_size: int, progress, desc):
    """Generate for all ``prompts`` in chunks, seeded per prompt (reproducible)."""
    from divrl.rollout import RolloutOutput

    out = RolloutOutput()
    starts = range(0, len(prompts), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=desc, unit="batch")
    for start in starts:
        chunk = prompts[start : start + batch_size]
        seeds = [derive_seed(seed, stream, start + j) for j in range(len(chunk))]
        out.extend(
            engine.generate([p.prompt_ids for p in chunk], params, seeds), index_offset=start
        )
    return out


def _split_rows(prompts, n_correct, threshold, has_ref, failed_to_exploration) -> list[dict]:
    """One row per prompt: its correct count and split (near-perfect or exploration)."""
    rows = []
    for i, p in enumerate(prompts):
        split = "near_perfect" if n_correct[i] >= threshold else "exploration"
        if split == "near_perfect" and failed_to_exploration and p.id not in has_ref:
            split = "exploration"
        rows.append(
            {
                "prompt_id": p.id,
                "n_correct": n_correct[i],
                "split": split,
                "has_reference": p.id in has_ref,
            }
        )
    return rows


def _reference_samples(
    config: Config, model, pad_id: int, near_prompts, extra, extra_scores, rows=None
) -> list[ReferenceSample]:
    """The correct responses of ``extra`` (only its ``rows`` when given; its prompt indices
    point into ``near_prompts``) with their log-probs under the initial policy."""
    kept_rows = [
        j for j, s in enumerate(extra_scores) if is_correct(s) and (rows is None or j in rows)
    ]
    ref_lps = (
        batch_log_probs(
            model,
            [extra.prompt_ids[j] for j in kept_rows],
            [extra.response_ids[j] for j in kept_rows],
            pad_token_id=pad_id,
            temperature=config.rollout.temperature,
            micro_batch_size=config.train.micro_batch_size,
            chunk_size=config.train.logits_chunk_size,
        )
        if kept_rows
        else []
    )
    return [
        ReferenceSample(
            prompt_id=near_prompts[extra.prompt_index[j]].id,
            prompt_ids=extra.prompt_ids[j],
            response_ids=extra.response_ids[j],
            ref_log_probs=lp,
            text=extra.texts[j],
        )
        for j, lp in zip(kept_rows, ref_lps, strict=True)
    ]


def _manifest(config: Config, model_path, train_path, threshold, failed_to_exploration, stats):
    ref = config.reference
    return {
        "model": model_path,
        "train_data": train_path,
        "template": config.data.template,
        "sampling": {
            "k": ref.k,
            "temperature": ref.temperature,
            "top_p": ref.top_p,
            "max_new_tokens": config.rollout.max_new_tokens,
            "stop": list(config.rollout.stop),
            "seed": config.train.seed,
        },
        "threshold": threshold,
        "keep_presampled": ref.keep_presampled,
        "failed_to_exploration": failed_to_exploration,
        "log_prob_temperature": config.rollout.temperature,
        "stats": stats,
    }


def presample(
    config: Config,
    *,
    reward_fn: RewardFn | None = None,
    failed_to_exploration: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Build the reference store at ``config.reference_store``; returns its manifest."""
    ref = config.reference
    reward_fn = reward_fn or default_reward_fn
    torch.manual_seed(config.train.seed)
    start_time = time.perf_counter()
    model_path, train_path, db_dir = require_paths(config)
    model, tokenizer = load_policy(config, model_path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    prompts, dropped = load_prompts(config, train_path, db_dir, tokenizer)
    engine = make_engine(config, model, tokenizer, model_path)
    params = SamplingParams(
        n=ref.k,
        temperature=ref.temperature,
        top_p=ref.top_p,
        top_k=0,
        max_new_tokens=config.rollout.max_new_tokens,
        stop=tuple(config.rollout.stop),
    )
    seed, chunk = config.train.seed, ref.batch_size
    out = _generate(engine, prompts, params, seed, _PRESAMPLE_STREAM, chunk, progress, "presample")
    scores = _score(reward_fn, prompts, out)
    n_correct = [0] * len(prompts)
    for p, s in zip(out.prompt_index, scores, strict=True):
        n_correct[p] += is_correct(s)
    threshold = ref.threshold or ref.k
    near = [i for i, c in enumerate(n_correct) if c >= threshold]

    # One more response per near-perfect prompt, kept only if correct.
    extra_params = SamplingParams(**{**params.__dict__, "n": 1})
    near_prompts = [prompts[i] for i in near]
    extra = _generate(
        engine, near_prompts, extra_params, seed, _EXTRA_STREAM, chunk, progress, "reference"
    )
    extra_scores = _score(reward_fn, near_prompts, extra) if near_prompts else []
    samples = _reference_samples(
        config, model, pad_token_id(tokenizer), near_prompts, extra, extra_scores
    )
    n_extra = len(samples)
    if ref.keep_presampled:  # the near-perfect prompts' correct presampled responses too
        near_rows = {j for j, i in enumerate(out.prompt_index) if n_correct[i] >= threshold}
        samples += _reference_samples(
            config, model, pad_token_id(tokenizer), prompts, out, scores, near_rows
        )
    has_ref = {s.prompt_id for s in samples}
    rows = _split_rows(prompts, n_correct, threshold, has_ref, failed_to_exploration)
    stats = {
        "prompts": len(prompts),
        "prompts_dropped_too_long": dropped,
        "near_perfect": len(near),
        "near_perfect_share": len(near) / len(prompts),
        "exploration": sum(r["split"] == "exploration" for r in rows),
        "reference_samples": len(samples),
        "presampled_kept": len(samples) - n_extra,
        "extra_response_failed": len(near) - n_extra,
        "presample_accuracy": sum(map(is_correct, scores)) / max(1, len(scores)),
        "n_correct_histogram": {str(c): n_correct.count(c) for c in range(ref.k + 1)},
        "seconds": round(time.perf_counter() - start_time, 2),
    }
    manifest = _manifest(config, model_path, train_path, threshold, failed_to_exploration, stats)
    write_reference_store(config.reference_store, samples, rows, manifest)
    logger.info("reference store written to %s: %s", config.reference_store, manifest["stats"])
    return manifest
