"""Measure a toy world's base model: Pass@k, near-perfect prompts, style diversity.

Sampling is HF ``generate`` at temperature 1 with ``top_p=1`` and no top-k (the full
distribution), batched with left padding and a KV cache; answers are scored by
``divrl.rewards.score_batch``; Pass@k is the unbiased estimator.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from divrl.data.toy_math import math_style
from divrl.data.toy_sql import sql_style
from divrl.evaluation.pass_at_k import pass_at_k_array
from divrl.toy.world import ToyWorld, read_rows

MEASUREMENTS_FILE = "measurements.json"


@dataclass(frozen=True)
class MeasureConfig:
    """How the base model is measured."""

    n_samples: int = field(default=16, metadata={"help": "samples per prompt for Pass@k"})
    n_train_samples: int = field(
        default=8, metadata={"help": "samples per train prompt for the near-perfect share"}
    )
    max_prompts: int = field(
        default=256, metadata={"help": "prompts per split (the first ones of each split)"}
    )
    max_new_tokens: int = field(default=48, metadata={"help": "response length limit in tokens"})
    batch_size: int = field(default=512, metadata={"help": "sequences per generate call"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    threads: int = field(
        default=1,
        metadata={
            "help": "torch CPU threads while sampling (decoding steps are small matrix "
            "products; one thread avoids OpenMP spin-waits on a shared CPU)"
        },
    )

    def __post_init__(self) -> None:
        if self.n_samples < 1 or self.n_train_samples < 1 or self.max_prompts < 1:
            raise ValueError("n_samples, n_train_samples and max_prompts must be >= 1")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 (sampling, not greedy decoding)")


@torch.no_grad()
def sample_responses(
    model,
    tokenizer,
    prompts: Sequence[str],
    n: int,
    *,
    max_new_tokens: int = 48,
    batch_size: int = 512,
    temperature: float = 1.0,
    seed: int = 0,
    threads: int | None = None,
    progress: bool = False,
) -> list[list[str]]:
    """``n`` sampled responses per prompt (text up to, without, the eos).

    Prompts are repeated ``n`` times and sampled ``batch_size`` sequences at a time with
    left padding; ``threads`` (if given) sets torch's CPU threads for the duration.
    """
    threads_before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _sample(
            model, tokenizer, prompts, n, max_new_tokens, batch_size, temperature, seed, progress
        )
    finally:
        torch.set_num_threads(threads_before)


def _sample(
    model,
    tokenizer,
    prompts: Sequence[str],
    n: int,
    max_new_tokens: int,
    batch_size: int,
    temperature: float,
    seed: int,
    progress: bool,
) -> list[list[str]]:
    torch.manual_seed(seed)
    flat = [p for p in prompts for _ in range(n)]
    texts: list[str] = []
    tokenizer.padding_side = "left"
    starts = range(0, len(flat), batch_size)
    for lo in tqdm(starts, desc="sampling", disable=not progress, unit="batch"):
        enc = tokenizer(flat[lo : lo + batch_size], return_tensors="pt", padding=True)
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        texts += tokenizer.batch_decode(
            out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
        )
    return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]


def score_samples(rows: Sequence[dict[str, Any]], samples: Sequence[Sequence[str]]) -> np.ndarray:
    """[P, n] 0/1 scores of each sample against its row's ground truth."""
    from divrl.rewards import score_batch

    items = [
        {
            "data_source": row["data_source"],
            "solution_str": s,
            "ground_truth": row["reward_model"]["ground_truth"],
            "extra_info": row.get("extra_info") or {},
        }
        for row, group in zip(rows, samples, strict=True)
        for s in group
    ]
    scores = np.asarray(score_batch(items).scores, dtype=float)
    return (scores.reshape(len(rows), -1) >= 1.0).astype(int)


def split_stats(
    rows: Sequence[dict[str, Any]], samples: Sequence[Sequence[str]], correct: np.ndarray
) -> dict[str, Any]:
    """Pass@k, near-perfect share and distinct styles of one split."""
    n = correct.shape[1]
    c = correct.sum(axis=1)
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= n]
    classify = math_style if rows[0]["data_source"] == "toy_math" else sql_style
    styles_all, styles_ok = [], []
    for group, ok in zip(samples, correct, strict=True):
        labels = [classify(s) for s in group]
        styles_all.append(len({lab for lab in labels if lab != "other"}))
        styles_ok.append(len({lab for lab, good in zip(labels, ok, strict=True) if good}))
    stats: dict[str, Any] = {
        "prompts": len(rows),
        "samples_per_prompt": n,
        **{f"pass@{k}": float(pass_at_k_array(n, c, k).mean()) for k in ks},
        "all_correct_share": float((c == n).mean()),
        "none_correct_share": float((c == 0).mean()),
        "distinct_styles": float(np.mean(styles_all)),
        "distinct_correct_styles": float(np.mean(styles_ok)),
    }
    families = sorted({r["extra_info"].get("family", "") for r in rows})
    for fam in families:
        for hard in (False, True):
            idx = [
                i
                for i, r in enumerate(rows)
                if r["extra_info"].get("family") == fam
                and bool(r["extra_info"].get("hard")) == hard
            ]
            if idx:
                key = f"{fam}{'_hard' if hard else ''}"
                stats.setdefault("pass@1_by_family", {})[key] = float(c[idx].mean() / n)
    return stats


