"""Shared by tests/training/test_fsdp.py and its torchrun worker: the tied tiny Llama, the
fixed training batches and the hyper-parameters of both sides."""

from __future__ import annotations

from pathlib import Path

import torch

LR = 1e-2
STEPS = 3
PROMPT = [1, 5, 6, 7]


def build_tied_tiny_lm(path: Path) -> Path:
    """The tiny character Llama of train_helpers, with ``lm_head`` tied to ``embed_tokens``
    (as the toy world's model): the case FSDP must keep as one parameter."""
    from train_helpers import build_tiny_lm
    from transformers import LlamaConfig, LlamaForCausalLM

    build_tiny_lm(path)
    config = LlamaConfig.from_pretrained(path)
    config.tie_word_embeddings = True
    torch.manual_seed(1)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def train_batches(steps: int, rows: int = 4, length: int = 12) -> list[torch.Tensor]:
    """``steps`` batches of random character ids (no padding: every row has equal weight)."""
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, 20, (rows, length), generator=generator) for _ in range(steps)]
