"""Measure the countdown world's base model: Pass@k, entropy, distinct solutions, styles.

Samples and scores like the SQL world's measurement (``divrl eval``'s sampler and scorer
through :func:`divrl.toy.measure.sample_and_score`: temperature 1, top-p 1, no top-k;
Pass@k and styles by :func:`divrl.toy.measure.split_stats`), and adds what the search
world is for:

- ``entropy``: mean per-token entropy (nats) of the model's next-token distribution over
  the tokens of its own sampled responses (eos included), from one teacher-forced pass;
- ``distinct_solutions``: mean number of distinct correct solutions (canonical
  expression, :func:`divrl.rewards.countdown_reward.canonical_expression`) per prompt
  with at least one correct sample;
- ``distinct_styles``: mean number of operator multisets among a prompt's answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from divrl.rewards.countdown_reward import canonical_expression
from divrl.toy.kit import ToyWorld
from divrl.toy.measure import MeasureConfig, sample_and_score, split_stats, split_table

MEASUREMENTS_FILE = "measurements.json"


@dataclass(frozen=True)
class CountdownMeasureConfig:
    """How the countdown base model is measured."""

    n_samples: int = field(default=32, metadata={"help": "samples per prompt"})
    max_prompts: int = field(default=256, metadata={"help": "first prompts of each split"})
    max_new_tokens: int = field(default=112, metadata={"help": "response length limit"})
    batch_size: int = field(default=512, metadata={"help": "sequences per generate call"})
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    splits: tuple[str, ...] = field(
        default=("test", "cross_domain", "ood_math"), metadata={"help": "splits measured"}
    )


@torch.no_grad()
def response_entropy(model, tokenizer, prompts: list[str], responses: list[str]) -> float:
    """Mean per-token entropy (nats) of ``model`` at the positions that predict each
    response token and the closing eos, batched 256 sequences at a time."""
    total, count = 0.0, 0
    eos = tokenizer.eos_token_id
    for lo in range(0, len(prompts), 256):
        seqs, starts = [], []
        for p, r in zip(prompts[lo : lo + 256], responses[lo : lo + 256], strict=True):
            p_ids = tokenizer(p)["input_ids"]
            r_ids = [*tokenizer(r)["input_ids"], eos]
            seqs.append(p_ids + r_ids)
            starts.append((len(p_ids), len(r_ids)))
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
        ent = -(logp.exp() * logp).sum(-1)  # [B, T]: entropy of the next-token distribution
        for i, (p_len, r_len) in enumerate(starts):
            total += float(ent[i, p_len - 1 : p_len - 1 + r_len].sum())
            count += r_len
    return total / max(count, 1)


def distinct_solutions(results: list[dict[str, Any]]) -> float:
    """Mean number of distinct correct solutions (canonical expression of the verifier's
    answer attempt) per prompt with a correct sample, over ``divrl eval`` results."""
    counts = [
        len(
            {
                canonical_expression(e)
                for e, ok in zip(r["extracted"], r["correct"], strict=True)
                if ok
            }
        )
        for r in results
        if any(r["correct"])
    ]
    return float(np.mean(counts)) if counts else 0.0


def measure_countdown_model(
    world: ToyWorld, cfg: CountdownMeasureConfig | None = None, progress: bool = True
) -> dict[str, Any]:
    """Sample and measure the world's base model; the result is also saved in the world."""
    from divrl.data import load_examples
    from divrl.evaluation.runner import load_model

    cfg = cfg or CountdownMeasureConfig()
    model, tokenizer = load_model(world.model_dir)
    sampling = MeasureConfig(
        n_samples=cfg.n_samples,
        max_prompts=cfg.max_prompts,
        max_new_tokens=cfg.max_new_tokens,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
    )
    result: dict[str, Any] = {"config": {**cfg.__dict__, "splits": list(cfg.splits)}, "splits": {}}
    for split in cfg.splits:
        examples = load_examples(world.splits[split], db_dir=world.db_dir, limit=cfg.max_prompts)
        results = sample_and_score(
            model, tokenizer, examples, sampling.eval_config(cfg.n_samples), threads=1
        )
        stats = split_stats(results)
        if results[0]["data_source"] == "countdown":
            stats["distinct_solutions_per_solved"] = distinct_solutions(results)
        prompts = [r["prompt"] for r in results for _ in r["texts"]]
        texts = [t for r in results for t in r["texts"]]
        stats["entropy"] = response_entropy(model, tokenizer, prompts, texts)
        stats["mean_response_chars"] = float(np.mean([len(t) for t in texts]))
        stats["examples"] = [
            {"prompt": r["prompt"], "samples": r["texts"][:4]} for r in results[:2]
        ]
        result["splits"][split] = stats
    (world.root / MEASUREMENTS_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_countdown_measurements(m: dict[str, Any]) -> str:
    """A plain-text table of the measurements."""
    lines = split_table(
        m["splits"],
        [
            ("n", 3, "samples_per_prompt", ""),
            ("pass@1", 7, "pass@1", ".3f"),
            ("pass@8", 7, "pass@8", ".3f"),
            ("pass@32", 8, "pass@32", ".3f"),
            ("entropy", 8, "entropy", ".3f"),
            ("solutions", 9, "distinct_solutions_per_solved", ".2f"),
            ("styles", 7, "distinct_styles", ".2f"),
        ],
    )
    return "\n".join(lines)


def measure_world(
    world: ToyWorld, *, n_samples: int, max_prompts: int, progress: bool, reuse: bool
) -> dict[str, Any]:
    """The countdown world's measurements for ``divrl toy``: the stored ones when ``reuse``
    and they were taken with these settings, else measured (and stored) now."""
    from divrl.toy.measure import load_measurements

    cfg = CountdownMeasureConfig(n_samples=n_samples, max_prompts=max_prompts)
    stored = load_measurements(world) if reuse else None
    if stored is None or stored.get("config") != {**cfg.__dict__, "splits": list(cfg.splits)}:
        stored = measure_countdown_model(world, cfg, progress=progress)
    return stored
