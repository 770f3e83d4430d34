"""Like for like: what ``divrl report`` checks before it puts models side by side.

Each check returns sentences, one per model and difference; :func:`check_like_for_like`
stores them on the models (``ModelEval.mismatches``). ``divrl report`` refuses a comparison
with any of them unless ``--allow-mismatch`` is given; then each such row is marked ``⚠``
and the report lists what differs. The checks:

- **checkpoint**: a training run's evaluation must be of the run's last trained step. The
  eval set's ``eval_config.json`` names the model it sampled (``resolved_model``: the
  checkpoint's ``model/`` folder); an evaluation of an earlier step (the run was resumed
  after it), of another run's checkpoint or of a model outside the run is refused, never
  shown under the run's name and step count;
- **eval data**: per eval set, every model's prompts (the data fingerprint of its
  evaluation's provenance, :func:`divrl.evaluation.summary.eval_data_fingerprint`) must be
  those of the first model that records one (the base when there is one);
- **eval settings**: per eval set, the settings that change the numbers (samples per
  prompt, temperature, top-p, top-k, response length, stop strings, template, limit, seed,
  greedy decoding, verifier time limit, engine, bootstrap size and coverage) must agree;
- **training data**: the training runs' data handling (``data.train_path``, ``template``,
  ``limit``, ``max_prompt_length``, ``truncation``, ``skip_invalid``) and the fingerprint
  of the prompts they trained on (their provenance) must agree;
- **seeds**: the runs given as seeds of one method must have trained the same steps.

An evaluation or run from before divrl recorded provenance is checked on what it records
(the summary's sampling settings always are); the provenance table shows what is missing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from divrl.evaluation.report_doc import ModelEval
from divrl.runs import Checkpoint

__all__ = [
    "DATA_HANDLING",
    "EVAL_SETTINGS",
    "check_like_for_like",
    "evaluated_step",
]

#: eval_config.json "config" keys that change an evaluation's numbers
EVAL_SETTINGS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "stop",
    "template",
    "limit",
    "seed",
    "greedy",
    "score_timeout",
    "engine",
    "n_boot",
    "confidence",
)

#: config.yaml ``data.*`` keys that decide which prompts a run trains on, and how
DATA_HANDLING = (
    "train_path",
    "template",
    "limit",
    "max_prompt_length",
    "truncation",
    "skip_invalid",
)

_STEP_MODEL = re.compile(r"step_\d+")


def evaluated_step(model: ModelEval, split: str) -> tuple[int | None, str | None]:
    """(the step of the run's checkpoint that ``split`` evaluated, or None; a sentence when
    the evaluated model is not one of this run's checkpoints, else None)."""
    meta = model.eval_configs.get(split) or {}
    path = meta.get("resolved_model") or meta.get("model")
    if not path or model.run_dir is None:
        return None, None
    folder = Path(path)
    ckpt_dir = folder.parent if folder.name == "model" else folder
    if not _STEP_MODEL.fullmatch(ckpt_dir.name) or ckpt_dir.parent.name != "checkpoints":
        if folder.resolve() == model.run_dir.resolve():
            return None, None  # the run named, its checkpoint not recorded: nothing to check
        return None, f"`{split}` evaluated {path}, not a checkpoint of this run"
    if ckpt_dir.parent.parent.resolve() != model.run_dir.resolve():
        return None, f"`{split}` evaluated {path}, a checkpoint of another run folder"
    return Checkpoint.at(ckpt_dir).step, None


def _checkpoint(model: ModelEval) -> list[str]:
    out, stale = [], {}
    trained = model.steps
    for split in sorted(model.summaries):
        step, other = evaluated_step(model, split)
        if other:
            out.append(other)
        elif step is not None and trained is not None and step != trained:
            stale.setdefault(step, []).append(f"`{split}`")
    for step, splits in sorted(stale.items()):
        out.append(
            f"{', '.join(splits)} evaluated step {step} (eval_config.json names "
            f"step_{step:06d}) but the run has trained {trained} steps: evaluate its last "
            f"checkpoint again (`divrl eval --model {model.run_dir} --out {model.eval_dir} ...`)"
        )
    return out


def _eval_settings(model: ModelEval, split: str) -> dict[str, Any]:
    """The settings of one evaluation: from its summary (always there) and its
    eval_config.json (when there)."""
    s = model.summaries[split]
    sampling = s.get("sampling") or {}
    found: dict[str, Any] = {"n": s.get("n_samples_per_prompt"), "confidence": s.get("confidence")}
    found.update({k: sampling[k] for k in sampling if k in EVAL_SETTINGS})
    config = (model.eval_configs.get(split) or {}).get("config") or {}
    found.update({k: config[k] for k in EVAL_SETTINGS if k in config and k != "n"})
    return {k: _plain(v) for k, v in found.items() if v is not None}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _eval_data(model: ModelEval, split: str) -> str | None:
    for record in (model.eval_configs.get(split) or {}, model.summaries[split]):
        data = (record.get("provenance") or {}).get("data")
        if data:
            return data
    return None


def _differences(a: dict[str, Any], b: dict[str, Any], keys: Sequence[str]) -> list[str]:
    return [f"{k} {a[k]!r} vs {b[k]!r}" for k in keys if k in a and k in b and a[k] != b[k]]


def _evaluations(models: Sequence[ModelEval]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    splits = {s for m in models for s in m.summaries}
    for split in sorted(splits):
        present = [m for m in models if split in m.summaries]
        ref = present[0]
        ref_settings = _eval_settings(ref, split)
        with_data = [m for m in present if _eval_data(m, split)]
        for m in present[1:]:
            diff = _differences(_eval_settings(m, split), ref_settings, EVAL_SETTINGS)
            if diff:
                out.setdefault(m.name, []).append(
                    f"`{split}` was evaluated with other settings than {ref.name}'s: "
                    + ", ".join(diff)
                )
        for m in with_data[1:]:
            if _eval_data(m, split) != _eval_data(with_data[0], split):
                out.setdefault(m.name, []).append(
                    f"`{split}` was evaluated on other prompts than {with_data[0].name}'s "
                    f"(data fingerprint {_short(_eval_data(m, split))} vs "
                    f"{_short(_eval_data(with_data[0], split))})"
                )
    return out


def _short(fingerprint: str | None) -> str:
    return (fingerprint or "-").removeprefix("sha256:")[:12]


def _training_data(runs: Sequence[ModelEval]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    configured = [m for m in runs if m.run_config is not None]
    if configured:
        ref = configured[0]
        ref_data = ref.run_config.get("data") or {}
        for m in configured[1:]:
            diff = _differences(m.run_config.get("data") or {}, ref_data, DATA_HANDLING)
            if diff:
                out.setdefault(m.name, []).append(
                    f"trained with other data handling than {ref.name}: "
                    + ", ".join(f"data.{d}" for d in diff)
                )
    fingerprinted = [m for m in runs if m.run_provenance and m.run_provenance[-1].get("data")]
    for m in fingerprinted[1:]:
        ref = fingerprinted[0]
        mine, theirs = m.run_provenance[-1]["data"], ref.run_provenance[-1]["data"]
        if mine != theirs:
            out.setdefault(m.name, []).append(
                f"trained on other prompts than {ref.name} (data fingerprint "
                f"{_short(mine)}, {m.run_provenance[-1].get('prompts', '?')} prompts, vs "
                f"{_short(theirs)}, {ref.run_provenance[-1].get('prompts', '?')} prompts)"
            )
    return out


def _seeds(runs: Sequence[ModelEval]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    groups: dict[str, list[ModelEval]] = {}
    for m in runs:
        groups.setdefault(m.method, []).append(m)
    for method, members in groups.items():
        steps = {m.steps for m in members}
        if len(members) > 1 and len(steps) > 1:
            shown = ", ".join(f"{m.name} {m.steps}" for m in members)
            for m in members:
                out.setdefault(m.name, []).append(
                    f"the seeds of {method} trained different numbers of steps ({shown})"
                )
    return out


def check_like_for_like(runs: Sequence[ModelEval], base: ModelEval | None) -> list[str]:
    """Run every check (module docstring); store each model's sentences on it
    (``mismatches``) and return them all, each starting with the model's name."""
    models = ([base] if base is not None else []) + list(runs)
    found: dict[str, list[str]] = {m.name: [] for m in models}
    for m in runs:
        found[m.name] += _checkpoint(m)
    for part in (_evaluations(models), _training_data(runs), _seeds(runs)):
        for name, sentences in part.items():
            found[name] += sentences
    out = []
    for m in models:
        m.mismatches = found[m.name]
        out += [f"{m.name}: {s}" for s in m.mismatches]
    return out
