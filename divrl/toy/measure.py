"""Measure a toy world's base model: Pass@k, near-perfect prompts, style diversity.

Sampling and scoring are ``divrl eval``'s (:func:`divrl.evaluation.runner.generate_samples`
on the rollout engine, then :func:`~divrl.evaluation.runner.score_samples`): temperature 1
with ``top_p=1`` and no top-k (the full distribution), batched with left padding and a KV
cache, scored by ``divrl.rewards``; Pass@k is the unbiased estimator, and the distinct
styles per prompt are the same metric as ``divrl eval``'s ``mean_distinct_styles`` (the
one classifier of ``divrl.evaluation.styles``, averaged over prompts with a styled sample).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from divrl.evaluation.pass_at_k import pass_at_k_array
from divrl.evaluation.runner import EvalConfig, generate_samples, score_samples
from divrl.evaluation.summary import per_prompt_arrays
from divrl.toy.kit import MeasureTarget, ToyWorld

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
    batch_size: int = field(
        default=512,
        metadata={"help": "sequences per generate call (batch_size // n prompts at a time)"},
    )
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

    def eval_config(self, n: int) -> EvalConfig:
        """The ``divrl eval`` settings that sample ``n`` responses per prompt this way."""
        return EvalConfig(
            n=n,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            greedy=False,
            batch_size=max(1, self.batch_size // n),
            seed=self.seed,
            limit=self.max_prompts,
        )


def sample_and_score(
    model, tokenizer, examples: Sequence[Any], cfg: EvalConfig, *, threads: int | None = None
) -> list[dict[str, Any]]:
    """``divrl eval``'s per-prompt results (scores, styles) for ``examples``.

    ``threads`` (if given) sets torch's CPU threads while sampling.
    """
    threads_before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        records = generate_samples(model, tokenizer, examples, cfg, progress=False)
    finally:
        torch.set_num_threads(threads_before)
    return score_samples(records, cfg, progress=False)


def split_stats(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pass@k, near-perfect share and distinct styles of one split's eval results."""
    a = per_prompt_arrays(results)
    n, c = int(a["n"].min()), a["c"]
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= n]
    styled, solved = a["styles"] > 0, a["c"] > 0
    stats: dict[str, Any] = {
        "prompts": len(results),
        "samples_per_prompt": n,
        **{f"pass@{k}": float(pass_at_k_array(n, c, k).mean()) for k in ks},
        "all_correct_share": float((c == n).mean()),
        "none_correct_share": float((c == 0).mean()),
        "distinct_styles": float(a["styles"][styled].mean()) if styled.any() else 0.0,
        "distinct_correct_styles": (
            float(a["correct_styles"][solved & styled].mean()) if (solved & styled).any() else 0.0
        ),
    }
    for i, r in enumerate(results):
        info = r["extra_info"] or {}
        if info.get("family"):
            key = f"{info['family']}{'_hard' if info.get('hard') else ''}"
            stats.setdefault("_by_family", {}).setdefault(key, []).append(c[i] / n)
    by_family = stats.pop("_by_family", {})
    if by_family:
        stats["pass@1_by_family"] = {
            k: float(np.mean(by_family[k])) for k in sorted(by_family, key=_family_order)
        }
    return stats


def _family_order(key: str) -> tuple[str, bool]:
    return key.removesuffix("_hard"), key.endswith("_hard")


