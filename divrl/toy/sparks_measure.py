"""Measure the sparks of a sparks-world model from its own samples (not from Lp-Reg's
selection): how often the spark move is taken and how probable it is where it can be.

The world knows where the spark can occur: right after the first answer (the decision
point, after ``3 8 1 5 : 3 8 8 8 = 8``). For each sampled response that reaches a first
answer, one teacher-forced pass gives the model's probability of the spark token
(`` wait ``) at that point, whether or not the sample took it. Reported per split and for easy / hard prompts apart:

- ``spark_freq``: share of samples that take the spark move;
- ``spark_prob``: mean probability of the spark token at the decision point;
- ``spark_acc`` / ``direct_acc``: accuracy of the samples that check / do not;
- ``spark_adv``: mean GRPO advantage of the samples that check (each prompt's samples one
  group, :func:`divrl.algorithms.advantages.group_advantages`): the sign of the on-policy
  push on the spark token, negative when checking earns less than the prompt's average;
- ``entropy``: mean per-token entropy (nats) of the model over its sampled responses;
- Pass@k as :func:`divrl.toy.measure.split_stats` computes it.

Sampling is ``divrl eval``'s (temperature 1, top-p 1, no top-k).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from divrl.algorithms.advantages import group_advantages
from divrl.rewards.sparks_reward import SPARK_MARK, has_spark
from divrl.toy.countdown_measure import response_entropy
from divrl.toy.measure import MeasureConfig, sample_and_score, split_stats

MEASUREMENTS_FILE = "measurements.json"
#: a response up to its decision point (the first answer)
_FIRST_ANSWER = re.compile(r"^(?:\d+ )*\d+ : (?:\d+ )*\d+ = \d+(?!\d)")


@dataclass(frozen=True)
class SparksMeasureConfig:
    """How a sparks-world model is measured."""

    n_samples: int = field(default=16, metadata={"help": "samples per prompt"})
    max_prompts: int = field(default=256, metadata={"help": "first prompts of each split"})
    max_new_tokens: int = field(default=96, metadata={"help": "response length limit"})
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    splits: tuple[str, ...] = field(default=("test", "hard"), metadata={"help": "splits"})

    def __post_init__(self) -> None:
        if self.n_samples < 1 or self.max_prompts < 1:
            raise ValueError("n_samples and max_prompts must be >= 1")


def decision_prefix(text: str) -> str | None:
    """The response up to its decision point (``3 8 1 5 : 3 8 8 8 = 8``), or None."""
    m = _FIRST_ANSWER.match(text)
    return m.group(0) if m else None


@torch.no_grad()
def spark_probabilities(model, tokenizer, prompts: Sequence[str], prefixes: Sequence[str]):
    """P(spark token | prompt, response prefix) for each pair, batched by length (the
    prompt and the prefix tokenised apart, as the sampler sees them)."""
    spark_id = tokenizer.convert_tokens_to_ids(SPARK_MARK)
    seqs = [
        tokenizer(p)["input_ids"] + tokenizer(x)["input_ids"]
        for p, x in zip(prompts, prefixes, strict=True)
    ]
    out = np.zeros(len(seqs))
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(len(s), []).append(i)
    for rows in by_len.values():
        for lo in range(0, len(rows), 512):
            idx = rows[lo : lo + 512]
            ids = torch.tensor([seqs[i] for i in idx])
            logits = model(input_ids=ids).logits[:, -1].float()
            out[idx] = torch.softmax(logits, -1)[:, spark_id].numpy()
    return out


def spark_stats(model, tokenizer, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The spark measures of ``divrl eval`` results (see the module docstring)."""
    rows: list[tuple[bool, bool, bool, str, str | None]] = []  # hard, spark, ok, prompt, prefix
    groups: list[int] = []
    for g, r in enumerate(results):
        groups += [g] * len(r["texts"])
        hard = bool((r.get("extra_info") or {}).get("hard"))
        for text, ok in zip(r["texts"], r["correct"], strict=True):
            rows.append((hard, has_spark(text), bool(ok), r["prompt"], decision_prefix(text)))
    decided = [i for i, row in enumerate(rows) if row[4] is not None]
    probs = np.full(len(rows), np.nan)
    if decided:
        probs[decided] = spark_probabilities(
            model, tokenizer, [rows[i][3] for i in decided], [rows[i][4] for i in decided]
        )
    hard = np.array([row[0] for row in rows])
    spark = np.array([row[1] for row in rows])
    correct = np.array([row[2] for row in rows])
    adv = group_advantages(torch.tensor(correct, dtype=torch.float32), groups).numpy()
    out: dict[str, Any] = {}
    for name, sel in (("all", np.ones_like(hard)), ("easy", ~hard), ("hard", hard)):
        if not sel.any():
            continue
        p = probs[sel]
        out[name] = {
            "samples": int(sel.sum()),
            "spark_freq": float(spark[sel].mean()),
            "spark_prob": float(np.nanmean(p)) if np.isfinite(p).any() else float("nan"),
            "spark_acc": _mean(correct[sel & spark]),
            "direct_acc": _mean(correct[sel & ~spark]),
            "spark_adv": _mean(adv[sel & spark]),
            "accuracy": float(correct[sel].mean()),
        }
    return out


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def measure_sparks_model(
    model_dir: str | Path, split_paths: dict[str, Path], cfg: SparksMeasureConfig | None = None
) -> dict[str, Any]:
    """Sample the model in ``model_dir`` on each split of ``cfg.splits`` and measure it."""
    from divrl.data import load_examples
    from divrl.evaluation.runner import load_model

    cfg = cfg or SparksMeasureConfig()
    model, tokenizer = load_model(model_dir)
    sampling = MeasureConfig(
        n_samples=cfg.n_samples,
        max_prompts=cfg.max_prompts,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
    )
    result: dict[str, Any] = {"config": {**cfg.__dict__, "splits": list(cfg.splits)}, "splits": {}}
    for split in cfg.splits:
        examples = load_examples(split_paths[split], limit=cfg.max_prompts)
        results = sample_and_score(
            model, tokenizer, examples, sampling.eval_config(cfg.n_samples), threads=1
        )
        stats = split_stats(results)
        stats["sparks"] = spark_stats(model, tokenizer, results)
        prompts = [r["prompt"] for r in results for _ in r["texts"]]
        texts = [t for r in results for t in r["texts"]]
        stats["entropy"] = response_entropy(model, tokenizer, prompts, texts)
        stats["examples"] = [
            {"prompt": r["prompt"], "samples": r["texts"][:6]} for r in results[:2]
        ]
        result["splits"][split] = stats
    return result


