"""``divrl export``: a Hugging Face ``save_pretrained`` folder from a sharded (FSDP) checkpoint.

``SOURCE`` is a run directory (its newest sharded ``checkpoints/step_*``), one checkpoint
``step_NNNNNN``, or a bare ``torch.distributed.checkpoint`` directory (then pass
``--config``). Runs in one process, whatever the number of ranks that saved it; the output
(safetensors, config, tokenizer) loads with ``AutoModelForCausalLM.from_pretrained`` and
``divrl eval --model``. DDP checkpoints need no export: their ``model/`` folder is one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="run directory, checkpoint step_NNNNNN, or DCP directory")
    parser.add_argument("--out", required=True, help="Hugging Face folder to write")
    parser.add_argument(
        "--config",
        default=None,
        help="folder with config.json (+ tokenizer); default: the checkpoint's model/ folder",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="dtype of the written weights; default: the model config's dtype",
    )


def run(args: argparse.Namespace) -> int:
    """Export the named checkpoint; for a run directory, the newest sharded checkpoint that
    loads (a damaged newer one is reported and skipped, as ``divrl train --resume`` does)."""
    from divrl.checkpoint.dcp import export_hf, is_sharded_checkpoint, resolve_sharded_checkpoint
    from divrl.checkpoint.resume import LOAD_ERRORS
    from divrl.cli import UsageError
    from divrl.runs import RunDir

    source = Path(args.source)
    if is_sharded_checkpoint(source):
        candidates = [source]
    else:
        steps = reversed(RunDir(source).checkpoints())
        candidates = [c.path for c in steps if is_sharded_checkpoint(c.path)]
        if not candidates:
            resolve_sharded_checkpoint(source)  # raises, saying what the folder holds
    for i, checkpoint in enumerate(candidates):
        try:
            out = export_hf(checkpoint, args.out, config_path=args.config, dtype=args.dtype)
        except LOAD_ERRORS as exc:
            why = _reason(exc)
            if i + 1 == len(candidates):
                older = " (and every older one above)" if i else ""
                raise UsageError(
                    f"{checkpoint}: the sharded checkpoint does not load ({why}){older}; it is "
                    "damaged or incomplete: export an earlier checkpoint step_N, or resume "
                    "training to write a new one"
                ) from exc
            print(
                f"divrl export: warning: {checkpoint} does not load ({why}); exporting the "
                f"previous checkpoint {candidates[i + 1].name}",
                file=sys.stderr,
            )
            continue
        print(f"exported {checkpoint} -> {out}")
        return 0
    return 2


def _reason(exc: BaseException) -> str:
    """``Type: message`` of the error that stopped the load; DCP wraps each rank's error
    (with its traceback) in a CheckpointException: the first rank's error is the reason."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        exc = inner[0] if isinstance(inner, tuple) else inner
    text = str(exc).split("Traceback (most recent call last)")[0]
    return f"{type(exc).__name__}: {' '.join(text.split())[:200]}".rstrip(": ")
