"""A world's toy presets, generated from its method list (``divrl toy presets``).

A world declares the scale of its presets once (:class:`PresetScale`, the scaffold's
``preset_scale``): prompt and response lengths, learning rate, batch sizes, steps. For each
method the command writes ``configs/<presets>/<method>.yaml`` that ``extends`` the method's
full preset (``configs/<method>.yaml``) and overrides only the scale, the way the
hand-written countdown presets do:

- ``model``: ``path: null`` (the world's base model), ``toy_size: full``, ``toy_world``;
- ``data.max_prompt_length`` and ``rollout.max_new_tokens`` (the world's lengths),
  ``data.truncation`` (one prompt handling for every method of the world, so that all
  train on the same prompts); ``rollout.n`` capped at ``samples``;
- ``train``: ``prompts_per_step``, ``mini_batch_size`` keeping the full preset's optimiser
  steps per batch (``null`` for an on-policy world), ``micro_batch_size`` by sequences
  (``dph_micro_batch_size`` for a method that rehearses reference samples),
  ``total_steps``;
- ``optim.lr``; ``algorithm.lp_reg_micro_batch_tokens`` where the full preset selects
  within the Lp-Reg authors' micro-batches;
- ``reference``: one store per world, ``per_step`` keeping the full preset's reference
  samples per rollout, the world's ``threshold`` and ``keep_presampled`` when it declares
  them;
- ``logging.output_dir``: ``runs/<presets>/<method>``; then the world's ``extra`` keys.

A method with no full preset (a toy-only variant such as ``dph_js_paper``) copies the
default world's variant (``configs/toy/<method>.yaml``, which extends a sibling preset) with
its output folder moved; its sibling is generated too unless it is already there.

A world declares where it runs a method otherwise than the full preset
(``method_settings``) and the methods whose presets it does not generate
(``not_generated``, e.g. a variant its authors wrote by hand), so that the command
regenerates the world's shipped presets setting for setting (tests/toy/test_world_presets.py
compares them for every registered world).

A file that exists is never replaced without ``overwrite``; one that already holds what
would be written, or other text with the same settings, is left as it is.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from divrl.data.prompts import TRUNCATIONS

__all__ = [
    "PresetExists",
    "PresetScale",
    "configs_root",
    "generate_presets",
    "render_presets",
    "same_settings",
]


class PresetExists(FileExistsError):
    """A preset that would be written is already there and differs (pass overwrite)."""


@dataclasses.dataclass(frozen=True)
class PresetScale:
    """The scale of a world's toy presets (module docstring: where each field goes)."""

    #: data.max_prompt_length: the world's longest prompt in tokens, with some room
    max_prompt_length: int
    #: rollout.max_new_tokens: the world's longest useful response (prompt + response must
    #: fit the base model's context)
    max_new_tokens: int
    #: data.truncation of every method (the full presets differ: the DPH-RL and GRPO ones
    #: drop over-long prompts, the Lp-Reg ones left-truncate them)
    truncation: str = "drop"
    #: optim.lr (the full presets' 1e-6 is sized for billion-parameter models)
    lr: float = 3e-4
    #: rollout.n at most (a full preset's 16 samples per prompt halved for a CPU)
    samples: int = 8
    #: train.prompts_per_step
    prompts_per_step: int = 32
    #: train.total_steps
    total_steps: int = 300
    #: train.micro_batch_size (sequences; train.micro_batch_tokens is null)
    micro_batch_size: int = 64
    #: train.micro_batch_size of a method with reference samples: 16 reference samples make
    #: 1 micro-batch per 8 rollout ones, the DPH-RL authors' share
    dph_micro_batch_size: int = 16
    #: one optimiser step per batch (train.mini_batch_size null) for every method
    on_policy: bool = False
    #: algorithm.lp_reg_micro_batch_tokens where the full preset's lp_reg_scope is authors
    lp_reg_micro_batch_tokens: int = 1200
    #: reference.threshold (None: the full preset's)
    reference_threshold: int | None = None
    #: reference.keep_presampled (None: the full preset's)
    keep_presampled: bool | None = None
    #: any other key the world's presets set, dotted (``{"checkpoint.save_every": 25}``)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: method -> dotted keys its preset sets besides the scale, where the world runs the
    #: method otherwise than its full preset (``{"dapo": {"algorithm.dynamic_sampling":
    #: True}}``)
    method_settings: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    #: method -> why the command does not write its preset for this world (a preset the
    #: world's authors wrote by hand, or a method the world has no preset for)
    not_generated: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (
            "max_prompt_length",
            "max_new_tokens",
            "samples",
            "prompts_per_step",
            "total_steps",
            "micro_batch_size",
            "dph_micro_batch_size",
            "lp_reg_micro_batch_tokens",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PresetScale.{name}={value!r}: give a whole number >= 1")
        if self.truncation not in TRUNCATIONS:
            raise ValueError(
                f"PresetScale.truncation={self.truncation!r}: choose one of {list(TRUNCATIONS)}"
            )
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"PresetScale.lr={self.lr!r}: give a finite number > 0")
        keys = [*self.extra, *(k for m in self.method_settings.values() for k in m)]
        for key in keys:
            if not re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", key):
                raise ValueError(
                    f"PresetScale key {key!r}: write it dotted, section first "
                    "(checkpoint.save_every)"
                )


