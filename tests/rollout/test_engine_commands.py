"""Every command on every engine, through the command line.

An engine defined in this file (no library file changes) is registered and used by
``divrl train``, ``divrl presample`` and ``divrl eval``; divrl's vllm engine runs the same
three commands on the CPU over the stand-in for vLLM's public API (``fake_vllm``), its
weight sync included.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import fake_vllm
import pytest
import torch

from divrl.cli import main
from divrl.rollout import RolloutEngine, RolloutOutput, register_engine, unregister_engine
from divrl.training.config import load_config
from divrl.training.trainer import Trainer

_spec = importlib.util.spec_from_file_location(
    "_engine_train_helpers", Path(__file__).parents[1] / "training" / "train_helpers.py"
)
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)

CALLS: list[tuple[str, int, int]] = []


@dataclass(frozen=True)
class NaiveOptions:
    tag: str = "naive"

    def __post_init__(self) -> None:
        if not self.tag:
            raise ValueError("tag must not be empty")


class NaiveEngine(RolloutEngine):
    """Token by token, a full forward per token (no KV cache), its own sampler."""

    def __init__(self, model, tokenizer, tag: str) -> None:
        self.model, self.tokenizer, self.tag = model, tokenizer, tag

    @torch.no_grad()
    def generate(self, prompt_ids, params, seeds=None) -> RolloutOutput:
        CALLS.append((self.tag, len(prompt_ids), params.n))
        was_training = self.model.training
        self.model.eval()
        out = RolloutOutput()
        for i, prompt in enumerate(prompt_ids):
            gen = torch.Generator().manual_seed(seeds[i] if seeds else len(CALLS))
            for _ in range(params.n):
                ids, lps = self._sample(list(prompt), params, gen)
                out.prompt_index.append(i)
                out.prompt_ids.append(list(prompt))
                out.response_ids.append(ids)
                out.log_probs.append(lps)
                out.texts.append(self.tokenizer.decode(ids, skip_special_tokens=True))
                out.truncated.append(ids[-1] != self.tokenizer.eos_token_id)
        self.model.train(was_training)
        return out

    def _sample(self, prompt, params, gen):
        ids, lps = [], []
        for _ in range(params.max_new_tokens):
            logits = self.model(torch.tensor([prompt + ids])).logits[0, -1].float()
            logp = torch.log_softmax(logits / (params.temperature or 1.0), -1)
            if params.temperature == 0:
                token = int(logits.argmax())
            else:
                token = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(token)
            lps.append(float(logp[token]))
            if token == self.tokenizer.eos_token_id:
                break
        return ids, lps


@pytest.fixture
def naive_engine():
    @register_engine("naive", options=NaiveOptions, summary="the test's own engine")
    def build(context, options):
        return NaiveEngine(context.model, context.tokenizer, options.tag)

    CALLS.clear()
    yield
    unregister_engine("naive")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine_world")
    return {
        "model": str(helpers.build_tiny_lm(root / "model")),
        "data": str(helpers.write_prompts(root / "train.jsonl", n=8)),
    }


def _train_args(world, out: Path, engine: str, *options: str) -> list[str]:
    return [
        *helpers.tiny_overrides(world, out, **{"train.total_steps": 2}),
        f"rollout.engine={engine}",
        *options,
    ]


def _presample_args(world, out: Path, engine: str, *options: str) -> list[str]:
    return [
        *_train_args(world, out, engine, *options),
        f"reference.store={out / 'store'}",
        "reference.k=2",
    ]


def _eval_args(world, out: Path, engine: str, *extra: str) -> list[str]:
    return [
        *("eval", "--model", world["model"], "--data", f"set={world['data']}"),
        *("--out", str(out), "--n", "3", "--limit", "3", "--max-new-tokens", "5"),
        *("--n-boot", "10", "--no-progress", "--engine", engine, *extra),
    ]


@pytest.mark.slow
def test_an_engine_defined_in_a_test_runs_train_presample_and_eval(naive_engine, world, tmp_path):
    run = tmp_path / "run"
    assert main(["train", *_train_args(world, run, "naive", "rollout.engine_options.tag=t")]) == 0
    assert [c[0] for c in CALLS] == ["t", "t"]  # one rollout batch per step
    saved = (run / "config.yaml").read_text()
    assert "engine: naive" in saved and "tag: t" in saved

    pre = tmp_path / "pre"
    args = _presample_args(world, pre, "naive", "rollout.engine_options.tag=p")
    assert main(["presample", *args]) == 0
    assert json.loads((pre / "store" / "manifest.json").read_text())["stats"]["prompts"] == 8
    assert {c[0] for c in CALLS[2:]} == {"p"}

    out = tmp_path / "eval"
    assert main(_eval_args(world, out, "naive", "--engine-option", "tag=e")) == 0
    summary = json.loads((out / "set" / "summary.json").read_text())
    assert summary["n_prompts"] == 3
    meta = json.loads((out / "set" / "eval_config.json").read_text())
    assert meta["config"]["engine"] == "naive" and meta["config"]["engine_options"] == {"tag": "e"}
    assert ("e", 3, 3) in CALLS and ("e", 3, 1) in CALLS  # sampled, then greedy


def test_an_option_the_engine_does_not_take_is_a_one_line_error(naive_engine, world, tmp_path):
    assert main([*_eval_args(world, tmp_path, "naive", "--engine-option", "bogus=1")]) == 2
    assert (
        main(["train", *_train_args(world, tmp_path, "naive", "rollout.engine_options.x=1")]) == 2
    )
    assert main([*_eval_args(world, tmp_path, "naive", "--engine-option", "tag=")]) == 2
    assert main([*_eval_args(world, tmp_path, "nope")]) == 2


def test_option_errors_name_the_valid_ones(naive_engine, world, tmp_path, capsys):
    main([*_eval_args(world, tmp_path, "naive", "--engine-option", "bogus=1")])
    assert "rollout engine 'naive' takes no option 'bogus'; its options: tag" in (
        capsys.readouterr().err
    )
    main([*_eval_args(world, tmp_path, "nave")])
    assert "unknown rollout engine 'nave' (did you mean 'naive'?)" in capsys.readouterr().err


@pytest.mark.slow
def test_vllm_engine_runs_train_presample_and_eval(world, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    fake_vllm.install(monkeypatch)
    fake_vllm.INSTANCES.clear()
    # train through the Python API, with a reward the random model can earn (so it moves)
    args = _train_args(world, tmp_path / "run", "vllm", "rollout.engine_options.enforce_eager=true")
    trainer = Trainer(load_config(None, args), reward_fn=helpers.sevens_reward)
    trainer.train()
    (llm,) = fake_vllm.INSTANCES
    assert llm.init_kwargs["enforce_eager"] is True and llm.init_kwargs["dtype"] == "float32"
    assert llm.requests == 2 * 4  # two steps of 4 prompts, sampled by vLLM
    # after the last step vLLM serves the trained weights, not the initial ones
    served = dict(llm.hf_model.named_parameters())
    trained = dict(trainer.policy.named_parameters())
    assert all(torch.equal(served[n], p.detach()) for n, p in trained.items())
    initial = load_file(Path(world["model"]) / "model.safetensors")
    assert any(not torch.equal(initial[n], p.detach()) for n, p in trained.items())

    pre = tmp_path / "pre"
    assert main(["presample", *_presample_args(world, pre, "vllm")]) == 0
    assert (pre / "store" / "manifest.json").is_file()

    # eval: the same summary as the hf engine's where both decode greedily
    summaries = {}
    for engine in ("hf", "vllm"):
        if engine == "vllm":  # vLLM loads its own copy: no transformers model is loaded
            monkeypatch.setattr(
                "divrl.evaluation.model_loading.load_model",
                lambda *a, **k: pytest.fail("eval loaded a transformers model for vllm"),
            )
        out = tmp_path / f"eval_{engine}"
        assert main([*_eval_args(world, out, engine), "--temperature", "0.001"]) == 0
        summaries[engine] = json.loads((out / "set" / "summary.json").read_text())
        summaries[engine].pop("timings")
        summaries[engine]["provenance"] = summaries[engine]["provenance"]["data"]  # same prompts
    assert summaries["hf"] == summaries["vllm"]
    assert fake_vllm.INSTANCES[-1].requests == 6  # 3 sampled prompts (one seed each), 3 greedy
