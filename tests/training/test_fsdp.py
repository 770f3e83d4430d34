"""FSDP2 building blocks (divrl/training/fsdp.py, divrl/checkpoint/dcp.py, divrl export).

One ``torchrun --nproc_per_node 2`` (gloo) run of tests/training/fsdp_worker.py trains the
tied tiny Llama sharded; the tests compare what it wrote with one unsharded process.
"""

import copy
import json
from pathlib import Path

import pytest
import torch
from fsdp_helpers import LR, PROMPT, STEPS, build_tied_tiny_lm, train_batches
from train_helpers import run_torchrun

from divrl.checkpoint.dcp import (
    export_hf,
    load_dcp,
    resolve_sharded_checkpoint,
    save_dcp,
)
from divrl.training.fsdp import FSDPConfig, decoder_layers, strip_wrapper_prefixes

WORKER = Path(__file__).parent / "fsdp_worker.py"


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory):
    return build_tied_tiny_lm(tmp_path_factory.mktemp("tied") / "model")


@pytest.fixture(scope="module")
def sharded_run(tied_model_dir, tmp_path_factory):
    """The worker's output directory after one 2-process run."""
    out = tmp_path_factory.mktemp("fsdp")
    proc = run_torchrun(WORKER, str(out), str(tied_model_dir), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _load(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir)


def _train_one_process(model, optimizer, batches) -> None:
    model.train()
    for batch in batches:
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def single(tied_model_dir):
    """The same 3 steps in one process, unsharded, no gradient checkpointing."""
    torch.set_num_threads(1)
    model = _load(tied_model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    _train_one_process(model, optimizer, train_batches(STEPS))
    return model, optimizer


def _greedy(model, new_tokens: int) -> list[int]:
    prompt = torch.tensor([PROMPT])
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
    return out[0].tolist()


@pytest.mark.slow
def test_sharded_training_matches_one_process(sharded_run, single, tied_model_dir):
    model, _ = single
    trained = torch.load(sharded_run / "trained.pt")
    initial = _load(tied_model_dir).state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-5)
    # and training moved the weights by far more than the tolerance
    assert max((trained[k] - v).abs().max().item() for k, v in initial.items()) > 1e-2
    checks = [json.loads((sharded_run / f"checks_rank{r}.json").read_text()) for r in (0, 1)]
    for c in checks:
        assert c["tied"], "fully_shard must keep lm_head and embed_tokens one parameter"
        assert c["local_rows"] * 2 == c["global_rows"] == c["rows_while_unsharded"]
        assert c["resharded_type"] == "DTensor"
        assert c["bf16_iter_dtypes"] == ["torch.bfloat16"]


@pytest.mark.slow
def test_bf16_mixed_precision_with_offload_keeps_float32_masters(sharded_run):
    for rank in (0, 1):
        c = json.loads((sharded_run / f"checks_rank{rank}.json").read_text())
        assert c["bf16_logits_dtype"] == "torch.bfloat16"  # computed in bf16
        assert c["bf16_master_dtype"] == c["bf16_grad_dtype"] == "torch.float32"
        assert c["bf16_step_moved"]
        # the same loss up to bf16 rounding, not bit-equal (so bf16 really was used)
        assert c["bf16_loss"] == pytest.approx(c["first_loss"], abs=0.05)
        assert c["bf16_loss"] != c["first_loss"]


@pytest.mark.slow
def test_iter_full_parameters_is_the_full_state_dict(sharded_run, single):
    model, _ = single
    trained = torch.load(sharded_run / "trained.pt")
    full = torch.load(sharded_run / "full_state.pt")["model"]
    # every name once; a tied weight's names one after the other (gathered once)
    assert sorted(trained) == sorted(model.state_dict())
    assert list(trained)[:2] == ["model.embed_tokens.weight", "lm_head.weight"]
    assert set(trained) == set(model.state_dict()) == set(full)
    for name, value in full.items():
        assert torch.equal(trained[name], value), name
    assert "lm_head.weight" in trained and torch.equal(
        trained["lm_head.weight"], trained["model.embed_tokens.weight"]
    )


@pytest.mark.slow
def test_generation_from_shards_is_the_unsharded_greedy_text(sharded_run, single):
    model, _ = single
    expected = _greedy(model, 8)
    for rank in (0, 1):
        got = json.loads((sharded_run / f"generate_rank{rank}.json").read_text())
        new = 4 + 4 * rank  # different lengths: no collective inside generate()
        assert got["unsharded"] == expected[: len(PROMPT) + new]
        assert got["copy"] == expected[: len(PROMPT) + 4]


@pytest.mark.slow
def test_two_rank_checkpoint_loads_on_one_process(sharded_run, single, tied_model_dir):
    reference, reference_optimizer = copy.deepcopy(single)  # the fixture stays at step 3
    model = _load(tied_model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    ckpt = resolve_sharded_checkpoint(sharded_run / "run")
    assert ckpt.name == f"step_{STEPS:06d}"
    assert len(list((ckpt / "state").glob("*.distcp"))) == 2  # one file per rank
    assert not list(ckpt.parent.glob(".tmp_*"))
    load_dcp(ckpt, model, optimizer)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=1e-5)
    full_optim = torch.load(sharded_run / "full_state.pt")["optim"]
    names = [n for n, _ in model.named_parameters()]
    for index, name in enumerate(names):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            loaded = optimizer.state_dict()["state"][index][key]
            assert torch.equal(loaded, full_optim["state"][name][key]), (name, key)
    # a fourth step from the loaded state equals the uninterrupted run's fourth step
    batch = train_batches(STEPS + 1)[-1]
    for m, opt in ((model, optimizer), (reference, reference_optimizer)):
        _train_one_process(m, opt, [batch])
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_export_loads_with_from_pretrained(sharded_run, single, tmp_path):
    from divrl.cli import main

    trained = torch.load(sharded_run / "trained.pt")
    out = tmp_path / "hf"
    assert main(["export", str(sharded_run / "run"), "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    exported = _load(out).eval()
    assert exported.lm_head.weight is exported.model.embed_tokens.weight
    for name, value in exported.state_dict().items():
        assert torch.equal(value, trained[name]), name
    assert _greedy(exported, 8) == _greedy(single[0], 8)


def test_save_is_atomic_and_keeps_the_previous_checkpoint(tied_model_dir, tmp_path):
    model = _load(tied_model_dir)
    checkpoints = tmp_path / "checkpoints"
    save_dcp(checkpoints / "step_000001", model)

    def killed(_tmp):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_dcp(checkpoints / "step_000002", model, extra=killed)
    assert not (checkpoints / "step_000002").exists()
    assert resolve_sharded_checkpoint(tmp_path).name == "step_000001"
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    load_dcp(checkpoints / "step_000001", model)
    assert torch.equal(model.model.norm.weight, _load(tied_model_dir).model.norm.weight)


def test_export_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a sharded checkpoint"):
        export_hf(tmp_path, tmp_path / "out")


def test_config_validation_says_what_to_change():
    assert FSDPConfig().strategy == "ddp"
    with pytest.raises(ValueError, match="choose one of"):
        FSDPConfig(strategy="zero3")
    with pytest.raises(ValueError, match=r"set train\.strategy=fsdp"):
        FSDPConfig(fsdp_offload=True)
    with pytest.raises(ValueError, match="param_dtype"):
        FSDPConfig(strategy="fsdp", param_dtype="int8")


def test_decoder_layers_and_names(tied_model_dir):
    model = _load(tied_model_dir)
    assert decoder_layers(model) == list(model.model.layers)
    assert strip_wrapper_prefixes("_orig_mod.model.layers.0._checkpoint_wrapped_module.mlp") == (
        "model.layers.0.mlp"
    )
