"""The toy base model: a small Llama-architecture causal LM, fp32, trained from scratch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


@dataclass(frozen=True)
class ToyModelConfig:
    """Size of the toy Llama (the default has about 0.8M parameters)."""

    hidden_size: int = field(default=128, metadata={"help": "model width d"})
    num_layers: int = field(default=4, metadata={"help": "transformer blocks"})
    num_heads: int = field(
        default=4, metadata={"help": "attention heads (hidden_size % heads == 0)"}
    )
    intermediate_size: int = field(default=336, metadata={"help": "SwiGLU MLP width"})
    max_length: int = field(
        default=128, metadata={"help": "context length in tokens (prompt + response)"}
    )

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        if min(self.hidden_size, self.num_layers, self.intermediate_size, self.max_length) < 1:
            raise ValueError("model sizes must be positive")


def build_model(
    cfg: ToyModelConfig, tokenizer: PreTrainedTokenizerFast, seed: int
) -> LlamaForCausalLM:
    """A freshly initialised fp32 ``LlamaForCausalLM`` (tied embeddings) for ``tokenizer``."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_length,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # no separate BOS: prompts are used as they are tokenized
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.eos_token_id
    return model
