"""Rollout engines behind one interface: prompt token ids in; responses, log-probs, texts out.

Engines are registered by name (:mod:`divrl.rollout.registry`) and built with
:func:`build_engine` by every command. ``auto``, the default, is ``static`` (divrl's
decode loop) for a Llama/Qwen2 policy on a CPU and ``hf`` (transformers ``generate``)
otherwise; ``vllm`` is optional and imports vLLM only when built. A built-in engine is one
module that registers itself and one import line below.
"""

from divrl.rollout import static as _static  # noqa: F401 - registers "static"
from divrl.rollout import vllm as _vllm  # noqa: F401 - registers "vllm"
from divrl.rollout.base import (
    RolloutEngine,
    RolloutOutput,
    SamplingParams,
    collate,
    pad_token_id,
)
from divrl.rollout.hf import HFEngine
from divrl.rollout.registry import (
    EngineContext,
    EngineError,
    build_engine,
    check_engine_installed,
    check_engine_model,
    engine_names,
    engine_options,
    engine_summaries,
    get_engine,
    register_engine,
    unregister_engine,
)

__all__ = [
    "EngineContext",
    "EngineError",
    "HFEngine",
    "RolloutEngine",
    "RolloutOutput",
    "SamplingParams",
    "build_engine",
    "check_engine_installed",
    "check_engine_model",
    "collate",
    "engine_names",
    "engine_options",
    "engine_summaries",
    "get_engine",
    "pad_token_id",
    "register_engine",
    "unregister_engine",
]
