"""The DPH-RL reference store: presampled responses of the initial policy, on disk.

Layout of a store directory (written once by ``divrl presample``):

- ``samples.parquet``: one row per kept reference response: ``prompt_id``,
  ``prompt_ids`` / ``response_ids`` (token ids), ``ref_log_probs`` (per-token log-probs
  of the response under the initial policy at ``manifest["log_prob_temperature"]``),
  ``text``.
- ``prompts.parquet``: one row per training prompt: ``prompt_id``, ``n_correct`` (of k),
  ``split`` (``near_perfect`` or ``exploration``), ``has_reference``.
- ``manifest.json``: model, sampling settings, threshold and split statistics.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["ReferenceSample", "ReferenceStore", "write_reference_store"]

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


class ReferenceStore:
    """Read side of a reference store (everything is loaded in memory: it is small).

    Open one for training with :meth:`open`, which also checks that it can be trained on.
    """

    @classmethod
    def open(cls, path: str | Path, *, temperature: float | None = None) -> ReferenceStore:
        """The store at ``path``, checked for training: it holds samples and (when
        ``temperature`` is given) its log-probs were computed at that sampling temperature.

        Raises:
            FileNotFoundError: no store at ``path``.
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
        return store

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

    @property
    def exploration_ids(self) -> set[str]:
        """Prompt ids that training rolls out (D_exp)."""
        return {
            pid
            for pid, split in zip(self.prompts["prompt_id"], self.prompts["split"], strict=True)
            if split == "exploration"
        }
