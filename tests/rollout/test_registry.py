"""The rollout-engine registry: names, typed options, errors, entry points, old config keys."""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from divrl.rollout import (
    EngineContext,
    EngineError,
    RolloutEngine,
    build_engine,
    engine_names,
    engine_options,
    get_engine,
    register_engine,
    unregister_engine,
)
from divrl.rollout.registry import ENTRY_POINT_GROUP
from divrl.training.config import ConfigError, load_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"


@dataclass(frozen=True)
class _Options:
    size: int = 2
    ratio: float = 0.5
    mode: str | None = None


class _Probe(RolloutEngine):
    """An engine that only keeps what it was built with."""

    def __init__(self, *built):
        self.built = built

    def generate(self, prompt_ids, params, seeds=None):
        raise AssertionError("a probe does not sample")


@pytest.fixture
def probe():
    @register_engine("probe", options=_Options, summary="test", uses_model=False)
    def build(context, options):
        return _Probe("built", context.model_path, options)

    yield
    unregister_engine("probe")


def test_built_ins_are_registered_and_documented():
    assert {"hf", "static", "vllm"} <= set(engine_names())
    table = DOCS.read_text()
    library = [n for n in engine_names() if get_engine(n).factory.__module__.startswith("divrl.")]
    assert {"hf", "static", "vllm"} <= set(library)  # (tests register engines of their own)
    for name in library:
        assert f"| `{name}` " in table, f"docs/scaling.md's engine table lacks {name}"
    assert get_engine("vllm").uses_model is False and get_engine("hf").uses_model is True


def test_options_are_typed_and_checked(probe):
    assert engine_options("probe", {"size": 3, "ratio": 1}) == _Options(3, 1.0)
    assert engine_options("probe", None) == _Options()
    assert engine_options("probe", _Options(5)) == _Options(5)
    with pytest.raises(EngineError, match=r"takes no option 'sise'; its options: size, ratio"):
        engine_options("probe", {"sise": 3})
    with pytest.raises(EngineError, match="option size='3' must be int"):
        engine_options("probe", {"size": "3"})
    with pytest.raises(EngineError, match="option size=True must be int"):
        engine_options("probe", {"size": True})
    built = build_engine("probe", EngineContext(model_path="m"), {"mode": "x"}).built
    assert built[2].mode == "x"


def test_a_taken_name_is_refused_unless_replaced(probe):
    with pytest.raises(EngineError, match="'probe' is already registered"):
        register_engine("probe")(lambda c, o: None)
    register_engine("probe", options=_Options, replace=True)(lambda c, o: _Probe("new"))
    assert build_engine("probe", EngineContext(model_path="m")).built == ("new",)
    with pytest.raises(EngineError, match="options must be a dataclass"):
        register_engine("other", options=dict)


def test_an_unknown_engine_names_the_registered_ones():
    with pytest.raises(EngineError, match=r"unknown rollout engine 'vlm' \(did you mean 'vllm'"):
        get_engine("vlm")


