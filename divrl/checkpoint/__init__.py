"""Checkpoints: the formats (plain accelerate state + transformers folder, or DCP shards)
behind one interface, resuming from the newest that loads, and reading a checkpoint as a
Hugging Face model for evaluation and export.

- :mod:`divrl.checkpoint.strategies`: :class:`CheckpointStrategy` (``save`` / ``load`` /
  ``reads``), :class:`PlainCheckpoints`, :class:`ShardedCheckpoints`, pruning;
- :mod:`divrl.checkpoint.resume`: :func:`load_latest`, :func:`set_corrupt_aside`;
- :mod:`divrl.checkpoint.dcp`: the sharded format itself (``save_dcp``, ``load_dcp``) and
  :func:`export_hf` / :func:`ensure_hf_weights` (what ``divrl export`` and ``divrl eval``
  need, without the trainer);
- :mod:`divrl.checkpoint.verl_checkpoint`: a verl checkpoint folder read as a Hugging Face
  model folder (its ``huggingface/`` weights, or its FSDP shards merged) for ``divrl eval``.

Below the training and evaluation layers (beside :mod:`divrl.runs`, whose layout it
writes): the trainer's checkpoint stage picks a strategy, evaluation reads the result.
"""
