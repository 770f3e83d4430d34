"""What ``divrl eval`` reads from a real verl checkpoint, checked against verl's own merger
(used by ``test_main_ppo.py`` on the checkpoints its runs save)."""

from __future__ import annotations

from pathlib import Path

import torch


def assert_divrl_reads_verls_checkpoint(top: Path, step: int, tmp: Path) -> None:
    """``divrl eval``'s model for verl's checkpoint folder ``top`` is its newest step
    (``step``), with the weights verl's ``verl.model_merger`` (fsdp backend) writes from the
    same shards: equal after verl's cast to bfloat16, and kept in the config's dtype."""
    from safetensors.torch import load_file
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    from divrl.checkpoint.verl_checkpoint import MERGED_DIR
    from divrl.evaluation.model_loading import model_checkpoint, resolve_model_path

    actor = top / f"global_step_{step}" / "actor"
    folder = Path(resolve_model_path(top))
    assert folder == actor / MERGED_DIR
    assert model_checkpoint(top)["step"] == step
    target = tmp / f"verl_merged_{top.name}"
    config = ModelMergerConfig(
        operation="merge",
        backend="fsdp",
        local_dir=str(actor),
        target_dir=str(target),
        hf_model_config_path=str(actor / "huggingface"),
    )
    FSDPModelMerger(config).merge_and_save()
    theirs = load_file(target / "model.safetensors")
    ours = load_file(folder / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k].to(theirs[k].dtype), theirs[k]) for k in theirs)
    assert {v.dtype for v in ours.values()} == {torch.float32}  # fsdp_config.dtype=float32
