"""A test-only reward for the end-to-end runs: a score that differs between the samples of
one prompt, so GRPO's advantages are not all zero on a random model (the math verifier
scores every random string 0, which leaves nothing for the loss to compare)."""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's custom-reward signature: ``(distinct characters mod 4) / 3``, in [0, 1]."""
    score = (len(set(solution_str)) % 4) / 3
    return {"score": score, "acc": float(score == 1.0)}
