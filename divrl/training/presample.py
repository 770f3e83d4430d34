"""DPH-RL's offline data split: ``divrl presample`` (docs/training.md, "DPH-RL data path";
the divergences that use it: docs/algorithms.md).

1. Sample ``reference.k`` responses per training prompt from the initial policy
   (T = 1.0, top_p = 0.95, k = 8 by default) and score them.
2. A prompt with at least ``reference.threshold`` (default k) correct is near-perfect
   (D_pef); every other prompt, all-wrong ones included, is an exploration prompt (D_exp).
3. For each near-perfect prompt draw one more response (at ``reference.response_top_p``,
   null = ``top_p``; the authors drew it with the rollout's 0.9) and keep it if correct (the
   authors' code; ``failed_to_exploration=True`` moves a prompt whose extra response
   fails to D_exp, as the paper describes). The kept responses' tokens and per-token
   log-probs under the initial policy (a teacher-forced forward at the training
   temperature, the same computation the trainer does) form the reference store.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from divrl.data.fingerprint import model_fingerprint
from divrl.data.reference_store import (
    ReferenceSample,
    ReferenceStore,
    StoreExpectation,
    write_reference_store,
)
from divrl.data.sampling import derive_seed
from divrl.data.store_checks import what_to_change
from divrl.data.store_files import check_store_target
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
from divrl.training.fsdp import full_parameters
from divrl.training.loading import (
    load_policy,
    make_engine,
    pad_token_id,
    require_paths,
    run_prompts,
    run_provenance,
    shard_model,
    warn_if_references_repeat,
)

__all__ = ["open_reference_store", "presample", "store_expectation"]

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


def _generate(
    engine, prompts, params, seed: int, stream: int, batch_size: int, progress, desc, procs
):
    """Generate for all ``prompts``, seeded per prompt (reproducible, and the same whatever
    the number of processes): each process takes every ``world``-th prompt, in chunks, and
    the outputs are gathered back into prompt order on every process.

    Every process calls ``engine.generate`` equally often (an empty chunk if it has run
    out): under fsdp each call gathers the full weights, a collective.
    """
    from divrl.rollout import RolloutOutput

    world, rank = procs
    mine = list(range(rank, len(prompts), world))
    calls = -(-len(range(0, len(prompts), world)) // batch_size)  # the first rank's count
    local = RolloutOutput()
    starts = range(0, calls * batch_size, batch_size)
    if progress and rank == 0:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=desc, unit="batch")
    for start in starts:
        chunk = mine[start : start + batch_size]
        seeds = [derive_seed(seed, stream, i) for i in chunk]
        piece = engine.generate([prompts[i].prompt_ids for i in chunk], params, seeds)
        piece.prompt_index = [chunk[i] for i in piece.prompt_index]  # global positions
        local.extend(piece)
    return _gather_outputs(local, world)


def _gather_outputs(local, world: int):
    """Every process's rows, ordered by prompt position (prompt-major, as one process)."""
    from divrl.rollout import RolloutOutput

    if world == 1:
        return local
    import torch.distributed as dist

    parts: list = [None] * world
    dist.all_gather_object(parts, local)
    rows = sorted(
        ((p, r, j) for r, part in enumerate(parts) for j, p in enumerate(part.prompt_index)),
    )
    out = RolloutOutput()
    for p, r, j in rows:
        part = parts[r]
        out.prompt_index.append(p)
        out.prompt_ids.append(part.prompt_ids[j])
        out.response_ids.append(part.response_ids[j])
        out.log_probs.append(part.log_probs[j])
        out.texts.append(part.texts[j])
        out.truncated.append(part.truncated[j])
    return out


def _processes() -> tuple[int, int]:
    """(world, rank) under torchrun / accelerate launch, else (1, 0)."""
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    return state.num_processes, state.process_index


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
                "prompt_key": p.key,
            }
        )
    return rows