def measure_base_model(
    world: ToyWorld, cfg: MeasureConfig | None = None, progress: bool = True
) -> dict[str, Any]:
    """Sample the world's base model and measure it; the result is also saved in the world.

    Every eval split (``test``, ``cross_domain``, ``ood_*``) gets ``n_samples`` samples per
    prompt (Pass@k, distinct styles); ``train`` gets ``n_train_samples`` (the share of
    prompts with all samples correct: DPH-RL's near-perfect set).
    """
    from tqdm.auto import tqdm

    from divrl.data import load_examples
    from divrl.evaluation.runner import load_model

    cfg = cfg or MeasureConfig()
    model, tokenizer = load_model(world.model_dir)
    result: dict[str, Any] = {"config": cfg.__dict__, "splits": {}}
    plan = [(s, cfg.n_samples) for s in world.splits if s != "train"]
    plan.append(("train", cfg.n_train_samples))
    bar = tqdm(plan, desc="measuring the base model", disable=not progress, unit="split")
    for split, n in bar:
        bar.set_postfix_str(f"{split}: {n} samples per prompt")
        examples = load_examples(world.splits[split], db_dir=world.db_dir, limit=cfg.max_prompts)
        results = sample_and_score(
            model, tokenizer, examples, cfg.eval_config(n), threads=cfg.threads
        )
        result["splits"][split] = split_stats(results)
        result["splits"][split]["examples"] = [
            {"prompt": r["prompt"], "samples": r["texts"][:4]} for r in results[:2]
        ]
    (world.root / MEASUREMENTS_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def load_measurements(world: ToyWorld) -> dict[str, Any] | None:
    path = Path(world.root) / MEASUREMENTS_FILE
    return json.loads(path.read_text()) if path.exists() else None


def check_targets(
    m: dict[str, Any], targets: Sequence[MeasureTarget]
) -> list[tuple[str, float, str, bool]]:
    """(name, value, wanted, ok) for each of a world's design ``targets``
    (:attr:`divrl.toy.scaffold.WorldScaffold.targets`)."""
    return [target.check(m) for target in targets]


#: a column of :func:`split_table`: header, width, the key of a split's measurements
#: (a missing one shows ``nan``) and the number's format (``""``: as it is)
Column = tuple[str, int, str, str]


def split_table(splits: dict[str, dict[str, Any]], columns: Sequence[Column]) -> list[str]:
    """The lines of a plain-text table of per-split measurements: the split's name, then
    ``columns``; what every world's ``format`` prints its measurements with."""
    lines = [" ".join([f"{'split':<13}", *(f"{head:>{width}}" for head, width, _, _ in columns)])]
    for split, s in splits.items():
        cells = (f"{s.get(key, float('nan')):>{width}{fmt}}" for _, width, key, fmt in columns)
        lines.append(" ".join([f"{split:<13}", *cells]))
    return lines


def format_measurements(m: dict[str, Any], targets: Sequence[MeasureTarget] = ()) -> str:
    """A plain-text table of the measurements and the checks of the world's ``targets``."""
    lines = split_table(
        m["splits"],
        [
            ("prompts", 7, "prompts", ""),
            ("n", 3, "samples_per_prompt", ""),
            ("pass@1", 7, "pass@1", ".3f"),
            ("pass@4", 7, "pass@4", ".3f"),
            ("pass@16", 8, "pass@16", ".3f"),
            ("all-ok", 7, "all_correct_share", ".3f"),
            ("styles", 7, "distinct_styles", ".2f"),
            ("ok-styles", 9, "distinct_correct_styles", ".2f"),
        ],
    )
    if targets:
        lines.append("")
    for name, value, want, ok in check_targets(m, targets):
        lines.append(f"{'OK  ' if ok else 'MISS'} {name:<24} {value:7.3f}  (want {want})")
    return "\n".join(lines)


def measure_world(
    world: ToyWorld, *, n_samples: int, max_prompts: int, progress: bool, reuse: bool
) -> dict[str, Any]:
    """A world's measurements for ``divrl toy``: the stored ones when ``reuse`` and
    they were taken with these settings, else measured (and stored) now."""
    cfg = MeasureConfig(n_samples=n_samples, max_prompts=max_prompts)
    stored = load_measurements(world) if reuse else None
    if stored is None or stored.get("config") != cfg.__dict__:
        stored = measure_base_model(world, cfg, progress=progress)
    return stored
