"""The engine contract (``divrl.rollout.base.RolloutEngine``): every engine of the library
declares ``batched_seeds`` and ``context_length``, ``build_engine`` refuses an engine that
lacks part of the contract, and ``divrl eval``'s sampling acts on both attributes."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from divrl.data import fixture_path, load_examples, render_prompt
from divrl.data.sampling import derive_seed
from divrl.evaluation.runner import EvalConfig, generate_samples
from divrl.rollout import (
    EngineContext,
    EngineError,
    RolloutEngine,
    RolloutOutput,
    build_engine,
    register_engine,
    unregister_engine,
)
from divrl.rollout.base import ENGINE_ATTRIBUTES


def _library_engines() -> list[type]:
    """Every RolloutEngine subclass defined in divrl's own modules (found, not listed)."""
    found, todo = [], [RolloutEngine]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("divrl."):
                found.append(sub)
    return found


def _declared_by(cls: type, attr: str) -> type:
    return next(c for c in cls.__mro__ if attr in vars(c))


def test_each_library_engine_declares_the_contract_attributes():
    engines = _library_engines()
    # the built-in engines are among those found (a floor, not the list)
    modules = {cls.__module__ for cls in engines}
    assert {"divrl.rollout.hf", "divrl.rollout.static", "divrl.rollout.vllm"} <= modules
    for cls in engines:
        for attr in ("batched_seeds", "context_length"):
            # declared by the engine (or the library engine it extends), not left to the
            # base's default: each built-in engine says what it does
            assert _declared_by(cls, attr) is not RolloutEngine, (cls, attr)
        assert all(hasattr(cls, attr) for attr in ENGINE_ATTRIBUTES)


def test_build_engine_refuses_an_engine_without_the_contract():
    class Duck:
        def generate(self, prompt_ids, params, seeds=None): ...

    register_engine("duck")(lambda context, options: Duck())
    try:
        with pytest.raises(
            EngineError,
            match=r"'duck' built Duck, which lacks sync_weights, batched_seeds, "
            r"context_length",
        ):
            build_engine("duck", EngineContext(model_path="m"))
    finally:
        unregister_engine("duck")


class Recorder(RolloutEngine):
    """Answers every prompt with responses that fill ``context_length`` exactly, cut
    there (truncated), and records the seeds it was given."""

    def __init__(self, batched_seeds: bool, context_length: int | None, fill: int) -> None:
        self.batched_seeds = batched_seeds
        self._context_length = context_length
        self.fill = fill
        self.seeds: list = []

    @property
    def context_length(self) -> int | None:
        return self._context_length

    def generate(self, prompt_ids, params, seeds=None):
        self.seeds.append(None if seeds is None else list(seeds))
        out = RolloutOutput()
        for i, ids in enumerate(prompt_ids):
            for _ in range(params.n):
                response = [1] * (self.fill - len(ids))
                out.prompt_index.append(i)
                out.prompt_ids.append(list(ids))
                out.response_ids.append(response)
                out.log_probs.append([-0.5] * len(response))
                out.texts.append("x")
                out.truncated.append(True)
        return out


@pytest.mark.parametrize("batched_seeds", [True, False])
def test_eval_sampling_reads_the_engine_attributes(tiny_lm, batched_seeds):
    _, tok = tiny_lm
    examples = load_examples(fixture_path("math.jsonl"), limit=3)
    longest = max(
        len(tok(render_prompt(ex, tokenizer=tok), add_special_tokens=False)["input_ids"])
        for ex in examples
    )
    fill = longest + 5
    # the model's own context is far away: only the engine's puts the samples at it
    model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=10_000))
    cfg = EvalConfig(n=2, batch_size=2, greedy=False, seed=7)

    engine = Recorder(batched_seeds, context_length=fill, fill=fill)
    records = generate_samples(model, tok, examples, cfg, engine=engine, progress=False)
    if batched_seeds:  # one seed per prompt, from its index: batching does not matter
        assert engine.seeds == [[derive_seed(7, 0), derive_seed(7, 1)], [derive_seed(7, 2)]]
    else:
        assert engine.seeds == [None, None]
    assert all(s["at_context"] for rec in records for s in rec["samples"])

    # no context from the engine: the model's is used, and nothing reached it
    engine = Recorder(batched_seeds, context_length=None, fill=fill)
    records = generate_samples(model, tok, examples, cfg, engine=engine, progress=False)
    assert not any(s["at_context"] for rec in records for s in rec["samples"])


def test_the_contract_is_documented_where_engines_are_added():
    page = (Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text()
    how_to = page.split("### How to add an engine", 1)[1].split("\n## ", 1)[0]
    for attr in ("batched_seeds", "context_length"):
        assert attr in how_to, f"docs/scaling.md's 'How to add an engine' does not name {attr}"
