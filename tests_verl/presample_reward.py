"""A test-only reward for the presample through verl: full credit on the prompts whose
``extra_info.index`` ends in an even digit, none on the others, whatever the response (a
random model solves nothing, so the math verifier would leave the store empty)."""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's custom-reward signature: 1.0 for ``math-0``, ``math-2``, ...; else 0.0."""
    index = str((extra_info or {}).get("index", ""))
    score = float(index[-1:].isdigit() and int(index[-1]) % 2 == 0)
    return {"score": score, "acc": score}