def configs_root() -> Path:
    """The ``configs/`` folder of the working directory, else of this checkout."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "configs").is_dir():
            return root / "configs"
    raise FileNotFoundError("configs/ not found: run from the divrl checkout or pass --configs")


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("...").strip()


def _render(tree: Mapping[str, Any], indent: int = 0) -> list[str]:
    lines = []
    for key, node in tree.items():
        if isinstance(node, dict):
            lines.append(" " * indent + f"{key}:")
            lines.extend(_render(node, indent + 2))
            continue
        value, why = node
        line = " " * indent + f"{key}: {_scalar(value)}"
        lines.append(f"{line:<28} # {why}" if why else line)
    return lines


def _put(tree: dict[str, Any], dotted: str, value: Any, why: str = "") -> None:
    *path, last = dotted.split(".")
    for part in path:
        tree = tree.setdefault(part, {})
    tree[last] = (value, why)


def _header(world: str, what: str) -> list[str]:
    said = f"Generated by `divrl toy presets --world {world}` from {what} The command never "
    said += "replaces this file without --overwrite; edit it as your own."
    return textwrap.wrap(said, 88, initial_indent="# ", subsequent_indent="# ")


def _extends(target: Path, out: Path) -> str:
    """``target`` relative to ``out`` when both are in one checkout, else absolute."""
    target, out = target.resolve(), out.resolve()
    if target.parent.parent in (out, *out.parents):
        return Path(os.path.relpath(target, out)).as_posix()
    return target.as_posix()


def _full_preset(world: str, method: str, full: Path, out: Path, folder: str, scale) -> str:
    """The preset of a method with a full preset: its scale overrides (module docstring)."""
    from divrl.training.config import load_config

    cfg = load_config(full)
    tree: dict[str, Any] = {}
    _put(tree, "model.path", None, "the world's base model")
    _put(tree, "model.toy_size", "full")
    _put(tree, "model.toy_world", world)
    _put(tree, "data.max_prompt_length", scale.max_prompt_length)
    _put(tree, "data.truncation", scale.truncation, "every preset of the world alike")
    if cfg.rollout.n > scale.samples:
        _put(tree, "rollout.n", scale.samples, f"the full preset's {cfg.rollout.n} capped")
    _put(tree, "rollout.max_new_tokens", scale.max_new_tokens)
    if cfg.algorithm.lp_reg_scope == "authors":
        _put(tree, "algorithm.lp_reg_micro_batch_tokens", scale.lp_reg_micro_batch_tokens)
    prompts = scale.prompts_per_step
    _put(tree, "train.prompts_per_step", prompts)
    full_mini = cfg.train.mini_batch_size
    if scale.on_policy:
        _put(tree, "train.mini_batch_size", None, "on-policy: one optimiser step per batch")
    elif full_mini is not None and full_mini != cfg.train.prompts_per_step:
        steps = cfg.train.prompts_per_step // full_mini
        _put(tree, "train.mini_batch_size", max(1, prompts // steps), f"{steps} steps per batch")
    dph = cfg.uses_reference_samples
    micro = scale.dph_micro_batch_size if dph else scale.micro_batch_size
    _put(tree, "train.micro_batch_size", micro)
    _put(tree, "train.micro_batch_tokens", None, "micro-batches by sequences")
    _put(tree, "train.total_steps", scale.total_steps)
    _put(tree, "optim.lr", float(scale.lr))
    if dph:
        _put(tree, "reference.store", f"runs/{folder}/dph_reference", "one store per world")
        rollouts = cfg.train.prompts_per_step * cfg.rollout.n
        ours = prompts * min(cfg.rollout.n, scale.samples)
        per_step = max(1, round(cfg.reference.per_step * ours / rollouts))
        _put(tree, "reference.per_step", per_step, "the full preset's share of rollouts")
        if scale.reference_threshold is not None:
            _put(tree, "reference.threshold", scale.reference_threshold)
        if scale.keep_presampled is not None:
            _put(tree, "reference.keep_presampled", scale.keep_presampled)
    _put(tree, "logging.output_dir", f"runs/{folder}/{method}")
    for key, value in scale.extra.items():
        _put(tree, key, value)
    for key, value in scale.method_settings.get(method, {}).items():
        _put(tree, key, value, f"the {world} world's {method} (the full preset: otherwise)")
    what = (
        f"{_shown(full)} (the method's full preset) at the {world} world's declared scale "
        "(its scaffold's preset_scale): it overrides only the scale; every method setting is "
        "the full preset's."
    )
    lines = [*_header(world, what), f"extends: {_extends(full, out)}", *_render(tree)]
    return "\n".join(lines) + "\n"


def _shown(path: Path) -> str:
    """``configs/...`` for a path under a configs folder, else the path."""
    parts = path.resolve().parts
    return "/".join(parts[parts.index("configs") :]) if "configs" in parts else str(path)


def _variant(world: str, method: str, source: Path, folder: str) -> tuple[str, str]:
    """(the text, its base preset's name) of a toy-only variant copied from ``source``."""
    text = source.read_text()
    raw = yaml.safe_load(text) or {}
    base = str(raw.get("extends", ""))
    if not base or "/" in base or not base.endswith(".yaml"):
        raise ValueError(
            f"{source}: a variant extends a sibling preset (extends: <method>.yaml), not "
            f"{base!r}; write configs/{folder}/{method}.yaml by hand"
        )
    old = (raw.get("logging") or {}).get("output_dir")
    if old is not None:
        text = re.sub(
            rf"(\n\s*output_dir:\s*){re.escape(str(old))}", rf"\g<1>runs/{folder}/{method}", text
        )
    else:
        text += f"logging:\n  output_dir: runs/{folder}/{method}\n"
    what = (
        f"{_shown(source)}, copied (a toy-only variant: no full preset), on this folder's "
        f"{base}, with its output folder moved."
    )
    return "\n".join(_header(world, what)) + "\n" + text, base.removesuffix(".yaml")


def render_presets(
    world: str,
    scale: PresetScale,
    methods: Iterable[str],
    *,
    out: Path,
    folder: str,
    configs: Path | None = None,
    variants: str = "toy",
) -> dict[Path, str]:
    """Path -> text of each method's preset in ``out`` (``folder``: the presets' folder
    under ``configs/``, which names the runs' output folders); ``variants`` is the folder,
    under ``configs``, of the toy-only variants copied for methods without a full
    preset."""
    configs = configs or configs_root()
    todo = [m for m in dict.fromkeys(methods) if m not in scale.not_generated]
    texts = {}
    while todo:
        method = todo.pop(0)
        full, variant = configs / f"{method}.yaml", configs / variants / f"{method}.yaml"
        if full.is_file():
            texts[out / f"{method}.yaml"] = _full_preset(world, method, full, out, folder, scale)
        elif variant.is_file():
            text, base = _variant(world, method, variant, folder)
            texts[out / f"{method}.yaml"] = text
            if (
                out / f"{base}.yaml" not in texts
                and not (out / f"{base}.yaml").exists()
                and base not in scale.not_generated
            ):
                todo.append(base)
        else:
            raise ValueError(
                f"method {method!r} has no preset: neither {full} nor {variant} exists"
            )
    return texts


def same_settings(path: Path, text: str) -> bool:
    """Whether the preset at ``path`` resolves to the config ``text`` would (comments,
    layout and order aside): ``text`` is read from a hidden file beside ``path``, so that
    its ``extends`` resolves the same way."""
    from divrl.training.config import ConfigError, load_config

    probe = path.with_name(f".{path.stem}.generated.yaml")
    try:
        probe.write_text(text)
        return load_config(path).to_dict() == load_config(probe).to_dict()
    except (ConfigError, OSError):
        return False
    finally:
        probe.unlink(missing_ok=True)


def generate_presets(texts: Mapping[Path, str], *, overwrite: bool = False) -> dict[Path, str]:
    """Write ``texts`` (from :func:`render_presets`); path -> ``written``, ``unchanged``
    (the same text) or ``same`` (other comments or layout, the same settings: kept unless
    ``overwrite``). Checks every file before writing any: one that exists with other
    settings raises :class:`PresetExists` unless ``overwrite``."""
    status = {}
    for path, text in texts.items():
        if path.exists():
            if path.read_text() == text:
                status[path] = "unchanged"
            elif overwrite:
                continue
            elif same_settings(path, text):
                status[path] = "same"
            else:
                raise PresetExists(
                    f"{path} exists and its settings differ from the generated preset's: pass "
                    "--overwrite to replace it, or move it away"
                )
    for path, text in texts.items():
        if path not in status:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            status[path] = "written"
    return status
