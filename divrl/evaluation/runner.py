"""Sample, score and summarise one model on one eval set (what ``divrl eval`` runs).

Three stages, each with its own file in the output directory, so that re-scoring never
resamples (``reuse=True``):

1. :func:`generate_samples` -> ``samples.jsonl``: per prompt, ``n`` sampled responses
   (text, token count, summed negative log-prob under the sampling policy, truncation)
   and one greedy response, plus the prompt's id, data source, ground truth and
   ``extra_info`` (everything scoring needs; the data file is not read again).
2. :func:`score_samples` -> ``results.jsonl``: per prompt, every sample's score,
   correctness, extracted answer, failure reason, solution style and answer cluster
   (equivalence classes for maj@k), and the same for the greedy response.
3. :func:`divrl.evaluation.summary.summarise` -> ``summary.json``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from divrl.evaluation.equivalence import ClusterRequest, cluster_answers
from divrl.evaluation.model_loading import (
    engine_options_with_batch,
    load_for_engine,
    load_model,
    make_engine,
    model_checkpoint,
    model_context,
    resolve_model_path,
)
from divrl.evaluation.pinning import origin_of
from divrl.evaluation.reuse import read_eval_meta, read_samples_for_reuse
from divrl.evaluation.stats import cluster_correctness
from divrl.evaluation.styles import solution_style
from divrl.fileio import atomic_write_lines, atomic_write_text
from divrl.rewards.types import DECIDED_REASONS, is_correct

__all__ = [
    "EvalConfig",
    "evaluate",
    "generate_samples",
    "greedy_generate",
    "load_model",
    "read_jsonl",
    "resolve_model_path",
    "score_samples",
    "write_jsonl",
]

logger = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"
RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "eval_config.json"


@dataclass
class EvalConfig:
    """How ``divrl eval`` samples and summarises."""

    n: int = field(default=16, metadata={"help": "samples per prompt (>= the largest k)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus threshold (1.0 = off)"})
    top_k: int = field(default=0, metadata={"help": "top-k sampling (0 = off)"})
    max_new_tokens: int = field(default=256, metadata={"help": "response length limit (tokens)"})
    stop: tuple[str, ...] = field(default=(), metadata={"help": "stop strings"})
    greedy: bool = field(default=True, metadata={"help": "also decode one greedy response"})
    batch_size: int = field(default=16, metadata={"help": "prompts per generate call"})
    template: str = field(default="plain", metadata={"help": "prompt template (divrl.data)"})
    seed: int = field(default=0, metadata={"help": "seed of sampling, maj@k and the bootstrap"})
    limit: int | None = field(default=None, metadata={"help": "evaluate the first N prompts"})
    n_boot: int = field(default=1000, metadata={"help": "bootstrap replicates for the CIs"})
    confidence: float = field(default=0.95, metadata={"help": "coverage of the CIs"})
    group_by: tuple[str, ...] = field(
        default=(),
        metadata={"help": "extra_info keys to break the summary down by (e.g. hard, family)"},
    )
    score_timeout: float | None = field(
        default=None, metadata={"help": "seconds per verification (None = the verifier's)"}
    )
    engine: str = field(
        default="auto",
        metadata={"help": "rollout engine, a name in divrl.rollout.engine_names()"},
    )
    engine_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "the engine's options (checked by the engine); an engine's "
            "batch_size defaults to batch_size"
        },
    )

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n={self.n}: need at least one sample per prompt")
        if not 0 < self.temperature < math.inf:  # NaN too
            raise ValueError(
                f"temperature={self.temperature} must be > 0 (the greedy response is "
                "decoded separately)"
            )
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("top_k must be >= 0, max_new_tokens and batch_size >= 1")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit={self.limit} must be >= 1")
        if not 0 < self.confidence < 1 or self.n_boot < 1:
            raise ValueError("confidence must be in (0, 1) and n_boot >= 1")
        self.stop = tuple(self.stop)
        self.group_by = tuple(self.group_by)
        self.engine_options = engine_options_with_batch(
            self.engine, self.engine_options, self.batch_size
        )


# --------------------------------------------------------------------------- files


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Write rows as JSONL atomically (unique temp file, fsync, rename: an interrupted
    write leaves the previous file)."""
    atomic_write_lines(path, (json.dumps(row) + "\n" for row in rows))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- sampling


