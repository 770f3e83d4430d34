"""The DPH-RL reference store: presampled responses of the initial policy, on disk.

Layout of a store directory (written once by ``divrl presample``):

- ``samples.parquet``: one row per kept reference response: ``prompt_id``,
  ``prompt_ids`` / ``response_ids`` (token ids), ``ref_log_probs`` (per-token log-probs
  of the response under the initial policy at ``manifest["log_prob_temperature"]``),
  ``text``.
- ``prompts.parquet``: one row per training prompt: ``prompt_id``, ``n_correct`` (of k),
  ``split`` (``near_perfect`` or ``exploration``), ``has_reference``.
- ``manifest.json``: model, sampling settings, threshold and split statistics, and the
  ``fingerprint`` of the model directory and of the prompts (``divrl.data.fingerprint``)
  that :meth:`ReferenceStore.open` compares with a training run (:class:`StoreExpectation`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "ReferenceSample",
    "ReferenceStore",
    "StoreExpectation",
    "StoreMismatchError",
    "write_reference_store",
]

logger = logging.getLogger(__name__)

SAMPLES, PROMPTS, MANIFEST = "samples.parquet", "prompts.parquet", "manifest.json"


@dataclass
class ReferenceSample:
    prompt_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    ref_log_probs: list[float]
    text: str = ""


def write_reference_store(
    path: str | Path,
    samples: list[ReferenceSample],
    prompts: list[dict[str, Any]],
    manifest: dict[str, Any],
) -> Path:
    """Write a store atomically (temp dir, then rename over any previous store)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    sample_table = pa.table(
        {
            "prompt_id": pa.array([s.prompt_id for s in samples], pa.string()),
            "prompt_ids": pa.array([s.prompt_ids for s in samples], pa.list_(pa.int32())),
            "response_ids": pa.array([s.response_ids for s in samples], pa.list_(pa.int32())),
            "ref_log_probs": pa.array([s.ref_log_probs for s in samples], pa.list_(pa.float32())),
            "text": pa.array([s.text for s in samples], pa.string()),
        }
    )
    pq.write_table(sample_table, tmp / SAMPLES)
    prompt_table = pa.table(
        {
            "prompt_id": pa.array([str(p["prompt_id"]) for p in prompts], pa.string()),
            "n_correct": pa.array([int(p["n_correct"]) for p in prompts], pa.int32()),
            "split": pa.array([p["split"] for p in prompts], pa.string()),
            "has_reference": pa.array([bool(p["has_reference"]) for p in prompts], pa.bool_()),
        }
    )
    pq.write_table(prompt_table, tmp / PROMPTS)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
    return path


#: manifest["sampling"] key -> the config setting it comes from (for messages)
SAMPLING_SETTINGS = {
    "k": "reference.k",
    "temperature": "reference.temperature",
    "top_p": "reference.top_p",
    "max_new_tokens": "rollout.max_new_tokens",
    "stop": "rollout.stop",
}


class StoreMismatchError(ValueError):
    """The reference store was presampled for another model, data or settings."""


@dataclass
class StoreExpectation:
    """What a training run needs a reference store to have been presampled with.

    Every field left ``None`` is not checked.

    Args:
        model: :func:`~divrl.data.fingerprint.model_fingerprint` of the model trained.
        model_name: its path or hub id (for messages).
        prompts: ``(prompt id, prompt token ids)`` of every training prompt.
        sampling: the presample settings, keyed as ``manifest["sampling"]``
            (see :data:`SAMPLING_SETTINGS`).
        threshold: the near-perfect threshold (the split rule), correct of k.
        failed_to_exploration: the other half of the split rule (None: not checked).
        keep_presampled: whether the store also keeps the near-perfect prompts' correct
            presampled responses (``reference.keep_presampled``; None: not checked).
    """

    model: str | None = None
    model_name: str | None = None
    prompts: Sequence[tuple[str, Sequence[int]]] | None = None
    sampling: dict[str, Any] | None = None
    threshold: int | None = None
    failed_to_exploration: bool | None = None
    keep_presampled: bool | None = None

    def fingerprint(self) -> dict[str, Any]:
        """The ``manifest["fingerprint"]`` presample writes for these model and prompts."""
        from divrl.data.fingerprint import prompts_fingerprint

        out: dict[str, Any] = {"model": self.model}
        if self.prompts is not None:
            out["prompts"] = prompts_fingerprint(self.prompts)
            out["prompt_count"] = len(self.prompts)
        return out

    def mismatches(self, store: ReferenceStore) -> list[str]:
        """One line per difference between this run and ``store``'s manifest."""
        manifest, found = store.manifest, []
        stored = manifest.get("fingerprint") or {}
        if self.model is not None and stored.get("model") not in (None, self.model):
            same = str(manifest.get("model")) == str(self.model_name)
            found.append(
                f"model: the files of {self.model_name} changed since presampling"
                if same
                else f"model: presampled from {manifest.get('model')}, "
                f"this run trains {self.model_name}"
            )
        if self.prompts is not None and stored.get("prompts") is not None:
            found += _prompt_mismatches(store, self.prompts, self.fingerprint()["prompts"])
        for key, value in (self.sampling or {}).items():
            before = (manifest.get("sampling") or {}).get(key)
            if before is not None and _normal(before) != _normal(value):
                name = SAMPLING_SETTINGS.get(key, key)
                found.append(f"{name}: presampled with {before!r}, this run has {value!r}")
        if self.threshold is not None and manifest.get("threshold") not in (None, self.threshold):
            found.append(
                f"reference.threshold (the split rule): presampled with {manifest['threshold']} "
                f"correct of k, this run has {self.threshold}"
            )
        before = manifest.get("failed_to_exploration")
        if self.failed_to_exploration is not None and before not in (
            None,
            self.failed_to_exploration,
        ):
            found.append(
                f"reference.failed_to_exploration (the split rule): presampled with {before}, "
                f"this run has {self.failed_to_exploration}"
            )
        # a store from before the setting existed kept only the extra responses (False)
        kept = manifest.get("keep_presampled", False)
        if self.keep_presampled is not None and kept != self.keep_presampled:
            found.append(
                f"reference.keep_presampled (which responses the store holds): presampled "
                f"with {kept}, this run has {self.keep_presampled}"
            )
        return found