def format_sparks_measurements(m: dict[str, Any]) -> str:
    """A plain-text table of the measurements."""
    lines = [
        f"{'split':<6} {'n':>3} {'pass@1':>7} {'pass@8':>7} {'entropy':>8} "
        f"{'spark freq easy/hard':>21} {'spark prob easy/hard':>21} {'spark adv':>9}"
    ]
    for split, s in m["splits"].items():
        sp = s["sparks"]
        freq = "/".join(f"{sp[g]['spark_freq']:.3f}" if g in sp else "-" for g in ("easy", "hard"))
        prob = "/".join(f"{sp[g]['spark_prob']:.3f}" if g in sp else "-" for g in ("easy", "hard"))
        adv = sp.get("all", {}).get("spark_adv")
        lines.append(
            f"{split:<6} {s['samples_per_prompt']:>3} {s['pass@1']:>7.3f} "
            f"{s.get('pass@8', float('nan')):>7.3f} {s['entropy']:>8.3f} {freq:>21} {prob:>21} "
            + (f"{adv:>9.3f}" if adv is not None else f"{'-':>9}")
        )
    return "\n".join(lines)


def measure_world(world, *, n_samples: int, max_prompts: int, progress: bool, reuse: bool):
    """The sparks world's measurements for ``divrl toy`` (stored in the world; the stored
    ones when ``reuse`` and they were taken with these settings)."""
    from divrl.toy.measure import load_measurements

    cfg = SparksMeasureConfig(n_samples=n_samples, max_prompts=max_prompts)
    stored = load_measurements(world) if reuse else None
    if stored is None or stored.get("config") != {**cfg.__dict__, "splits": list(cfg.splits)}:
        stored = measure_sparks_model(world.model_dir, world.splits, cfg)
        (world.root / MEASUREMENTS_FILE).write_text(json.dumps(stored, indent=2) + "\n")
    return stored