def greedy_generate(
    model: torch.nn.Module,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    batch_size: int = 16,
    progress: bool = False,
    engine=None,
    desc: str = "greedy",
) -> list[dict[str, Any]]:
    """Greedy responses (the rollout engine at temperature 0), batched with left padding.

    ``engine``: a :class:`divrl.rollout.RolloutEngine` (default: the ``hf`` engine on
    ``model``). Returns one dict per prompt: ``text``, ``n_tokens``, ``truncated``.
    """
    from divrl.rollout import SamplingParams

    engine = engine or make_engine(EvalConfig(batch_size=batch_size), model, tokenizer)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, stop=tuple(stop))
    out: list[dict[str, Any]] = []
    bar = _bar(len(prompt_ids), desc, progress)
    for start in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        gen = engine.generate(chunk, params)
        for text, ids, truncated in zip(gen.texts, gen.response_ids, gen.truncated, strict=True):
            out.append({"text": text, "n_tokens": len(ids), "truncated": bool(truncated)})
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return out


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="prompt", dynamic_ncols=True)


def _sample_record(out, j: int, context: int | None) -> dict[str, Any]:
    """One sampled response of a generate call, as ``samples.jsonl`` stores it.

    ``at_context``: cut because prompt + response reached the model's context (the engines
    end a response there), not because of ``max_new_tokens``.
    """
    return {
        "text": out.texts[j],
        "n_tokens": len(out.response_ids[j]),
        "nll": float(-sum(out.log_probs[j])),
        "truncated": bool(out.truncated[j]),
        "at_context": bool(
            out.truncated[j]
            and isinstance(context, int)
            and len(out.prompt_ids[j]) + len(out.response_ids[j]) >= context
        ),
    }


def generate_samples(
    model: torch.nn.Module,
    tokenizer,
    examples: Sequence[Any],
    cfg: EvalConfig,
    *,
    engine=None,
    progress: bool = True,
    label: str = "",
) -> list[dict[str, Any]]:
    """``n`` samples (and one greedy response) per example; one record per prompt.

    ``engine``: a :class:`divrl.rollout.RolloutEngine` (default: :func:`make_engine` of
    ``cfg``); ``label`` (e.g. the eval set) starts the progress bars' names. Sampling is
    seeded with ``cfg.seed``: an engine whose seeds cost nothing (``batched_seeds``, e.g.
    vLLM) gets one seed per prompt, ``derive_seed(cfg.seed, prompt index)``, and its
    samples do not depend on batching; others sample each batch from the one seeded stream
    (same seed, batch size and machine -> same samples).
    """
    from divrl.data import render_prompt
    from divrl.data.sampling import derive_seed
    from divrl.rollout import SamplingParams

    engine = engine or make_engine(cfg, model, tokenizer)
    texts = [render_prompt(ex, template=cfg.template, tokenizer=tokenizer) for ex in examples]
    prompt_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    params = SamplingParams.from_settings(cfg)
    # the engines end a response at the model's context; such samples are flagged
    context = engine.context_length or model_context(model)
    per_prompt_seeds = engine.batched_seeds
    torch.manual_seed(cfg.seed)
    samples: list[list[dict[str, Any]]] = [[] for _ in examples]
    prefix = f"{label}: " if label else ""
    bar = _bar(len(examples), f"{prefix}sampling n={cfg.n}", progress)
    for start in range(0, len(prompt_ids), cfg.batch_size):
        chunk = prompt_ids[start : start + cfg.batch_size]
        if per_prompt_seeds:
            seeds = [derive_seed(cfg.seed, start + j) for j in range(len(chunk))]
            out = engine.generate(chunk, params, seeds)
        else:
            out = engine.generate(chunk, params)
        for j in range(len(out)):
            samples[start + out.prompt_index[j]].append(_sample_record(out, j, context))
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    greedy = (
        greedy_generate(
            model,
            tokenizer,
            prompt_ids,
            max_new_tokens=cfg.max_new_tokens,
            stop=cfg.stop,
            batch_size=cfg.batch_size,
            progress=progress,
            engine=engine,
            desc=f"{prefix}greedy",
        )
        if cfg.greedy
        else [None] * len(examples)
    )
    records = []
    for ex, text, s, g in zip(examples, texts, samples, greedy, strict=True):
        if len(s) != cfg.n:
            raise RuntimeError(f"prompt {ex.id}: the engine returned {len(s)} samples, not {cfg.n}")
        records.append(
            {
                "id": str(ex.id),
                "data_source": ex.data_source,
                "prompt": text,
                "ground_truth": ex.ground_truth,
                "extra_info": ex.extra_info,
                "samples": s,
                "greedy": g,
            }
        )
    return records


