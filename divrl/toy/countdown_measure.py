"""Measure the countdown world's base model: Pass@k, entropy, distinct solutions, styles.

Samples at temperature 1 (top-p 1, no top-k) with :func:`divrl.toy.measure.sample_responses`,
scores with the ``countdown`` verifier, and adds what the search world is for:

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

from divrl.evaluation.pass_at_k import pass_at_k_array
from divrl.rewards.countdown_reward import (
    answer_attempt,
    canonical_expression,
    operator_style,
    parse_ground_truth,
)
from divrl.toy.measure import sample_responses, score_samples, split_stats
from divrl.toy.world import ToyWorld, read_rows

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


def countdown_split_stats(
    rows: list[dict[str, Any]], samples: list[list[str]], correct: np.ndarray
) -> dict[str, Any]:
    """Pass@k, distinct correct solutions and operator styles of one countdown split."""
    n = correct.shape[1]
    c = correct.sum(axis=1)
    solved_distinct, styles_all, styles_ok = [], [], []
    for row, group, ok in zip(rows, samples, correct, strict=True):
        _, target = parse_ground_truth(row["reward_model"]["ground_truth"])
        answers = [answer_attempt(s, target) for s in group]
        good = [a for a, g in zip(answers, ok, strict=True) if g]
        if good:
            solved_distinct.append(len({canonical_expression(a) for a in good}))
        styles_all.append(len({operator_style(a) for a in answers} - {None}))
        styles_ok.append(len({operator_style(a) for a in good}))
    return {
        "prompts": len(rows),
        "samples_per_prompt": n,
        **{
            f"pass@{k}": float(pass_at_k_array(n, c, k).mean())
            for k in (1, 2, 4, 8, 16, 32)
            if k <= n
        },
        "all_correct_share": float((c == n).mean()),
        "none_correct_share": float((c == 0).mean()),
        "distinct_solutions_per_solved": float(np.mean(solved_distinct))
        if solved_distinct
        else 0.0,
        "distinct_styles": float(np.mean(styles_all)),
        "distinct_correct_styles": float(np.mean(styles_ok)),
    }


def measure_countdown_model(
    world: ToyWorld, cfg: CountdownMeasureConfig | None = None, progress: bool = True
) -> dict[str, Any]:
    """Sample and measure the world's base model; the result is also saved in the world."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = cfg or CountdownMeasureConfig()
    model = AutoModelForCausalLM.from_pretrained(world.model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(world.model_dir)
    result: dict[str, Any] = {"config": {**cfg.__dict__, "splits": list(cfg.splits)}, "splits": {}}
    for split in cfg.splits:
        rows = read_rows(world.splits[split])[: cfg.max_prompts]
        prompts = [r["prompt"] for r in rows]
        samples = sample_responses(
            model, tokenizer, prompts, cfg.n_samples, max_new_tokens=cfg.max_new_tokens,
            batch_size=cfg.batch_size, seed=cfg.seed, threads=1, progress=progress,
        )  # fmt: skip
        correct = score_samples(rows, samples)
        if rows[0]["data_source"] == "countdown":
            stats = countdown_split_stats(rows, samples, correct)
        else:
            stats = split_stats(rows, samples, correct)
        flat_p = [p for p, g in zip(prompts, samples, strict=True) for _ in g]
        stats["entropy"] = response_entropy(
            model, tokenizer, flat_p, [s for g in samples for s in g]
        )
        stats["mean_response_chars"] = float(np.mean([len(s) for g in samples for s in g]))
        stats["examples"] = [{"prompt": prompts[i], "samples": samples[i][:4]} for i in range(2)]
        result["splits"][split] = stats
    (world.root / MEASUREMENTS_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_countdown_measurements(m: dict[str, Any]) -> str:
    """A plain-text table of the measurements."""
    lines = [
        f"{'split':<13} {'n':>3} {'pass@1':>7} {'pass@8':>7} {'pass@32':>8} {'entropy':>8} "
        f"{'solutions':>9} {'styles':>7}"
    ]
    for split, s in m["splits"].items():
        lines.append(
            f"{split:<13} {s['samples_per_prompt']:>3} {s['pass@1']:>7.3f} "
            f"{s.get('pass@8', float('nan')):>7.3f} {s.get('pass@32', float('nan')):>8.3f} "
            f"{s['entropy']:>8.3f} {s.get('distinct_solutions_per_solved', float('nan')):>9.2f} "
            f"{s['distinct_styles']:>7.2f}"
        )
    return "\n".join(lines)
