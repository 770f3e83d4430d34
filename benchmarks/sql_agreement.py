"""Agreement of SQL verdicts with the official rules, per profile (docs/rewards.md).

Usage: ``PYTHONPATH=<checkout> python benchmarks/sql_agreement.py``: uses the cases and
labels of tests/rewards/test_rewards_sql_agreement.py with whatever divrl is first on the
path (only the public API), so the same command measures an older version.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from divrl.rewards import ScoreRequest, score_batch

_TEST = Path(__file__).resolve().parents[1] / "tests/rewards/test_rewards_sql_agreement.py"


def main() -> None:
    spec = importlib.util.spec_from_file_location("sql_agreement_cases", _TEST)
    cases_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases_mod)
    db = cases_mod.build_db(Path(tempfile.mkdtemp()) / "agree.sqlite")
    cases = list(cases_mod._cases())
    pairs = {(gold, pred) for gold, pred, *_ in cases}
    print(f"{len(pairs)} distinct (gold, prediction) pairs, {len(cases)} cases")
    for profile in ("bird", "spider", "sql"):
        labels = [cases_mod.official_label(profile, db, g, p, o) for g, p, o, _, _ in cases]
        requests = [ScoreRequest(profile, text, g, {"db_path": db}) for g, _, _, _, text in cases]
        results = score_batch(requests, max_workers=2).results
        wrong = [
            (c[3], c[1]) for c, lab, r in zip(cases, labels, results, strict=True)
            if (r.score == 1.0) != lab
        ]  # fmt: skip
        print(f"{profile}: {len(cases)} cases, agreement {1 - len(wrong) / len(cases):.3f}")
        for form, pred in wrong:
            print(f"  disagree [{form}] {pred}")


if __name__ == "__main__":
    main()
