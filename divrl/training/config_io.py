"""Reading ``divrl train`` configs: YAML files with ``extends``, ``key=value`` overrides,
type checks of a mapping against a dataclass of sections, and dumping.

Below :mod:`divrl.training.config` and its section modules (which import this module,
never the other way round, so either imports first on its own): the readers here take the
config class as an argument; ``config.load_config`` and ``config.config_from_dict`` bind
it. ``positive``, ``choice`` and ``help_field`` are what the sections check and declare
their keys with.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from divrl.training import loss_config

__all__ = [
    "ConfigError",
    "build_config",
    "choice",
    "closest",
    "dump_config",
    "help_field",
    "parse_override",
    "positive",
    "read_config_mapping",
]


class ConfigError(ValueError):
    """An unknown key or an invalid value in a config file or override."""


def closest(word: str, choices: typing.Iterable[str], prefix: str = "") -> str:
    """`` (did you mean '<prefix><match>'?)`` for the nearest of ``choices``, or ``""``."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{prefix}{match[0]}'?)" if match else ""


def choice(name: str, value: Any, choices: typing.Sequence[Any]) -> None:
    """Raise :class:`ConfigError` naming ``name`` and the valid values unless ``value`` is one."""
    if value not in choices:
        raise ConfigError(
            f"{name}={value!r} is not valid; choose one of {list(choices)}"
            + closest(str(value), [str(c) for c in choices])
        )


def positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise :class:`ConfigError` naming ``name`` unless ``value`` is > 0 (>= 0 with
    ``allow_zero``)."""
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def help_field(text: str, default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A dataclass field with its help text (``metadata["help"]``): every config key has one."""
    return dataclasses.field(default=default, metadata={"help": text}, **kwargs)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` (from YAML) against the annotation ``tp``; ints widen to float."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}={value!r}: invalid value")
    if origin is Literal:
        choice(key, value, typing.get_args(tp))
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} must be a mapping")
        return dict(value)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            value = [value]  # `rollout.stop=</answer>` means a one-element list
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r} must be a list of {_type_name(item_tp)}")
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be true or false")
        return value
    if tp is float:
        if isinstance(value, str):
            # YAML 1.1 reads `1e-6` (no dot) as a string.
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}={value!r} must be a number")
        if not math.isfinite(value):
            # before any section's own checks, which NaN slips through (nan > 0 is False)
            raise ConfigError(
                f"{key}={value!r} must be a finite number (use 0 or null to turn a feature off)"
            )
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}={value!r} must be an integer")
        return value
    if tp is str:
        if not isinstance(value, str):
            # YAML reads `template=1` as an int; a str field takes it as text.
            if isinstance(value, int | float) and not isinstance(value, bool):
                return str(value)
            raise ConfigError(f"{key}={value!r} must be a string")
        return value
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"section {name!r} must be a mapping, got {raw!r}")
    # a section may read the keys of its earlier layout (RolloutConfig.migrate)
    raw = getattr(cls, "migrate", lambda r: r)(raw)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(
                f"unknown key '{name}.{key}'" + closest(str(key), names, prefix=f"{name}.")
            )
        kwargs[key] = _coerce(f"{name}.{key}", value, hints[key])
    return cls(**kwargs)


def _section_classes(config_cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(config_cls)}


def build_config(config_cls: type, raw: dict[str, Any]) -> Any:
    """Build ``config_cls`` (a dataclass whose fields are section dataclasses) from a
    nested mapping, every value checked against its field's annotation."""
    sections = _section_classes(config_cls)
    for key in raw:
        if key not in sections:
            raise ConfigError(f"unknown section {key!r}" + closest(str(key), sections))
    return config_cls(
        **{name: _build_section(name, cls, raw.get(name)) for name, cls in sections.items()}
    )


def _merge(base: dict[str, Any], over: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """``over`` merged into ``base`` key by key; inside a section an empty mapping
    replaces the one below it (``algorithm.rehearsal_control={}`` switches the controller
    off instead of changing nothing)."""
    out = dict(base)
    for key, value in over.items():
        emptied = depth >= 1 and value == {}
        if isinstance(value, dict) and isinstance(out.get(key), dict) and not emptied:
            out[key] = _merge(out[key], value, depth + 1)
        else:
            out[key] = value
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"circular 'extends' through {path}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: line {line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save "
            "the file as UTF-8"
        ) from None
    raw = _safe_load(text, str(path)) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    parents = raw.pop("extends", None)
    if parents is None:
        return raw
    if isinstance(parents, str):
        parents = [parents]
    if (
        not isinstance(parents, list)
        or not parents
        or not all(isinstance(p, str) and p.strip() for p in parents)
    ):
        raise ConfigError(
            f"{path}: extends: {parents!r} must be the path of another config file or a list "
            "of them (relative to this file), e.g. extends: [../configs/dph_js.yaml, mine.yaml]"
        )
    merged: dict[str, Any] = {}
    for parent in parents:  # later files override earlier ones, this file overrides all
        merged = _merge(merged, _read_yaml(path.parent / parent, (*seen, path)))
    return _merge(merged, raw)


def _own_keys(path: Path) -> dict[str, Any]:
    """The mapping ``path`` itself writes (its ``extends`` not followed)."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return raw if isinstance(raw, dict) else {}


def _sets(raw: dict[str, Any], section: str, key: str) -> bool:
    part = raw.get(section)
    return isinstance(part, dict) and key in part


def _per_file_defaults(path: Path, raw: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A config file that does not set ``logging.output_dir`` itself runs in
    ``runs/<file stem>`` (whatever the files it extends set; an override wins), and its
    reference store is then ``<its run folder>/reference`` unless the file or an override
    sets ``reference.store``: two config files never share a run folder or a store by
    default."""
    own = _own_keys(path)
    if _sets(own, "logging", "output_dir"):
        return raw
    defaults: dict[str, Any] = {}
    if not _sets(over, "logging", "output_dir"):
        defaults["logging"] = {"output_dir": f"runs/{path.stem}"}
    if not (_sets(own, "reference", "store") or _sets(over, "reference", "store")):
        defaults["reference"] = {"store": None}
    return _merge(raw, defaults)


def _safe_load(text: str, where: str, fix: str = "fix the syntax there") -> Any:
    """``yaml.safe_load``; a syntax error (or a mapping or list used as a key) becomes one
    :class:`ConfigError` naming ``where``, the line and the column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f": line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
        problem = " ".join(p for p in parts if p) or str(exc).splitlines()[0]
        if "unhashable" in problem:
            problem += " (a mapping or list used as a key)"
        raise ConfigError(f"{where}{at}: invalid YAML: {problem}; {fix}") from None


def _comment_cut(value: str) -> bool:
    """Whether YAML would read part of ``value`` as a ``# ...`` comment and drop it."""
    try:
        tokens = [t for t in yaml.scan(value) if t.end_mark.index > t.start_mark.index]
    except yaml.YAMLError:
        return False
    end = max((t.end_mark.index for t in tokens), default=0)
    return bool(value[end:].strip())


def _field_type(config_cls: type | None, parts: list[str]) -> Any:
    """The annotation of the field an override sets (None: not known here)."""
    if config_cls is None or len(parts) != 2:
        return None
    section = _section_classes(config_cls).get(parts[0])
    if section is None or not dataclasses.is_dataclass(section):
        return None
    return typing.get_type_hints(section).get(parts[1])


def _takes_text(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_takes_text(a) for a in typing.get_args(tp))
    if origin is Literal:
        return all(isinstance(a, str) for a in typing.get_args(tp))
    if origin is list:
        return _takes_text(typing.get_args(tp)[0])
    return tp is str


def _fits(value: Any, tp: Any) -> bool:
    """Whether the YAML value ``value`` is one of ``tp``'s own (no number read as text)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is str or origin is Literal:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(tp)
        return _fits(value, item) or (
            isinstance(value, list) and all(_fits(v, item) for v in value)
        )
    try:
        _coerce("", value, tp)
    except (ConfigError, TypeError):
        return False
    return True


def parse_override(text: str, config_cls: type | None = None) -> tuple[list[str], Any]:
    """``'algorithm.clip_high=0.28'`` -> (['algorithm', 'clip_high'], 0.28).

    The value is read as YAML, with two exceptions that keep every character a user
    wrote: a value in which YAML would drop a ``# ...`` comment is the whole text (``run
    #2`` stays ``run #2``; a number field then refuses ``0.28 # note`` by name), and for a
    field that takes text (known from ``config_cls``), a value that is not YAML of the
    field's own type is the text as written (``logging.output_dir=0x10`` is ``0x10``, not
    16; ``=true`` is ``true``)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    # section.key, or section.key.entry for a mapping (algorithm.loss_options.rho=0.5)
    if len(parts) not in (2, 3) or not all(parts):
        raise ConfigError(f"override key {key!r} must be section.key (e.g. train.total_steps)")
    value = value.strip()
    if not value:
        return parts, None
    if _comment_cut(value):
        return parts, value
    tp = _field_type(config_cls, parts)
    textual = tp is not None and _takes_text(tp)
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        if textual:
            return parts, value
        parsed = _safe_load(value, f"override {text!r}", "quote the value to pass it as text")
    if textual and not _fits(parsed, tp):
        return parts, value
    return parts, parsed


def read_config_mapping(
    path: str | Path | None = None,
    overrides: typing.Sequence[str] = (),
    config_cls: type | None = None,
) -> dict[str, Any]:
    """The nested mapping of a YAML config (``extends`` followed: one file or a list, later
    entries over earlier ones, the file's own keys over all; empty when ``path`` is None)
    with ``overrides`` merged over it and the file's own run folder and store
    (:func:`_per_file_defaults`), before any type check (``config_cls``: the
    config class whose field types say which override values are text,
    :func:`parse_override`)."""
    preset = _read_yaml(Path(path)) if path is not None else {}
    over: dict[str, Any] = {}
    for text in overrides:
        parts, value = parse_override(text, config_cls)
        for name in reversed(parts):
            value = {name: value}
        over = _merge(over, value)
    raw = _merge(preset, over)
    if path is not None:
        _refuse_stale_loss_options(path, preset, over, raw)
        raw = _per_file_defaults(Path(path), raw, over)
    return raw


def _refuse_stale_loss_options(path, preset, over, raw) -> None:
    """An override that switches the policy loss must not inherit the preset's options for
    its old loss (docs/training.md, "Switching the policy loss")."""
    sections = [d.get("algorithm") if isinstance(d, dict) else None for d in (preset, over, raw)]
    preset_algo, over_algo, algo = (s if isinstance(s, dict) else {} for s in sections)
    loss = algo.get("policy_loss")
    if not isinstance(loss, str):
        return
    stale = loss_config.stale_preset_options(loss, preset_algo, over_algo)
    if stale:
        old = preset_algo.get("policy_loss") or "vanilla"
        keys = ", ".join(f"{k}={v}" for k, v in stale.items())
        nulls = " ".join(f"{k}=null" for k in stale)
        raise ConfigError(
            f"algorithm.policy_loss={loss} switches {path}'s loss from {old!r}, but the preset "
            f"also sets {keys} for {old!r}, which {loss!r} would inherit. Add {nulls} to run "
            f"{loss!r} with its own defaults, or set each key again on the command line to keep it"
        )


def dump_config(config: Any) -> str:
    """The YAML text of a config (``config.to_dict()``), in field order."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
