"""divrl.fileio.atomic_path: a whole file or none, for writers that want a path."""

from __future__ import annotations

import pytest

from divrl.fileio import atomic_path


def test_the_target_is_replaced_only_when_the_block_ends_well(tmp_path):
    out = tmp_path / "rows.parquet"
    out.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed while writing")
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    with atomic_path(out) as tmp:
        assert tmp.parent == out.parent and tmp.suffix == ".parquet" and not tmp.exists()
        tmp.write_text("new")
        assert out.read_text() == "old"  # nothing changes before the block ends
    assert out.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_replace_false_keeps_a_file_that_appeared_meanwhile(tmp_path):
    out = tmp_path / "rows.jsonl"
    with atomic_path(out, replace=False) as tmp:
        tmp.write_text("mine")
    assert out.read_text() == "mine"
    with pytest.raises(FileExistsError), atomic_path(out, replace=False) as tmp:
        tmp.write_text("second")
    assert out.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