def measure_base_model(
    world: ToyWorld, cfg: MeasureConfig | None = None, progress: bool = True
) -> dict[str, Any]:
    """Sample the world's base model and measure it; the result is also saved in the world.

    Splits ``test``, ``cross_domain`` and ``ood_math`` get ``n_samples`` samples per prompt
    (Pass@k, distinct styles); ``train`` gets ``n_train_samples`` (the share of prompts
    with all samples correct: DPH-RL's near-perfect set).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = cfg or MeasureConfig()
    model = AutoModelForCausalLM.from_pretrained(world.model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(world.model_dir)
    result: dict[str, Any] = {"config": cfg.__dict__, "splits": {}}
    plan = [("test", cfg.n_samples), ("cross_domain", cfg.n_samples), ("ood_math", cfg.n_samples)]
    plan.append(("train", cfg.n_train_samples))
    for split, n in plan:
        rows = read_rows(world.splits[split])[: cfg.max_prompts]
        samples = sample_responses(
            model,
            tokenizer,
            [r["prompt"] for r in rows],
            n,
            max_new_tokens=cfg.max_new_tokens,
            batch_size=cfg.batch_size,
            temperature=cfg.temperature,
            seed=cfg.seed,
            threads=cfg.threads,
            progress=progress,
        )
        correct = score_samples(rows, samples)
        result["splits"][split] = split_stats(rows, samples, correct)
        result["splits"][split]["examples"] = [
            {"prompt": rows[i]["prompt"], "samples": samples[i][:4]} for i in range(2)
        ]
    (world.root / MEASUREMENTS_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def load_measurements(world: ToyWorld) -> dict[str, Any] | None:
    path = Path(world.root) / MEASUREMENTS_FILE
    return json.loads(path.read_text()) if path.exists() else None


#: acceptance ranges of the issue: (split, statistic, low, high)
TARGETS: tuple[tuple[str, str, float, float], ...] = (
    ("test", "pass@1", 0.2, 0.7),
    ("train", "all_correct_share", 0.05, 0.40),
    ("test", "distinct_styles", 2.0, float("inf")),
)


def check_targets(m: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """(name, value, wanted, ok) for each acceptance property of the issue."""
    out = []
    for split, stat, lo, hi in TARGETS:
        v = m["splits"][split][stat]
        want = f">= {lo}" if hi == float("inf") else f"in [{lo}, {hi}]"
        out.append((f"{split} {stat}", v, want, lo <= v <= hi))
    t = m["splits"]["test"]
    gap = t["pass@16"] - t["pass@1"] if "pass@16" in t else float("nan")
    out.append(("test pass@16 - pass@1", gap, ">= 0.15", gap >= 0.15))
    v = m["splits"]["ood_math"]["pass@1"]
    out.append(("ood_math pass@1", v, "> 0.05 (non-trivial)", v > 0.05))
    return out


def format_measurements(m: dict[str, Any]) -> str:
    """A plain-text table of the measurements and the acceptance checks."""
    lines = [
        f"{'split':<13} {'prompts':>7} {'n':>3} {'pass@1':>7} {'pass@4':>7} {'pass@16':>8} "
        f"{'all-ok':>7} {'styles':>7} {'ok-styles':>9}"
    ]
    for split, s in m["splits"].items():
        lines.append(
            f"{split:<13} {s['prompts']:>7} {s['samples_per_prompt']:>3} {s['pass@1']:>7.3f} "
            f"{s.get('pass@4', float('nan')):>7.3f} {s.get('pass@16', float('nan')):>8.3f} "
            f"{s['all_correct_share']:>7.3f} {s['distinct_styles']:>7.2f} "
            f"{s['distinct_correct_styles']:>9.2f}"
        )
    lines.append("")
    for name, value, want, ok in check_targets(m):
        lines.append(f"{'OK  ' if ok else 'MISS'} {name:<24} {value:7.3f}  (want {want})")
    return "\n".join(lines)