def test_an_engine_of_another_package_loads_through_its_entry_point(monkeypatch, tmp_path):
    """``rollout.engine=third``: the package's module is imported when the name is first
    asked for, and registers itself."""
    (tmp_path / "third_party_engine.py").write_text(
        "from divrl.rollout import RolloutEngine, register_engine\n"
        "from dataclasses import dataclass\n"
        "@dataclass(frozen=True)\n"
        "class Options:\n"
        "    level: int = 1\n"
        "class Third(RolloutEngine):\n"
        "    def __init__(self, level):\n"
        "        self.built = ('third', level)\n"
        "    def generate(self, prompt_ids, params, seeds=None): ...\n"
        "register_engine('third', options=Options)(lambda c, o: Third(o.level))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    point = types.SimpleNamespace(name="third", value="third_party_engine")
    monkeypatch.setattr(
        "importlib.metadata.entry_points",
        lambda group: [point] if group == ENTRY_POINT_GROUP else [],
    )
    try:
        assert "third" not in engine_names()
        cfg = load_config(None, ["rollout.engine=third", "rollout.engine_options.level=3"])
        engine = build_engine("third", EngineContext(model_path="m"), cfg.rollout.engine_options)
        assert engine.built == ("third", 3)
    finally:
        unregister_engine("third")
        sys.modules.pop("third_party_engine", None)


def test_old_flat_keys_are_read_as_engine_options(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = load_config(None, ["rollout.batch_size=8", "rollout.gpu_memory_utilization=0.5"])
    assert cfg.rollout.engine_options == {"batch_size": 8}
    assert "rollout.batch_size is now rollout.engine_options.batch_size" in caplog.text
    assert "rollout.engine=auto never read it: ignored" in caplog.text
    cfg = load_config(None, ["rollout.engine=vllm", "rollout.gpu_memory_utilization=0.5"])
    assert cfg.rollout.options.gpu_memory_utilization == 0.5
    with pytest.raises(ConfigError, match=r"disagree: rollout\.batch_size is the old name"):
        load_config(None, ["rollout.batch_size=8", "rollout.engine_options.batch_size=4"])


@dataclass(frozen=True)
class _Batched:
    batch_size: int = 4


def test_an_old_key_goes_to_any_registered_engine_that_takes_it(caplog):
    """The engines an old flat key belongs to are read from the registry, so a new engine
    with a ``batch_size`` option takes ``rollout.batch_size`` like ``hf`` does."""
    register_engine("batched", options=_Batched, summary="test")(lambda context, options: None)
    try:
        cfg = load_config(None, ["rollout.engine=batched", "rollout.batch_size=8"])
        assert cfg.rollout.engine_options == {"batch_size": 8}
        with caplog.at_level(logging.WARNING):
            load_config(None, ["rollout.engine=batched", "rollout.gpu_memory_utilization=0.5"])
        assert "option of the vllm engine; rollout.engine=batched never read it" in caplog.text
    finally:
        unregister_engine("batched")
    with caplog.at_level(logging.WARNING):
        load_config(None, ["rollout.engine=vllm", "rollout.batch_size=8"])
    assert "option of the auto/batched/hf/static engine" not in caplog.text
    assert "option of the auto/hf/static engine; rollout.engine=vllm" in caplog.text


def test_the_policy_engines_register_through_one_helper():
    from divrl.rollout.hf import HFEngine
    from divrl.rollout.static import StaticCacheEngine

    for name, cls in (("hf", HFEngine), ("static", StaticCacheEngine)):
        spec = get_engine(name)
        assert spec.factory.__name__ == f"build_{name}"
        with pytest.raises(ValueError, match=f"the {name} engine generates with the policy"):
            spec.factory(EngineContext("m"), spec.options())
        assert cls.__module__ == spec.factory.__module__


def test_config_errors_name_the_key_and_the_valid_options():
    with pytest.raises(ConfigError, match="takes no option 'gpu_memory_utilization'; its options"):
        load_config(None, ["rollout.engine_options.gpu_memory_utilization=0.5"])
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization=1\.5 must be in \(0, 1\)"):
        load_config(
            None, ["rollout.engine=vllm", "rollout.engine_options.gpu_memory_utilization=1.5"]
        )
    # every option is written out with its value (config.yaml shows what ran)
    cfg = load_config(None, ["rollout.engine=vllm"])
    assert cfg.rollout.engine_options["enforce_eager"] is False


@pytest.mark.parametrize("name", ["hf", "static"])
def test_an_engine_on_the_policy_refuses_a_context_without_it(name):
    with pytest.raises(ValueError, match=f"the {name} engine generates with the policy loaded"):
        build_engine(name, EngineContext(model_path="m"))


def test_the_engine_help_texts_list_the_registry():
    """``rollout.engine`` and ``divrl eval --engine`` name every registered engine with its
    summary, read from the registry (no list of names kept by hand)."""
    import argparse

    from divrl.commands.eval import add_arguments
    from divrl.training.config import RolloutConfig

    config_help = RolloutConfig.__dataclass_fields__["engine"].metadata["help"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    eval_help = next(a.help for a in parser._actions if "--engine" in a.option_strings)
    for name in engine_names():
        summary = get_engine(name).summary
        assert f"{name!r} ({summary})" in config_help and f"{name!r} ({summary})" in eval_help
