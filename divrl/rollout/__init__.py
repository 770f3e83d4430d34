"""Rollout engines behind one interface: prompt token ids in; responses, log-probs, texts out.

``hf`` (transformers ``generate``) is the CPU default; ``vllm`` is optional and imported
only when built.
"""

from divrl.rollout.base import (
    RolloutEngine,
    RolloutOutput,
    SamplingParams,
    collate,
    pad_token_id,
)
from divrl.rollout.hf import HFEngine

__all__ = [
    "HFEngine",
    "RolloutEngine",
    "RolloutOutput",
    "SamplingParams",
    "collate",
    "pad_token_id",
]
