"""The provenance of a TRL run through divrl's adapter, as ``divrl train`` records its own.

At each ``train()`` (a start, or a resume from a checkpoint) the main process appends one
record to ``<output_dir>/provenance.json`` (:class:`divrl.runs.RunDir`'s file and format:
``{"sessions": [...]}``, oldest first): :func:`divrl.provenance.provenance` (the commit and
whether the tree was dirty, the versions of divrl, torch, transformers, trl, ..., threads,
device, CPU) with the hash of the config as TRL serialises it (``args.to_json_string()``),
the fingerprint of the training rows, the generation engine, ``event`` (``start`` or
``resume``) and ``step`` (the step training starts from).
"""

from __future__ import annotations

import json
from typing import Any

from transformers import TrainerCallback

from divrl.provenance import provenance, records_fingerprint
from divrl.runs import RunDir

__all__ = ["ProvenanceCallback", "trl_provenance"]


def trl_provenance(args: Any, dataset: Any) -> dict[str, Any]:
    """The provenance record of a TRL run with config ``args`` (a ``GRPOConfig``) on
    ``dataset`` (its rows fingerprinted in order; ``None`` for a dataset without a length,
    such as a streamed one)."""
    sized = dataset is not None and hasattr(dataset, "__len__")
    engine = f"vllm ({args.vllm_mode})" if args.use_vllm else "transformers"
    return provenance(
        config=json.loads(args.to_json_string()),
        data=records_fingerprint(dataset) if sized else None,
        engine=engine,
        trainer="trl",
        prompts=len(dataset) if sized else None,
    )


class ProvenanceCallback(TrainerCallback):
    """Appends the run's provenance record to ``output_dir`` when training begins (the
    world's main process only); ``dataset`` is the trainer's ``train_dataset``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            step = state.global_step  # the checkpoint's step on a resume
            record = trl_provenance(args, self.dataset)
            run = RunDir(args.output_dir)
            run.root.mkdir(parents=True, exist_ok=True)
            run.add_provenance({"event": "resume" if step else "start", "step": step, **record})
        return control