# --------------------------------------------------------------------------- scoring


def _normalise_answer(answer: str | None) -> str | None:
    return None if answer is None else " ".join(answer.split()).lower()


def score_samples(
    records: Sequence[dict[str, Any]], cfg: EvalConfig, *, progress: bool = True
) -> list[dict[str, Any]]:
    """Score every sample and greedy response; add styles and answer clusters.

    Returns one result per prompt with, per sample (lists of length n): ``scores``,
    ``correct``, ``extracted``, ``reasons``, ``styles``, ``clusters`` (-1 = no vote), and
    ``cluster_correct`` per cluster; ``greedy`` is the greedy response's
    ``{text, score, correct, extracted, reason, style}`` or None.
    """
    from divrl.rewards import score_batch

    items, where = [], []
    for p, rec in enumerate(records):
        for s, sample in enumerate(rec["samples"]):
            items.append(_item(rec, sample["text"]))
            where.append((p, s))
        if rec.get("greedy") is not None:
            items.append(_item(rec, rec["greedy"]["text"]))
            where.append((p, -1))
    scored = score_batch(items, timeout=cfg.score_timeout, progress=progress).results
    _warn_unscorable(scored)
    per_prompt: list[dict[int, Any]] = [{} for _ in records]
    for (p, s), res in zip(where, scored, strict=True):
        per_prompt[p][s] = res

    results = []
    for rec, res in zip(records, per_prompt, strict=True):
        n = len(rec["samples"])
        sample_res = [res[s] for s in range(n)]
        texts = [smp["text"] for smp in rec["samples"]]
        extracted = [r.extracted for r in sample_res]
        out = {k: rec[k] for k in ("id", "data_source", "prompt", "ground_truth", "extra_info")}
        out.update(
            texts=texts,
            scores=[r.score for r in sample_res],
            correct=[is_correct(r.score) for r in sample_res],
            extracted=extracted,
            reasons=[r.reason for r in sample_res],
            styles=[
                solution_style(rec["data_source"], t, e)
                for t, e in zip(texts, extracted, strict=True)
            ],
            n_tokens=[smp["n_tokens"] for smp in rec["samples"]],
            nll=[smp.get("nll") for smp in rec["samples"]],
            truncated=[smp["truncated"] for smp in rec["samples"]],
            at_context=[smp.get("at_context", False) for smp in rec["samples"]],
        )
        if -1 in res:
            g = res[-1]
            text = rec["greedy"]["text"]
            out["greedy"] = {
                "text": text,
                "score": g.score,
                "correct": is_correct(g.score),
                "extracted": g.extracted,
                "reason": g.reason,
                "style": solution_style(rec["data_source"], text, g.extracted),
            }
        else:
            out["greedy"] = None
        results.append(out)

    requests = [
        ClusterRequest(
            # only answers the verifier could judge vote (no extraction/SQL errors)
            answers=[
                e if r in DECIDED_REASONS else None
                for e, r in zip(out["extracted"], out["reasons"], strict=True)
            ],
            data_source=out["data_source"],
            extra_info=dict(out["extra_info"] or {}),
        )
        for out in results
    ]
    clusters = cluster_answers(requests)
    for out, ids in zip(results, clusters, strict=True):
        out["clusters"] = ids
        out["cluster_correct"] = cluster_correctness(ids, out["correct"])
        out["distinct_correct_answers"] = len(
            {
                _normalise_answer(e)
                for e, c in zip(out["extracted"], out["correct"], strict=True)
                if c and e is not None
            }
        )
    return results


