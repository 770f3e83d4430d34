"""Fixtures shared by the evaluation tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_hand_samples() -> Callable[..., None]:
    """Writes ``<folder>/samples.jsonl`` by hand for two math fixture prompts, as ``divrl
    eval`` would have sampled them: each prompt's samples follow ``pattern`` ("r" = the
    right boxed answer, "w" = a wrong one), and the greedy answer is right. Used to score
    with ``--reuse`` without a model."""
    from divrl.data import fixture_path, load_examples
    from divrl.evaluation.runner import write_jsonl

    def write(folder: Path, pattern: str = "rw", nll: float = 1.0) -> None:
        records = []
        for ex in load_examples(fixture_path("math.jsonl"), limit=2):
            text = {"r": f"\\boxed{{{ex.ground_truth}}}", "w": "\\boxed{-12345}"}
            samples = [
                {"text": text[c], "n_tokens": 3, "nll": nll, "truncated": False} for c in pattern
            ]
            records.append(
                {
                    "id": ex.id,
                    "data_source": ex.data_source,
                    "prompt": "p",
                    "ground_truth": ex.ground_truth,
                    "extra_info": ex.extra_info,
                    "samples": samples,
                    "greedy": {"text": text["r"], "n_tokens": 3, "truncated": False},
                }
            )
        folder.mkdir(parents=True, exist_ok=True)
        write_jsonl(records, folder / "samples.jsonl")

    return write
