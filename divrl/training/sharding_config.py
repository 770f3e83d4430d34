"""The settings of how the policy is spread over the processes (``train.strategy`` and the
FSDP2 knobs), without torch, so that the config module can extend them:
``TrainConfig`` inherits :class:`FSDPConfig`, and :mod:`divrl.training.fsdp` applies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["PARAM_DTYPES", "STRATEGIES", "FSDPConfig"]

STRATEGIES = ("ddp", "fsdp")
PARAM_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class FSDPConfig:
    """How the policy is spread over the processes (``train.*`` in the trainer's config)."""

    strategy: Literal["ddp", "fsdp"] = field(
        default="ddp",
        metadata={
            "help": "ddp: every process holds the whole model, its gradients and AdamW state "
            "(~16 bytes/param). fsdp: PyTorch FSDP2 fully_shard on every decoder layer and the "
            "root, all three split across the processes (~16/N bytes/param). Launch either with "
            "torchrun (--nproc_per_node; --nnodes and --rdzv-endpoint for several nodes) or "
            "accelerate launch (docs/scaling.md). A single process started without a launcher "
            "keeps a plain model (nothing to shard) but still writes sharded checkpoints"
        },
    )
    param_dtype: Literal["float32", "bfloat16", "float16"] | None = field(
        default=None,
        metadata={
            "help": "fsdp only: dtype of the all-gathered parameters used in forward/backward "
            "(MixedPrecisionPolicy.param_dtype). null: the model's own dtype (model.dtype), no "
            "mixed precision. bfloat16 on a GPU with model.dtype=float32: bf16 compute, float32 "
            "master weights and float32 gradient reduction"
        },
    )
    fsdp_offload: bool = field(
        default=False,
        metadata={
            "help": "fsdp only: keep the parameter shards, gradients and optimiser state in CPU memory "
            "(CPUOffloadPolicy); the optimiser step runs on the CPU. Frees GPU memory for "
            "activations and vLLM at the cost of host<->device copies every step"
        },
    )
    fsdp_reshard_after_forward: bool = field(
        default=True,
        metadata={
            "help": "fsdp only: free each layer's gathered parameters after its forward and all-gather "
            "them again for the backward (ZeRO-3, least memory). false: keep them until the "
            "backward (one all-gather fewer per layer, more memory)"
        },
    )

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"train.strategy={self.strategy!r}: choose one of {STRATEGIES}")
        if self.param_dtype is not None and self.param_dtype not in PARAM_DTYPES:
            raise ValueError(
                f"train.param_dtype={self.param_dtype!r}: choose null or one of {PARAM_DTYPES}"
            )
        if self.strategy == "ddp" and (self.fsdp_offload or self.param_dtype is not None):
            raise ValueError(
                "train.fsdp_offload and train.param_dtype apply to train.strategy=fsdp only: "
                "set train.strategy=fsdp or leave them at false/null"
            )