def _warn_unscorable(scored: Sequence[Any]) -> None:
    """One warning when some responses got no verdict (a timeout, a crashed worker ...)."""
    unscorable = Counter(r.reason for r in scored if r.unscorable)
    if unscorable:
        logger.warning(
            "%d of %d responses could not be scored (%s): the unscorable column of the "
            "summary counts them; Pass@k counts them as not correct (a lower bound)",
            sum(unscorable.values()),
            len(scored),
            ", ".join(f"{k}={v}" for k, v in sorted(unscorable.items())),
        )


def _item(rec: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "data_source": rec["data_source"],
        "solution_str": text,
        "ground_truth": rec["ground_truth"],
        "extra_info": rec["extra_info"],
    }


# --------------------------------------------------------------------------- driver


def evaluate(
    model_path: str | Path | None,
    data_path: str | Path | None,
    out_dir: str | Path,
    cfg: EvalConfig,
    *,
    reuse: bool = False,
    db_dir: str | Path | None = None,
    engine=None,
    model=None,
    tokenizer=None,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate one model on one data file into ``out_dir``; returns the summary.

    With ``reuse=True`` the samples already in ``out_dir/samples.jsonl`` are re-scored and
    re-summarised, and no model is loaded (``model_path`` and ``data_path`` may be None).
    ``model``/``tokenizer`` may be passed already loaded (they win over ``model_path``),
    and ``engine`` already built (a command evaluating several sets builds it once);
    otherwise the engine ``cfg.engine`` is built here, loading only what it needs.
    """
    from divrl.evaluation.summary import eval_provenance, summarise

    out = Path(out_dir)
    samples_path = out / SAMPLES_FILE
    timings: dict[str, float] = {}
    if reuse:
        if not samples_path.is_file():
            raise FileNotFoundError(
                f"--reuse: no {SAMPLES_FILE} in {out}; run without --reuse first"
            )
        meta = read_eval_meta(out / CONFIG_FILE)
        records = read_samples_for_reuse(samples_path, meta)  # every prompt, n samples each
        # the samples were drawn with the recorded settings, whatever this call says
        sampled = {
            k: v
            for k, v in meta.get("config", {}).items()
            if k in ("temperature", "top_p", "top_k", "max_new_tokens", "template")
        }
        n_found = {len(r["samples"]) for r in records}
        if n_found != {cfg.n}:
            logger.warning("reusing %s: %s samples per prompt (asked %d)", out, n_found, cfg.n)
        cfg = EvalConfig(**{**asdict(cfg), **sampled, "n": min(n_found)})
    else:
        if data_path is None:
            raise ValueError("evaluate: data_path is required unless reuse=True")
        from divrl.data import load_examples

        examples = load_examples(data_path, db_dir=db_dir, limit=cfg.limit)
        if not examples:
            raise ValueError(f"no examples in {data_path}")
        context_length = None
        if model is None and engine is None:
            if model_path is None:
                raise ValueError("evaluate: model_path is required unless reuse=True")
            model, tokenizer, context_length = load_for_engine(model_path, cfg.engine)
        if engine is None:
            path = None if model_path is None else resolve_model_path(model_path)
            engine = make_engine(cfg, model, tokenizer, path, context_length)
        t0 = time.perf_counter()
        records = generate_samples(
            model, tokenizer, examples, cfg, engine=engine, progress=progress, label=out.name
        )
        timings["sampling_seconds"] = time.perf_counter() - t0
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(records, samples_path)
        meta = {
            "model": None if model_path is None else str(model_path),
            "resolved_model": (
                None if model_path is None else origin_of(resolve_model_path(model_path))
            ),
            "data": str(data_path),
            "prompts": len(records),  # --reuse checks that they are all there
            "config": asdict(cfg),
            **timings,
            "provenance": eval_provenance(records, cfg, checkpoint=model_checkpoint(model_path)),
        }
        atomic_write_text(out / CONFIG_FILE, json.dumps(meta, indent=2) + "\n")
    t0 = time.perf_counter()
    results = score_samples(records, cfg, progress=progress)
    timings["scoring_seconds"] = time.perf_counter() - t0
    write_jsonl(results, out / RESULTS_FILE)
    summary = summarise(results, cfg)
    summary["model"] = meta.get("model")
    summary["data"] = meta.get("data")
    summary["timings"] = {**{k: v for k, v in meta.items() if k.endswith("_seconds")}, **timings}
    atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return summary
