"""Agreement rates of the reward profiles with their references, on the agreement tests' cases.

Usage, from any folder (so that the worker processes import the same divrl)::

    PYTHONPATH=<checkout> python <checkout>/tests/rewards/agreement_rates.py

SQL: the cases and official-rule labels of ``test_rewards_sql_agreement.py`` for ``bird``,
``spider`` and ``sql``. Math: ``math`` and ``gsm8k`` on the training-profile cases of
``test_rewards_math_agreement.py``, and ``math_verify`` (or ``math`` where that profile
does not exist, as in older versions) against math-verify itself; ``math``, ``gsm8k`` and
``math_verify`` against the hand-labelled set of ``math_labelled_cases.py``, per class
(``--labelled``: that set only). Only the public API is used, so the same command measures
an older checkout; ``--verbose`` lists disagreements.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import math_labelled_cases as labelled_cases
import test_rewards_math_agreement as math_tests
import test_rewards_sql_agreement as sql_tests

from divrl.rewards import ScoreRequest, registered_sources, score_batch


def _report(name: str, requests, labels, describe, verbose: bool) -> None:
    results = score_batch(requests, max_workers=2, timeout=60).results
    wrong = [
        describe(i)
        for i, (label, r) in enumerate(zip(labels, results, strict=True))
        if (r.score == 1.0) != bool(label)
    ]
    print(f"{name}: {len(labels)} cases, agreement {1 - len(wrong) / len(labels):.4f}")
    for line in wrong if verbose else []:
        print(f"  disagree {line}")


def labelled(verbose: bool) -> None:
    """Each math profile against the labelled set (math/gsm8k: column 3, math_verify: 4)."""
    cases = labelled_cases.LABELLED
    for source, column in (("math", 3), ("gsm8k", 3), ("math_verify", 4)):
        requests = [ScoreRequest(source, c[1], c[2]) for c in cases]
        results = score_batch(requests, max_workers=2, timeout=60).results
        agree = [(r.score == 1.0) == bool(c[column]) for c, r in zip(cases, results, strict=True)]
        per_class = []
        for cls in labelled_cases.CLASSES:
            rows = [a for c, a in zip(cases, agree, strict=True) if c[0] == cls]
            per_class.append(f"{cls} {sum(rows)}/{len(rows)}")
        print(f"{source} labelled: {len(cases)} cases, agreement {sum(agree) / len(cases):.4f}")
        print("  " + ", ".join(per_class))
        for c, a in zip(cases, agree, strict=True):
            if verbose and not a:
                print(f"  disagree [{c[0]}] {c[1]!r} gold {c[2]!r} label {c[column]}")


def main(verbose: bool) -> None:
    db = sql_tests.build_db(Path(tempfile.mkdtemp()) / "agree.sqlite")
    cases = list(sql_tests._cases())
    for profile in ("bird", "spider", "sql"):
        labels = [sql_tests.official_label(profile, db, g, p, o) for g, p, o, _, _ in cases]
        requests = [ScoreRequest(profile, text, g, {"db_path": db}) for g, _, _, _, text in cases]
        _report(profile, requests, labels, lambda i: f"[{cases[i][3]}] {cases[i][1]}", verbose)

    training = math_tests.training_cases()
    for source in ("math", "gsm8k"):
        requests = [ScoreRequest(source, c, g) for c, g, _ in training]
        labels = [label for _, _, label in training]
        _report(source, requests, labels, lambda i: repr(training[i][:2]), verbose)
    source = "math_verify" if "math_verify" in registered_sources() else "math"
    labels = [math_tests.math_verify_label(c, g) for c, g in math_tests.CASES]
    requests = [ScoreRequest(source, c, g) for c, g in math_tests.CASES]
    _report(
        f"{source} vs math-verify", requests, labels, lambda i: repr(math_tests.CASES[i]), verbose
    )


if __name__ == "__main__":
    if "--labelled" not in sys.argv[1:]:
        main("--verbose" in sys.argv[1:])
    labelled("--verbose" in sys.argv[1:])
