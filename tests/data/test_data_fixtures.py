import subprocess
import sys
from pathlib import Path

import pytest

from divrl.data import FIXTURES_DIR, fixture_path, load_examples
from divrl.rewards import ScoreRequest, score_batch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_fixtures.py"


def test_fixture_set_is_small_and_complete():
    files = [p for p in FIXTURES_DIR.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 300 * 1024
    for name in (
        "math.jsonl",
        "math_flat.jsonl",
        "sql.jsonl",
        "math_completions.jsonl",
        "sql_completions.jsonl",
        "databases/shop.sqlite",
    ):
        assert fixture_path(name).is_file()
    with pytest.raises(FileNotFoundError, match="available"):
        fixture_path("nope.jsonl")


@pytest.mark.skipif(not SCRIPT.exists(), reason="script not in this checkout")
def test_generator_is_deterministic_and_matches_shipped_files(tmp_path):
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, capture_output=True
    )
    for shipped in FIXTURES_DIR.rglob("*"):
        if shipped.is_file():
            rebuilt = tmp_path / shipped.relative_to(FIXTURES_DIR)
            assert rebuilt.read_bytes() == shipped.read_bytes(), shipped.name


def test_fixtures_load_and_gold_answers_score_one():
    math = load_examples(fixture_path("math.jsonl"))
    flat = load_examples(fixture_path("math_flat.jsonl"))
    sql = load_examples(fixture_path("sql.jsonl"))
    assert len(math) == len(flat) >= 10 and len(sql) >= 9
    assert [e.id for e in math] == [e.id for e in flat]
    assert len({e.extra_info["db_id"] for e in sql}) == 3
    requests = [
        ScoreRequest(e.data_source, f"\\boxed{{{e.ground_truth}}}", e.ground_truth) for e in math
    ]
    requests += [
        ScoreRequest(e.data_source, e.ground_truth, e.ground_truth, e.extra_info) for e in sql
    ]
    batch = score_batch(requests)
    assert batch.scores == [1.0] * len(requests), batch.failures
