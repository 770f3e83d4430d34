"""Rollout engines by name: one registry for ``divrl train``, ``presample``, ``eval`` and
the Python API.

An engine is a factory ``(EngineContext, options) -> RolloutEngine`` registered under a
name with a dataclass of its own options::

    @dataclass(frozen=True)
    class MyOptions:
        batch_size: int = 8

    @register_engine("mine", options=MyOptions, summary="...")
    def build_mine(context: EngineContext, options: MyOptions) -> RolloutEngine: ...

Options arrive as a mapping (``rollout.engine_options`` in a config,
``--engine-option KEY=VALUE`` on the command line); :func:`engine_options` checks the
keys against the dataclass fields (an unknown key names the valid ones), the value types
against the annotations, and then the dataclass's ``__post_init__`` checks the values.
Every caller builds through :func:`build_engine`, so a registered engine works in every
command. Engines of other packages register through the ``divrl.rollout_engines`` entry
point group (``name = "package.module"``: the module is imported when the name is asked
for and registers itself).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import types
import typing
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from divrl.rollout.base import EngineError, RolloutEngine, check_engine

__all__ = [
    "ENTRY_POINT_GROUP",
    "EngineContext",
    "EngineError",
    "EngineSpec",
    "NoOptions",
    "build_engine",
    "check_engine_installed",
    "check_engine_model",
    "engine_names",
    "engine_options",
    "engine_summaries",
    "engines_taking",
    "get_engine",
    "register_engine",
    "register_policy_engine",
    "unregister_engine",
]

ENTRY_POINT_GROUP = "divrl.rollout_engines"


@dataclass(frozen=True)
class NoOptions:
    """The options of an engine that takes none."""


@dataclass(frozen=True)
class EngineContext:
    """What a command knows when it builds an engine; each engine takes what it needs.

    Args:
        model_path: the policy's directory or hub name (engines that load their own copy).
        model: the policy in this process (engines that generate with it, like ``hf``);
            None where a command has not loaded one.
        tokenizer: the policy's tokenizer.
        dtype: the compute dtype name (``"bfloat16"``...): under FSDP the mixed-precision
            dtype, else the model's.
        seed: base seed (engines add the process rank themselves where it matters).
        max_model_len: prompt + response tokens the engine must hold (None: the model's).
        trust_remote_code: passed on to engines that load the model.
        full_weights: for a sharded (FSDP) ``model``, a factory of the context manager
            that makes its full parameters live while generating.
    """

    model_path: str
    model: torch.nn.Module | None = None
    tokenizer: Any = None
    dtype: str = "float32"
    seed: int = 0
    max_model_len: int | None = None
    trust_remote_code: bool = False
    full_weights: Callable[[], AbstractContextManager] | None = None

    def require_policy(self, engine: str) -> None:
        """Refuse a context without the in-process policy that ``engine`` generates with."""
        if self.model is None or self.tokenizer is None:
            raise ValueError(
                f"the {engine} engine generates with the policy loaded in this process: "
                "build it with EngineContext(model=..., tokenizer=...)"
            )


Factory = Callable[[EngineContext, Any], RolloutEngine]


@dataclass(frozen=True)
class EngineSpec:
    """A registered engine: its factory, its options dataclass and a one-line summary.

    ``uses_model``: the engine generates with the policy in this process (``hf``); False
    when it loads its own copy from ``model_path`` (``vllm``), so a command that only
    generates need not load the model into the trainer's framework.
    ``requires``: ``(module, how to install it)`` pairs the engine imports when built
    (``vllm``); :func:`check_engine_installed` names a missing one before any work starts.
    ``model_check``: from a model's transformers config, why the engine cannot run it (None
    when it can); :func:`check_engine_model` asks it before the weights load.
    """

    name: str
    factory: Factory
    options: type
    summary: str = ""
    uses_model: bool = True
    requires: tuple[tuple[str, str], ...] = ()
    model_check: Callable[[Any], str | None] | None = None


_ENGINES: dict[str, EngineSpec] = {}


def register_engine(
    name: str,
    *,
    options: type = NoOptions,
    summary: str = "",
    uses_model: bool = True,
    requires: tuple[tuple[str, str], ...] = (),
    model_check: Callable[[Any], str | None] | None = None,
    replace: bool = False,
) -> Callable[[Factory], Factory]:
    """Decorator: register ``factory`` as the engine ``name`` (see the module docstring).

    Raises:
        EngineError: ``name`` is taken (``replace=True`` takes it over on purpose), or
            ``options`` is not a dataclass.
    """
    if not dataclasses.is_dataclass(options):
        raise EngineError(f"engine {name!r}: options must be a dataclass, got {options!r}")

    def decorator(factory: Factory) -> Factory:
        if name in _ENGINES and not replace:
            raise EngineError(
                f"a rollout engine named {name!r} is already registered "
                f"({_ENGINES[name].factory.__module__}); pick another name or pass replace=True"
            )
        _ENGINES[name] = EngineSpec(
            name, factory, options, summary, uses_model, requires, model_check
        )
        return factory

    return decorator


def register_policy_engine(
    name: str,
    engine: type,
    *,
    options: type,
    summary: str,
    model_check: Callable[[Any], str | None] | None = None,
    replace: bool = False,
) -> Factory:
    """Register ``engine``, a class that generates with the policy loaded in this process,
    as the engine ``name``; the factory (returned) refuses a context without the policy and
    builds ``engine(model, tokenizer, full_weights=..., **options fields)``."""

    def factory(context: EngineContext, opts: Any) -> RolloutEngine:
        context.require_policy(name)
        kwargs = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
        return engine(context.model, context.tokenizer, full_weights=context.full_weights, **kwargs)

    factory.__name__ = factory.__qualname__ = f"build_{name}"
    factory.__module__ = engine.__module__
    return register_engine(
        name, options=options, summary=summary, model_check=model_check, replace=replace
    )(factory)


def engines_taking(option: str) -> tuple[str, ...]:
    """The registered engines whose options have a field ``option``, sorted."""
    return tuple(
        name
        for name, spec in sorted(_ENGINES.items())
        if option in {f.name for f in dataclasses.fields(spec.options)}
    )


def unregister_engine(name: str) -> None:
    """Remove ``name`` (a test's engine, after the test); unknown names are ignored."""
    _ENGINES.pop(name, None)


def engine_summaries() -> str:
    """``'name' (summary); ...`` of every registered engine, for help texts."""
    return "; ".join(f"{name!r} ({_ENGINES[name].summary})" for name in engine_names())


def engine_names() -> tuple[str, ...]:
    """The registered engine names, sorted (entry-point engines once they were asked for)."""
    return tuple(sorted(_ENGINES))


def _load_entry_point(name: str) -> None:
    """Import the module that the entry point ``name`` names (it registers the engine).

    Raises:
        EngineError: the module is missing or raises while it is imported (one line naming
            the entry point, its module and the error, not the module's traceback).
    """
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            module = ep.value.partition(":")[0].strip()
            try:
                importlib.import_module(module)
            except Exception as exc:  # any error of a third-party module, reported in one line
                detail = " ".join(str(exc).split()) or "no message"
                raise EngineError(
                    f"rollout engine {name!r}: its module {module!r} (entry point of "
                    f"{getattr(ep.dist, 'name', None) or 'an installed package'} in group "
                    f"{ENTRY_POINT_GROUP}) failed to import: {type(exc).__name__}: {detail}; "
                    "fix or reinstall that package, or pick another engine"
                ) from exc
            return


def check_engine_installed(name: str) -> None:
    """Refuse ``name`` when a module its engine needs is not installed (see
    :attr:`EngineSpec.requires`), before any model is loaded.

    Raises:
        EngineError: unknown engine, or the missing module with how to install it.
    """
    import importlib.util
    import sys

    for module, install in get_engine(name).requires:
        if module in sys.modules:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise EngineError(
                f"rollout engine {name!r} needs the module {module!r}, which is not installed: "
                f"{install}"
            )


def check_engine_model(name: str, model_path: str | None) -> None:
    """Refuse a model the engine ``name`` cannot run, from its ``config.json`` alone, before
    the weights load (a model that takes minutes to load is refused in a second). Nothing
    to check without a local model folder (a toy model, a hub name): the engine checks the
    loaded model too.

    Raises:
        EngineError: the engine's reason (which says what to use instead).
    """
    check = get_engine(name).model_check
    if check is None or not model_path or not (Path(model_path) / "config.json").is_file():
        return
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError, KeyError):
        return  # an unreadable config: the model's own load reports it
    reason = check(config)
    if reason is not None:
        raise EngineError(f"the {name} rollout engine cannot run this model: {reason}")


