"""What an engine cannot run is refused with one line that says what to do, before any
work starts where the input allows it: an entry-point engine that does not import, vLLM
not installed, an option value that is not YAML, a model the static engine does not
support, a tokenizer without EOS, a prompt that fills the model's context, an empty
prompt; and what it can run, it runs: greedy with n > 1 on every engine, a huge
max_new_tokens on the static engine (capped by the context, no gigabyte buffers)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from divrl.cli import main
from divrl.rollout import EngineContext, EngineError, SamplingParams, build_engine, get_engine
from divrl.rollout.base import pad_token_id
from divrl.rollout.hf import HFEngine

_spec = importlib.util.spec_from_file_location(
    "_engine_fault_helpers", Path(__file__).parents[1] / "training" / "train_helpers.py"
)
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)


def _engine(name: str, tiny_lm):
    model, tokenizer = tiny_lm
    return build_engine(name, EngineContext(model_path="tiny", model=model, tokenizer=tokenizer))


def _installed_entry_points(root: Path, entries: dict[str, str], modules: dict[str, str]) -> Path:
    """A folder for sys.path with one distribution declaring ``entries`` in divrl's group."""
    dist = root / "fake_divrl_engines-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fake-divrl-engines\nVersion: 0.1\n"
    )
    lines = "".join(f"{name} = {module}\n" for name, module in entries.items())
    (dist / "entry_points.txt").write_text(f"[divrl.rollout_engines]\n{lines}")
    for module, code in modules.items():
        (root / f"{module}.py").write_text(code)
    return root


def test_an_entry_point_engine_that_does_not_import_is_one_line(tmp_path, monkeypatch, capsys):
    """A module that raises on import, or one that is not there, was a traceback, also under
    --print-config."""
    site = _installed_entry_points(
        tmp_path / "site",
        {"broken": "divrl_test_broken_engine", "absent": "divrl_test_absent_engine"},
        {"divrl_test_broken_engine": "raise RuntimeError('no GPU driver here')\n"},
    )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    with pytest.raises(EngineError, match=r"its module 'divrl_test_broken_engine' .*fake-divrl-"
                       r"engines.* failed to import: RuntimeError: no GPU driver here"):  # fmt: skip
        get_engine("broken")
    with pytest.raises(EngineError, match=r"'divrl_test_absent_engine'.* ModuleNotFoundError"):
        get_engine("absent")
    for name in ("broken", "absent"):
        assert main(["train", f"rollout.engine={name}", "--print-config"]) == 2
        err = capsys.readouterr().err
        assert f"rollout engine {name!r}: its module" in err and "Traceback" not in err


def test_vllm_not_installed_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    missing = tmp_path / "no_model"  # never looked at: the engine is refused first
    data = helpers.write_prompts(tmp_path / "d.jsonl", 2)
    eval_args = ["eval", "--model", str(missing), "--data", str(data), "--out", str(tmp_path / "o")]
    assert main([*eval_args, "--engine", "vllm"]) == 2
    train = ["train", f"model.path={missing}", f"data.train_path={data}", "rollout.engine=vllm"]
    assert main(train) == 2
    for line in capsys.readouterr().err.strip().splitlines():
        assert "rollout engine 'vllm' needs the module 'vllm', which is not installed" in line


def test_an_engine_option_that_is_not_yaml_is_refused_before_the_model_loads(tmp_path, capsys):
    data = helpers.write_prompts(tmp_path / "d.jsonl", 2)
    args = ["eval", "--model", str(tmp_path / "no_model"), "--data", str(data)]
    assert main([*args, "--out", str(tmp_path / "o"), "--engine-option", "batch_size=[1"]) == 2
    err = capsys.readouterr().err
    assert "--engine-option 'batch_size=[1': the value is not YAML" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("engine", ["hf", "static"])
def test_an_empty_prompt_is_refused_by_its_index(tiny_lm, engine):
    """A reshape error alone, or sampling from a pad token beside other prompts."""
    e = _engine(engine, tiny_lm)
    with pytest.raises(ValueError, match="generate: prompt 0 has no token ids"):
        e.generate([[]], SamplingParams(max_new_tokens=3))
    with pytest.raises(ValueError, match="generate: prompt 1 has no token ids"):
        e.generate([[5, 6], []], SamplingParams(n=2, max_new_tokens=3))