def _interleave(local: list, world: int, total: int) -> list:
    """Undo ``rows[rank::world]``: every process's list, back in row order."""
    if world == 1:
        return local
    import torch.distributed as dist

    parts: list = [None] * world
    dist.all_gather_object(parts, local)
    return [parts[i % world][i // world] for i in range(total)]


def _reference_samples(
    config: Config, model, pad_id: int, near_prompts, extra, extra_scores, procs, rows=None
) -> list[ReferenceSample]:
    """The correct responses of ``extra`` (only its ``rows`` when given; its prompt indices
    point into ``near_prompts``) with their log-probs under the initial policy."""
    kept_rows = [
        j for j, s in enumerate(extra_scores) if is_correct(s) and (rows is None or j in rows)
    ]
    # Under fsdp, full_parameters makes the forwards local (no collective per pass), so
    # every process may score its own share of the rows; the shares are gathered.
    world, rank = procs
    mine = kept_rows[rank::world]
    with full_parameters(model):
        local = (
            batch_log_probs(
                model,
                [extra.prompt_ids[j] for j in mine],
                [extra.response_ids[j] for j in mine],
                pad_token_id=pad_id,
                temperature=config.rollout.temperature,
                micro_batch_size=config.train.micro_batch_size,
                chunk_size=config.train.logits_chunk_size,
            )
            if mine
            else []
        )
    ref_lps = _interleave(local, world, len(kept_rows))
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


def store_expectation(config: Config, model_path: str, prompts) -> StoreExpectation:
    """What a store presampled by ``config`` for ``prompts`` records, and what a training
    run of ``config`` checks it against (:meth:`ReferenceStore.open`)."""
    ref = config.reference
    return StoreExpectation(
        model=model_fingerprint(model_path),
        model_name=model_path,
        prompts=[(p.id, p.prompt_ids) for p in prompts],
        sampling={
            "k": ref.k,
            "temperature": ref.temperature,
            "top_p": ref.top_p,
            "response_top_p": ref.top_p if ref.response_top_p is None else ref.response_top_p,
            "max_new_tokens": config.rollout.max_new_tokens,
            "stop": list(config.rollout.stop),
        },
        threshold=ref.threshold or ref.k,
        failed_to_exploration=ref.failed_to_exploration,
        keep_presampled=ref.keep_presampled,
    )


def open_reference_store(
    config: Config,
    model_path: str,
    prompts: list,
    *,
    log: bool = True,
    vocab_size: int | None = None,
) -> tuple[ReferenceStore, list]:
    """The DPH-RL store of a training run, checked against it (:func:`store_expectation`;
    its token ids below ``vocab_size`` when given), and the run's prompts cut to the
    store's exploration prompts (the ones rolled out)."""
    store = ReferenceStore.open(
        config.reference_store,
        temperature=config.rollout.temperature,
        expect=store_expectation(config, model_path, prompts),
        allow_mismatch=config.reference.allow_store_mismatch,
        vocab_size=vocab_size,
    )
    keep = store.exploration_ids
    explored = [p for p in prompts if p.id in keep]
    if not explored:
        raise ValueError(
            f"no exploration prompts left after the DPH-RL split: none of the {len(prompts)} "
            f"training prompts is an exploration prompt of {store.path}"
        )
    if log:
        logger.info(
            "DPH-RL: rolling out %d exploration prompts of %d (the other %d are "
            "near-perfect or not in the store); %d reference samples from %s",
            len(explored),
            len(prompts),
            len(prompts) - len(explored),
            len(store),
            store.path,
        )
        warn_if_references_repeat(config, len(store))
    return store, explored


def _manifest(config: Config, expect: StoreExpectation, train_path: str, stats) -> dict:
    return {
        "model": expect.model_name,
        "train_data": train_path,
        "template": config.data.template,
        "sampling": {**expect.sampling, "seed": config.train.seed},
        "threshold": expect.threshold,
        "failed_to_exploration": expect.failed_to_exploration,
        "keep_presampled": expect.keep_presampled,
        "log_prob_temperature": config.rollout.temperature,
        "fingerprint": expect.fingerprint(),
        "stats": stats,
    }


def _stats(prompts, dropped, near, rows, samples, n_extra, scores, n_correct, k, start_time):
    return {
        "prompts": len(prompts),
        "prompts_dropped_too_long": dropped,
        "near_perfect": len(near),
        "near_perfect_share": len(near) / len(prompts),
        "exploration": sum(r["split"] == "exploration" for r in rows),
        "reference_samples": len(samples),
        "presampled_kept": len(samples) - n_extra,
        "extra_response_failed": len(near) - n_extra,
        "presample_accuracy": sum(map(is_correct, scores)) / max(1, len(scores)),
        "n_correct_histogram": {str(c): n_correct.count(c) for c in range(k + 1)},
        "seconds": round(time.perf_counter() - start_time, 2),
    }


#: fewer reference samples than this is warned about (a divergence term on a handful of
#: responses anchors the policy to little)
SMALL_STORE = 8


def _warn_if_small(config: Config, manifest: dict, n_samples: int) -> None:
    if n_samples >= min(SMALL_STORE, manifest["stats"]["prompts"]):
        return
    stats = manifest["stats"]
    logger.warning(
        "the reference store %s holds %s reference samples (%d of %d prompts near-perfect): %s; %s",
        config.reference_store,
        n_samples or "no",
        stats["near_perfect"],
        stats["prompts"],
        "training a DPH preset on it will refuse to start"
        if n_samples == 0
        else "the divergence term will rest on very few responses",
        what_to_change(manifest) + ", then presample again with --overwrite",
    )


def _presample_params(config: Config) -> SamplingParams:
    ref = config.reference
    return SamplingParams.from_settings(
        config.rollout, n=ref.k, temperature=ref.temperature, top_p=ref.top_p, top_k=0
    )


def presample(
    config: Config,
    *,
    reward_fn: RewardFn | None = None,
    failed_to_exploration: bool | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Build the reference store at ``config.reference_store``; returns its manifest.

    ``failed_to_exploration`` (None: ``reference.failed_to_exploration``) overrides the
    config's split rule; the store records the rule used and training checks it. A store
    already there is replaced; any other folder or file is refused (before the model
    loads) unless ``overwrite``.
    """
    model_path, train_path, db_dir = require_paths(config)
    source = {"train_data": train_path, "model": model_path}
    check_store_target(config.reference_store, overwrite, source=source)
    ref = config.reference
    if failed_to_exploration is not None:
        ref.failed_to_exploration = failed_to_exploration
    reward_fn = reward_fn or default_reward_fn
    torch.manual_seed(config.train.seed)
    start_time = time.perf_counter()
    procs = _processes()
    model, tokenizer = load_policy(config, model_path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    if config.train.strategy == "fsdp" and torch.distributed.is_initialized():
        model = shard_model(config, model, device)
    prompts, dropped = run_prompts(config, train_path, db_dir, tokenizer, model)
    expect = store_expectation(config, model_path, prompts)
    limit = config.data.limit
    hint = f" (data.limit={limit}: the first {limit} rows only; train with it too)" if limit else ""
    logger.info("presample: %d prompts x %d responses%s", len(prompts), ref.k, hint)
    engine = make_engine(config, model, tokenizer, model_path)
    params = _presample_params(config)
    seed, chunk = config.train.seed, ref.batch_size
    desc = f"presample: {ref.k} responses per prompt"
    out = _generate(engine, prompts, params, seed, _PRESAMPLE_STREAM, chunk, progress, desc, procs)
    scores = _score(reward_fn, prompts, out)
    n_correct = [0] * len(prompts)
    for p, s in zip(out.prompt_index, scores, strict=True):
        n_correct[p] += is_correct(s)
    near = [i for i, c in enumerate(n_correct) if c >= expect.threshold]

    # One more response per near-perfect prompt, kept only if correct.
    response_top_p = ref.top_p if ref.response_top_p is None else ref.response_top_p
    extra_params = SamplingParams.from_settings(params, n=1, top_p=response_top_p)
    near_prompts = [prompts[i] for i in near]
    desc = "presample: 1 reference response per near-perfect prompt"
    extra = _generate(
        engine, near_prompts, extra_params, seed, _EXTRA_STREAM, chunk, progress, desc, procs
    )
    extra_scores = _score(reward_fn, near_prompts, extra) if near_prompts else []
    samples = _reference_samples(
        config, model, pad_token_id(tokenizer), near_prompts, extra, extra_scores, procs
    )
    n_extra = len(samples)
    if ref.keep_presampled:  # the near-perfect prompts' correct presampled responses too
        near_set = set(near)
        near_rows = {j for j, i in enumerate(out.prompt_index) if i in near_set}
        samples += _reference_samples(
            config, model, pad_token_id(tokenizer), prompts, out, scores, procs, near_rows
        )
    has_ref = {s.prompt_id for s in samples}
    rows = _split_rows(prompts, n_correct, expect.threshold, has_ref, ref.failed_to_exploration)
    stats = _stats(
        prompts, dropped, near, rows, samples, n_extra, scores, n_correct, ref.k, start_time
    )
    manifest = _manifest(config, expect, train_path, stats)
    manifest["provenance"] = run_provenance(config, prompts)
    if procs[1] == 0:  # written once; the others wait for it
        write_reference_store(config.reference_store, samples, rows, manifest, overwrite=overwrite)
        logger.info("reference store written to %s", config.reference_store)
        _warn_if_small(config, manifest, len(samples))
    if procs[0] > 1:
        torch.distributed.barrier()
    return manifest
