import math

import numpy as np

from divrl.evaluation.runner import write_jsonl
from experiments.diversity_measures import eval_table, spearman, table


def test_spearman_uses_average_ranks_and_is_nan_for_a_constant():
    assert spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == 1.0
    assert spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == -1.0
    assert math.isclose(
        spearman(np.array([1, 1, 2, 3]), np.array([1, 2, 3, 4])), 0.9486832980505138
    )
    assert math.isnan(spearman(np.array([1, 1, 1]), np.array([1, 2, 3])))


def test_table_has_one_row_per_world_temperature_and_set(tmp_path):
    rows = []
    for i, texts in enumerate(
        (["SELECT COUNT(*) FROM t"] * 2, ["SELECT 1", "WITH s AS (SELECT 1) SELECT * FROM s"])
    ):
        rows.append(
            {
                "id": str(i),
                "data_source": "toy_sql",
                "texts": texts,
                "styles": ["count(*)"] * 2 if i == 0 else ["plain", "cte"],
                "correct": [True, False],
                "clusters": [0, 0] if i == 0 else [0, 1],
                "distinct_correct_answers": 1,
            }
        )
    path = tmp_path / "sql" / "T1.0" / "test"
    path.mkdir(parents=True)
    write_jsonl(rows, path / "results.jsonl")
    lines = table(tmp_path)
    assert len(lines) == 3
    # styles 1.5 per prompt; trace clusters 1 and 2; rank correlation 1; no math trace style
    assert lines[2].startswith("| sql | 1.0 | test | 1.50 | 1.50 | 1.00 |")
    assert lines[2].endswith("| - |")

    # the same results as two models' divrl eval folders: one row per set and model
    rows_by_model = eval_table(
        {"base": tmp_path / "sql" / "T1.0", "again": tmp_path / "sql" / "T1.0"}
    )
    assert [r.split(" | ")[:2] for r in rows_by_model[2:]] == [
        ["| test", "base"],
        ["| test", "again"],
    ]


def test_samples_are_reused_only_with_the_same_prompts_and_n(tmp_path):
    import pytest

    from experiments.diversity_measures import _check_settings
    from experiments.records import ResultError

    _check_settings(tmp_path, {"prompts": 48, "n": 16})
    _check_settings(tmp_path, {"prompts": 48, "n": 16})  # the same: reused
    with pytest.raises(ResultError, match=r"other settings \(n: 16 there, 8 now\)"):
        _check_settings(tmp_path, {"prompts": 48, "n": 8})
