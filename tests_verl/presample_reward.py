"""A test-only reward for the presample through verl: full credit on two named prompts,
none on the others, whatever the response (a random model solves nothing, so the math
verifier would leave the store empty)."""

from __future__ import annotations

NEAR_PERFECT = ("math-0", "math-2")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's custom-reward signature: 1.0 for ``math-0`` and ``math-2``; else 0.0."""
    score = float(str((extra_info or {}).get("index")) in NEAR_PERFECT)
    return {"score": score, "acc": score}
