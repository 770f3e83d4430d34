"""``divrl data index``: a copy of a verl data file with ``extra_info.index`` on every row
(the presample through verl's prompt id), the other columns as read, duplicates refused."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from divrl.cli import main
from divrl.data import fixture_path, load_examples
from divrl.integrations.verl.data import assign_indexes


def _rows(n: int = 4) -> list[dict]:
    """The math fixture's first rows (chat prompts, nested reward_model), without indexes."""
    rows = [json.loads(line) for line in fixture_path("math.jsonl").read_text().splitlines()[:n]]
    for row in rows:
        del row["extra_info"]["index"]
    return rows


def _write_parquet(rows, path):
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_missing_indexes_are_the_row_numbers_and_the_rest_is_kept(tmp_path):
    src = _write_parquet(_rows(), tmp_path / "train.parquet")
    before = src.read_bytes()
    out = tmp_path / "indexed.parquet"
    assert main(["data", "index", str(src), "--out", str(out)]) == 0
    assert src.read_bytes() == before  # the user's file is left as it is
    got, original = pq.read_table(out).to_pylist(), pq.read_table(src).to_pylist()
    assert [r["extra_info"]["index"] for r in got] == [0, 1, 2, 3]
    for new, old in zip(got, original, strict=True):
        assert new["extra_info"]["split"] == old["extra_info"]["split"]
        assert {k: v for k, v in new.items() if k != "extra_info"} == {
            k: v for k, v in old.items() if k != "extra_info"
        }
    # divrl's own reading names each row as verl's index does (the exploration split's ids)
    assert [ex.id for ex in load_examples(out)] == ["0", "1", "2", "3"]
    # an existing output is kept without --overwrite
    assert main(["data", "index", str(src), "--out", str(out)]) == 2


def test_an_id_column_is_the_index_and_given_indexes_are_kept(tmp_path):
    rows = _rows(3)
    for i, row in enumerate(rows):
        row["id"] = f"q{i}"
    rows[1]["extra_info"]["index"] = "given"
    rows[0]["extra_info"]["index"] = None
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows_n, assigned = assign_indexes(src, tmp_path / "out.jsonl")
    assert (rows_n, assigned) == (3, 2)
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["extra_info"]["index"] for r in got] == ["q0", "given", "q2"]
    assert [r["prompt"] for r in got] == [r["prompt"] for r in rows]


def test_numbers_beside_given_ids_become_strings(tmp_path):
    rows = _rows(2)
    rows[1]["extra_info"]["index"] = "math-1"
    assign_indexes(_write_parquet(rows, tmp_path / "a.parquet"), tmp_path / "b.parquet")
    assert [
        r["extra_info"]["index"] for r in pq.read_table(tmp_path / "b.parquet").to_pylist()
    ] == [
        "0",
        "math-1",
    ]


def test_shared_indexes_are_refused_naming_the_rows(tmp_path, capsys):
    rows = _rows(3)
    rows[0]["extra_info"]["index"] = "a"
    rows[2]["extra_info"]["index"] = "a"
    src = _write_parquet(rows, tmp_path / "dup.parquet")
    out = tmp_path / "out.parquet"
    assert main(["data", "index", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "rows 0 and 2 of" in err and "share extra_info.index 'a'" in err
    assert not out.exists()
    # an assigned row number that another row already has is refused alike
    rows = _rows(2)
    rows[1]["extra_info"]["index"] = 0
    with pytest.raises(ValueError, match=r"rows 0 and 1 of .* share extra_info.index '0'"):
        assign_indexes(_write_parquet(rows, tmp_path / "c.parquet"), out)
