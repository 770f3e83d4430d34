"""``divrl eval --model`` on a verl checkpoint folder (verl 0.9.1's layout, built here):
the newest step, its ``huggingface/`` weights or its FSDP shards merged, the step recorded
in the evaluation's provenance, and one line naming verl's merger when neither is there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from divrl.checkpoint.verl_checkpoint import MERGED_DIR, find_verl_checkpoint
from divrl.cli import main
from divrl.data import fixture_path
from divrl.evaluation.model_loading import resolve_model_path


def _write_shards(state: dict, actor: Path, world: int) -> None:
    """Each rank's FSDP2 shard as verl saves it (``torch.save`` of DTensors, ``Shard(0)``
    on an ``fsdp`` mesh) from a full state dict. The mesh is built without a process group
    (torch's ``_init_backend=False``): the files hold what a real run's hold, and this
    process is left without distributed state."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = DeviceMesh(
        "cpu", torch.arange(world), mesh_dim_names=("fsdp",), _init_backend=False, _rank=0
    )
    for rank in range(world):
        shard = {
            key: DTensor.from_local(
                torch.chunk(value, world)[rank].clone(),
                mesh,
                [Shard(0)],
                run_check=False,
                shape=value.shape,
                stride=value.stride(),
            )
            for key, value in state.items()
        }
        torch.save(shard, actor / f"model_world_size_{world}_rank_{rank}.pt")


def _step(root: Path, step: int, model, tokenizer, weights: bool) -> Path:
    """``root/global_step_<step>/actor`` with ``huggingface/`` (weights only if asked)."""
    hf = root / f"global_step_{step}" / "actor" / "huggingface"
    if weights:
        model.save_pretrained(hf)
    else:
        model.config.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    return hf.parent


@pytest.fixture
def verl_root(tmp_path, tiny_lm):
    """Steps 1 and 3 with Hugging Face weights (different ones), the tracker naming 3."""
    model, tokenizer = tiny_lm
    root = tmp_path / "checkpoints"
    _step(root, 1, model, tokenizer, weights=True)
    moved = type(model)(model.config)  # other weights: which step was loaded is visible
    _step(root, 3, moved, tokenizer, weights=True)
    (root / "latest_checkpointed_iteration.txt").write_text("3")
    return root


def test_a_verl_checkpoint_folder_resolves_to_its_step(verl_root):
    hf3 = str(verl_root / "global_step_3" / "actor" / "huggingface")
    assert resolve_model_path(verl_root) == hf3  # the top folder: the tracker's step
    assert resolve_model_path(verl_root / "global_step_3") == hf3
    assert resolve_model_path(verl_root / "global_step_1" / "actor").endswith(
        "global_step_1/actor/huggingface"
    )
    assert find_verl_checkpoint(verl_root / "global_step_1").step == 1


def test_divrl_eval_reads_a_verl_checkpoint_and_records_its_step(verl_root, tmp_path):
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(verl_root), "--out", str(out), "--n", "1", "--limit", "1"]
    argv += ["--data", f"math={fixture_path('math.jsonl')}", "--max-new-tokens", "2"]
    assert main([*argv, "--no-progress"]) == 0
    meta = json.loads((out / "math" / "eval_config.json").read_text())
    assert meta["resolved_model"].endswith("global_step_3/actor/huggingface")
    checkpoint = meta["provenance"]["checkpoint"]
    assert checkpoint["format"] == "verl" and checkpoint["step"] == 3
    assert checkpoint["actor_dir"] == str(verl_root / "global_step_3" / "actor")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, tiny_lm):
    """A step saved without hf_model: 3 ranks' FSDP2 shards, config and tokenizer only.
    No dimension of the model (vocabulary 20, widths 32 and 64) splits evenly over them."""
    model, tokenizer = tiny_lm
    root = tmp_path_factory.mktemp("verl_sharded")
    actor = _step(root, 2, model, tokenizer, weights=False)
    (actor / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 3}')
    _write_shards(model.state_dict(), actor, 3)
    return actor, model


def test_fsdp_shards_are_merged_into_the_saved_model(sharded):
    from transformers import AutoModelForCausalLM

    actor, model = sharded
    assert model.config.vocab_size % 3 and len(list(actor.glob("model_world_size_3_*"))) == 3
    folder = resolve_model_path(actor.parent)
    assert folder == str(actor / MERGED_DIR)
    merged = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    saved = model.state_dict()
    assert merged.keys() == saved.keys()
    assert all(torch.equal(merged[k], saved[k]) for k in saved)
    # merged once: a second resolution reuses the folder
    weights = next(Path(folder).glob("*.safetensors"))
    stamp = weights.stat().st_mtime_ns
    assert resolve_model_path(actor) == folder and weights.stat().st_mtime_ns == stamp


def test_a_checkpoint_without_weights_or_shards_names_verls_merger(tmp_path, tiny_lm, capsys):
    model, tokenizer = tiny_lm
    actor = _step(tmp_path / "ckpt", 5, model, tokenizer, weights=False)
    argv = ["eval", "--model", str(actor.parent), "--out", str(tmp_path / "eval")]
    assert main([*argv, "--data", f"math={fixture_path('math.jsonl')}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"python -m verl.model_merger merge --backend fsdp --local_dir {actor} " in err
    assert (
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]" in err
    )


def test_a_merge_finished_meanwhile_by_another_evaluation_is_used_not_replaced(
    sharded, monkeypatch
):
    # another evaluation merges the same shards while this one merges them: its folder
    # (which it may be reading) stays, and this one resolves to it
    from divrl.checkpoint import verl_checkpoint as vc

    actor, _ = sharded
    shutil.rmtree(actor / MERGED_DIR, ignore_errors=True)  # the shared fixture's earlier merge
    merge = vc.merge_fsdp_shards
    theirs = {}

    def merge_while_another_finishes(ckpt, shards=None):
        state = merge(ckpt, shards)
        if not theirs:
            monkeypatch.setattr(vc, "merge_fsdp_shards", merge)
            theirs["folder"] = resolve_model_path(actor)  # the other evaluation's merge
            weights = next(Path(theirs["folder"]).glob("*.safetensors"))
            theirs["inode"] = weights.stat().st_ino
        return state

    monkeypatch.setattr(vc, "merge_fsdp_shards", merge_while_another_finishes)
    assert resolve_model_path(actor) == theirs["folder"] == str(actor / MERGED_DIR)
    assert next(Path(theirs["folder"]).glob("*.safetensors")).stat().st_ino == theirs["inode"]
    assert [p.name for p in actor.iterdir() if p.name.startswith(".")] == []
