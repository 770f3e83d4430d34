"""``divrl export``: a Hugging Face ``save_pretrained`` folder from a sharded (FSDP) checkpoint.

``SOURCE`` is a run directory (its newest sharded ``checkpoints/step_*``), one checkpoint
``step_NNNNNN``, or a bare ``torch.distributed.checkpoint`` directory (then pass
``--config``). Runs in one process, whatever the number of ranks that saved it; the output
(safetensors, config, tokenizer) loads with ``AutoModelForCausalLM.from_pretrained`` and
``divrl eval --model``. DDP checkpoints need no export: their ``model/`` folder is one.
"""

from __future__ import annotations

import argparse


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
    from divrl.checkpoint.dcp import export_hf, resolve_sharded_checkpoint

    checkpoint = resolve_sharded_checkpoint(args.source)
    out = export_hf(checkpoint, args.out, config_path=args.config, dtype=args.dtype)
    print(f"exported {checkpoint} -> {out}")
    return 0
