"""Supervised training of the toy base model (plain torch: AdamW, cosine, response-only loss)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm
from transformers import LlamaForCausalLM


@dataclass(frozen=True)
class SFTConfig:
    """Optimisation of the supervised (base-model) training."""

    steps: int = field(default=500, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=128, metadata={"help": "sequences per step"})
    lr: float = field(default=3e-3, metadata={"help": "peak AdamW learning rate"})
    warmup_steps: int = field(default=30, metadata={"help": "linear warm-up steps"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    threads: int = field(
        default=2, metadata={"help": "torch CPU threads (fixed so that runs are reproducible)"}
    )

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError("warmup_steps must be in [0, steps)")
        if self.lr <= 0:
            raise ValueError("lr must be > 0")


def collate(
    pairs: Sequence[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, labels), each [B, T]; labels are -100 on
    the prompt and the padding so that the loss covers the response (with its eos) only."""
    width = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    for i, (p, r) in enumerate(pairs):
        n = len(p) + len(r)
        ids[i, :n] = torch.tensor(p + r)
        mask[i, :n] = 1
        labels[i, len(p) : n] = torch.tensor(r)
    return ids, mask, labels


def train_sft(
    model: LlamaForCausalLM,
    corpus: Sequence[tuple[list[int], list[int]]],
    cfg: SFTConfig,
    pad_id: int,
    seed: int,
    progress: bool = True,
) -> dict[str, float]:
    """Train ``model`` in place on (prompt ids, response ids + eos) pairs.

    Step ``s`` uses ``corpus[s*B:(s+1)*B]`` (cycling), so the corpus is seen in order; draw
    it at random beforehand. Returns the final smoothed loss and the wall time.
    """
    if len(corpus) < cfg.batch_size:
        raise ValueError(f"corpus has {len(corpus)} examples, fewer than one batch")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train(model, corpus, cfg, pad_id, seed, progress)
    finally:
        torch.set_num_threads(threads_before)


def _train(
    model: LlamaForCausalLM,
    corpus: Sequence[tuple[list[int], list[int]]],
    cfg: SFTConfig,
    pad_id: int,
    seed: int,
    progress: bool,
) -> dict[str, float]:
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    start, ema = time.time(), None
    bar = tqdm(range(cfg.steps), desc="SFT", disable=not progress, unit="step")
    for step in bar:
        lo = (step * cfg.batch_size) % (len(corpus) - cfg.batch_size + 1)
        ids, mask, labels = collate(corpus[lo : lo + cfg.batch_size], pad_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}")
    model.eval()
    return {"final_loss": float(ema), "sft_seconds": time.time() - start}