def _normal(value: Any) -> Any:
    return list(value) if isinstance(value, tuple | list) else value


def _prompt_mismatches(store: ReferenceStore, prompts, digest: str) -> list[str]:
    if store.manifest["fingerprint"]["prompts"] == digest:
        return []
    stored_ids = set(store.prompts["prompt_id"])
    train_ids = [str(pid) for pid, _ in prompts]
    new = [pid for pid in train_ids if pid not in stored_ids]
    gone = stored_ids - set(train_ids)
    if not new and not gone:
        return [
            "data: the same prompt ids, but their prompt tokens differ (the text, the "
            "template, the tokenizer or data.max_prompt_length changed since presampling)"
        ]
    line = (
        f"data: the store was presampled on {len(stored_ids)} prompts, this run trains on "
        f"{len(train_ids)}"
    )
    if new:
        line += f"; {len(new)} training prompts are not in the store (e.g. {', '.join(new[:3])})"
    if gone:
        line += f"; {len(gone)} store prompts are not in the training data"
    line += " (was it presampled with another data.limit or data.train_path?)"
    return [line]


class ReferenceStore:
    """Read side of a reference store (everything is loaded in memory: it is small).

    Open one for training with :meth:`open`, which also checks that it can be trained on.
    """

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        temperature: float | None = None,
        expect: StoreExpectation | None = None,
        allow_mismatch: bool = False,
        allow_hint: str = "--allow-store-mismatch (reference.allow_store_mismatch=true)",
    ) -> ReferenceStore:
        """The store at ``path``, checked for training: it holds samples, (when
        ``temperature`` is given) its log-probs were computed at that sampling temperature,
        and (when ``expect`` is given) it was presampled from the same model, prompts,
        sampling settings and split rule.

        Args:
            allow_mismatch: log a differing ``expect`` as a warning instead of raising.
            allow_hint: how the user sets ``allow_mismatch`` (named in the error).

        Raises:
            FileNotFoundError: no store at ``path``.
            StoreMismatchError: the store differs from ``expect``.
            ValueError: an empty store, or log-probs at another temperature.
        """
        store = cls(path)
        if len(store) == 0:
            raise ValueError(f"the reference store {store.path} holds no samples")
        stored_t = store.manifest.get("log_prob_temperature")
        mismatch = stored_t is not None and abs(float(stored_t) - (temperature or 0.0)) > 1e-9
        if temperature is not None and mismatch:
            raise ValueError(
                f"the reference store's log-probs are at temperature {stored_t} but "
                f"training samples at temperature={temperature}: presample again at "
                f"{temperature} or train at {stored_t}"
            )
        if expect is not None:
            store._check(expect, allow_mismatch, allow_hint)
        return store

    def _check(self, expect: StoreExpectation, allow_mismatch: bool, allow_hint: str) -> None:
        if "fingerprint" not in self.manifest:
            logger.warning(
                "the reference store %s was written by an older divrl without fingerprints: "
                "its model and data are not checked (presample again to check them)",
                self.path,
            )
        differences = expect.mismatches(self)
        if not differences:
            return
        message = (
            f"the reference store {self.path} does not match this run:\n  - "
            + "\n  - ".join(differences)
            + f"\nPresample again with this run's config and overrides (`divrl presample "
            f"CONFIG [KEY=VALUE ...]` writes {self.path}), point reference.store at a "
            f"matching store, or pass {allow_hint} to train on this store anyway."
        )
        if not allow_mismatch:
            raise StoreMismatchError(message)
        logger.warning("%s (allowed)", message)

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not (self.path / MANIFEST).is_file():
            raise FileNotFoundError(
                f"no DPH reference store at {self.path}: run `divrl presample <config>` first "
                "(or set reference.store)"
            )
        self.manifest: dict[str, Any] = json.loads((self.path / MANIFEST).read_text())
        samples = pq.read_table(self.path / SAMPLES).to_pydict()
        self.samples = [
            ReferenceSample(*row)
            for row in zip(
                samples["prompt_id"],
                samples["prompt_ids"],
                samples["response_ids"],
                samples["ref_log_probs"],
                samples["text"],
                strict=True,
            )
        ]
        self.prompts = pq.read_table(self.path / PROMPTS).to_pydict()

    def __len__(self) -> int:
        return len(self.samples)

    @functools.cached_property
    def exploration_ids(self) -> set[str]:
        """Prompt ids that training rolls out (D_exp), computed once."""
        return {
            pid
            for pid, split in zip(self.prompts["prompt_id"], self.prompts["split"], strict=True)
            if split == "exploration"
        }