@pytest.mark.parametrize("engine", ["hf", "static"])
def test_greedy_with_several_samples_gives_n_copies_of_the_greedy_response(tiny_lm, engine):
    """transformers refused num_return_sequences > 1 without sampling (the hf engine raised)."""
    e = _engine(engine, tiny_lm)
    prompts = [[5, 6, 7], [8]]
    one = e.generate(prompts, SamplingParams(n=1, temperature=0, max_new_tokens=5))
    three = e.generate(prompts, SamplingParams(n=3, temperature=0, max_new_tokens=5))
    assert three.prompt_index == [0, 0, 0, 1, 1, 1]
    assert three.response_ids == [r for r in one.response_ids for _ in range(3)]
    assert three.log_probs == [lp for lp in one.log_probs for _ in range(3)]


def test_static_engine_buffers_are_capped_by_the_context(tiny_lm, monkeypatch):
    """--max-new-tokens 1000000000 allocated [rows, 1e9] random numbers before decoding."""
    e = _engine("static", tiny_lm)
    context = tiny_lm[0].config.max_position_embeddings
    real_rand = torch.rand

    def rand(*size, **kwargs):
        shape = size[0] if len(size) == 1 and isinstance(size[0], tuple | list) else size
        if math.prod(shape) > 100 * context:
            raise MemoryError(f"a buffer of {tuple(shape)} numbers")
        return real_rand(*size, **kwargs)

    monkeypatch.setattr(torch, "rand", rand)
    params = SamplingParams(n=2, max_new_tokens=10**9)
    for seeds in (None, [3]):
        out = e.generate([[5, 6, 7]], params, seeds=seeds)
        assert len(out) == 2 and all(3 + len(r) <= context for r in out.response_ids)


def test_a_tokenizer_without_eos_is_an_engine_error_saying_what_to_set(tiny_lm):
    model, _ = tiny_lm
    tokenizer = types.SimpleNamespace(eos_token_id=None, pad_token_id=0)
    with pytest.raises(EngineError, match=r"no end-of-sequence token .* set eos_token"):
        HFEngine(model, tokenizer)
    with pytest.raises(EngineError, match="neither a pad token nor an eos token"):
        pad_token_id(types.SimpleNamespace(eos_token_id=None, pad_token_id=None))


def _gpt2_model(root: Path) -> Path:
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    llama = helpers.build_tiny_lm(root / "llama")
    tokenizer = AutoTokenizer.from_pretrained(llama)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2, n_positions=64,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(root / "gpt2")
    tokenizer.save_pretrained(root / "gpt2")
    return root / "gpt2"


@pytest.mark.parametrize("weights", [True, False], ids=["loadable", "config-only"])
def test_train_on_a_model_the_static_engine_cannot_run_is_one_line(tmp_path, capsys, weights):
    """divrl eval said it in one line; divrl train ended in a traceback. The refusal comes
    from the model's config.json before its weights load: a folder without weights is
    refused with the same line (a load would have failed on the missing weights)."""
    model = _gpt2_model(tmp_path)
    if not weights:
        for f in model.glob("*.safetensors"):
            f.unlink()
    world = {"model": str(model), "data": str(helpers.write_prompts(tmp_path / "d.jsonl"))}
    args = helpers.tiny_overrides(world, tmp_path / "run", **{"rollout.engine": "static"})
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("divrl train: the static rollout engine cannot run this model")
    assert "model_type 'gpt2'" in last and "rollout.engine=hf" in last and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_the_static_engines_model_check_reads_the_config_alone(tmp_path):
    from divrl.rollout import check_engine_model

    model = _gpt2_model(tmp_path)
    with pytest.raises(EngineError, match="model_type 'gpt2' is not one of"):
        check_engine_model("static", str(model))
    check_engine_model("hf", str(model))  # hf runs any causal LM: nothing to refuse
    check_engine_model("static", str(helpers.build_tiny_lm(tmp_path / "llama")))
    check_engine_model("static", None)  # a toy model: checked once loaded
    check_engine_model("static", str(tmp_path / "not-a-folder"))  # the load reports it


def test_a_prompt_that_fills_the_context_is_refused_when_the_prompts_load(tmp_path, capsys):
    """data.max_prompt_length above the model's context let a 70-token prompt through to
    a traceback at step 1, after the run folder had been written."""
    model = helpers.build_tiny_lm(tmp_path / "model")  # context 64, one token per character
    rows = [{"data_source": "math", "prompt": "Q:" + "1+" * 34 + "1=", "extra_info": {"index": "long"},
             "reward_model": {"ground_truth": "35"}}]  # fmt: skip
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    world = {"model": str(model), "data": str(data)}
    run = tmp_path / "run"
    args = helpers.tiny_overrides(
        world, run, **{"data.max_prompt_length": 100, "train.prompts_per_step": 1}
    )
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert "leave no room for a response in the model's context of 64 tokens" in err
    assert "set data.max_prompt_length below 64" in err and "Traceback" not in err
    assert not (run / "metrics.jsonl").exists() and not (run / "config.yaml").exists()