def get_engine(name: str) -> EngineSpec:
    """The engine registered as ``name``.

    Raises:
        EngineError: no such engine (the message lists the registered ones).
    """
    if name not in _ENGINES:
        _load_entry_point(name)
    if name not in _ENGINES:
        names = list(engine_names())
        match = difflib.get_close_matches(str(name), names, n=1, cutoff=0.5)
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        raise EngineError(
            f"unknown rollout engine {name!r}{hint}; registered: {', '.join(names)} (an engine "
            "of your own registers with divrl.rollout.register_engine before it is named)"
        )
    return _ENGINES[name]


def engine_options(name: str, raw: Mapping[str, Any] | Any | None = None) -> Any:
    """The options object of engine ``name`` from a mapping (None: all defaults).

    An instance of the engine's options dataclass is returned as it is.

    Raises:
        EngineError: unknown engine, unknown key (the message names the valid ones), a
            value of the wrong type, or one the engine's options refuse.
    """
    spec = get_engine(name)
    if isinstance(raw, spec.options):
        return raw
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise EngineError(f"engine {name!r}: options must be a mapping, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(spec.options)}
    unknown = [k for k in raw if k not in fields]
    if unknown:
        valid = ", ".join(fields) or "none"
        raise EngineError(
            f"rollout engine {name!r} takes no option {unknown[0]!r}; its options: {valid}"
        )
    hints = typing.get_type_hints(spec.options)
    values = {k: _check_type(name, k, v, hints[k]) for k, v in raw.items()}
    try:
        return spec.options(**values)
    except (TypeError, ValueError) as exc:
        raise EngineError(f"rollout engine {name!r}: {exc}") from exc


def _check_type(engine: str, key: str, value: Any, tp: Any) -> Any:
    """``value`` if it fits the annotation ``tp`` (ints widen to float), else EngineError."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _check_type(engine, key, value, arg)
            except EngineError:
                continue
    elif origin is Literal:
        if value in args:
            return value
    elif origin in (tuple, list):
        if isinstance(value, list | tuple):
            item = args[0] if args else Any
            return origin(_check_type(engine, key, v, item) for v in value)
    elif tp is Any:
        return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    shown = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
    raise EngineError(f"rollout engine {engine!r}: option {key}={value!r} must be {shown}")


def build_engine(
    name: str, context: EngineContext, options: Mapping[str, Any] | Any | None = None
) -> RolloutEngine:
    """Build the engine ``name`` for ``context`` with ``options`` (mapping or dataclass).

    Raises:
        EngineError: also when the factory's engine lacks part of the engine contract
            (:data:`divrl.rollout.base.ENGINE_ATTRIBUTES`).
    """
    spec = get_engine(name)
    return check_engine(spec.factory(context, engine_options(name, options)), name)
