import json
import logging
import sqlite3
from pathlib import Path

import pytest

from divrl.data import DataValidationError, Example, load_examples, write_examples

MATH_ROW = {
    "data_source": "gsm8k",
    "prompt": [{"role": "user", "content": "What is 6 * 12?"}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "72"},
    "extra_info": {"split": "train", "index": 7},
}


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def sql_dir(tmp_path):
    """A Spider-style database directory with one database, ``shop``."""
    db_dir = tmp_path / "database"
    (db_dir / "shop").mkdir(parents=True)
    conn = sqlite3.connect(db_dir / "shop" / "shop.sqlite")
    conn.execute("CREATE TABLE items (id INTEGER)")
    conn.commit()
    conn.close()
    return db_dir


def test_verl_schema_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [MATH_ROW, {**MATH_ROW, "extra_info": None}])
    examples = load_examples(path)
    assert examples[0] == Example(
        id="7",
        prompt=[{"role": "user", "content": "What is 6 * 12?"}],
        data_source="gsm8k",
        ground_truth="72",
        extra_info={"split": "train", "index": 7},
    )
    assert examples[1].id == "train-2" and examples[1].extra_info == {}


def test_flat_form_and_numeric_answers(tmp_path):
    rows = [
        {"question": "1+1?", "answer": 2},
        {"id": "q2", "question": "half?", "answer": 0.5, "data_source": "math500"},
        {"question": "text", "answer": "\\frac{1}{2}"},
    ]
    examples = load_examples(write_jsonl(tmp_path / "flat.jsonl", rows))
    assert [(e.id, e.prompt, e.data_source, e.ground_truth) for e in examples] == [
        ("flat-1", "1+1?", "math", "2"),
        ("q2", "half?", "math500", "0.5"),
        ("flat-3", "text", "math", "\\frac{1}{2}"),
    ]


@pytest.mark.parametrize(
    "row, field, message",
    [
        ({**MATH_ROW, "reward_model": {}}, "reward_model.ground_truth", "missing"),
        ({**MATH_ROW, "reward_model": {"ground_truth": None}}, "reward_model.ground_truth", "None"),
        ({**MATH_ROW, "data_source": "nope"}, "data_source", "unknown data_source"),
        ({**MATH_ROW, "prompt": []}, "prompt", "non-empty list"),
        ({**MATH_ROW, "prompt": [{"role": "user"}]}, "prompt[0]", "content"),
        ({**MATH_ROW, "extra_info": [1]}, "extra_info", "object"),
        ({"question": "q"}, "answer", "missing"),
        ({"foo": 1}, "prompt", "missing"),
        ({**MATH_ROW, "data_source": "sql"}, "extra_info.db_path", "need"),
        ("{not json", "<row>", "invalid JSON"),
        (
            {**MATH_ROW, "extra_info": {"answer_pattern": "(unclosed"}},
            "extra_info.answer_pattern",
            "not a valid regex",
        ),
        ({**MATH_ROW, "extra_info": {"answer_pattern": 7}}, "extra_info.answer_pattern", "string"),
        ("[1, 2]", "<row>", "expected an object"),
    ],
)
def test_validation_errors_name_file_row_and_field(tmp_path, row, field, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [MATH_ROW, "", row])
    with pytest.raises(DataValidationError) as info:
        load_examples(path)
    err = info.value
    # the blank line is skipped but counted: the bad row is line 3
    assert (err.path, err.row, err.field) == (str(path), 3, field)
    assert str(path) in str(err) and "row 3" in str(err) and repr(field) in str(err)
    assert message in str(err)


def test_skip_invalid_counts_and_logs(tmp_path, caplog):
    rows = [MATH_ROW, {"foo": 1}, {**MATH_ROW, "data_source": "nope"}, {**MATH_ROW, "id": 8}]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with caplog.at_level(logging.WARNING):
        examples = load_examples(path, skip_invalid=True)
    assert len(examples) == 2
    assert (examples.n_rows, examples.n_skipped) == (4, 2)
    assert "row 2" in examples.errors[0] and "row 3" in examples.errors[1]
    assert "skipped 2 invalid row(s) of 4" in caplog.text


def test_duplicate_ids_are_refused_with_the_duplicates_named(tmp_path):
    """Training splits prompts by id: two rows with one id made presample judge each row
    and training the id (near-perfect prompts were rolled out anyway)."""
    other = {"question": "q", "answer": 1}
    path = write_jsonl(tmp_path / "dup.jsonl", [MATH_ROW, other, MATH_ROW, {**other, "id": "x"}])
    path.write_text(path.read_text() + json.dumps({**other, "id": "x"}) + "\n")
    with pytest.raises(DataValidationError) as err:
        load_examples(path, skip_invalid=True)
    message = str(err.value)
    assert message.startswith(f"{path}: row 3: field 'id': 2 id(s) are used by several rows")
    assert "'7' (rows 1, 3); 'x' (rows 4, 5)" in message and "unique" in message
    assert [e.id for e in load_examples(path, limit=2)] == ["7", "dup-2"]


def test_limit(tmp_path):
    path = write_jsonl(tmp_path / "many.jsonl", [{**MATH_ROW, "id": i} for i in range(10)])
    assert len(load_examples(path, limit=3)) == 3


def test_sql_db_resolution(tmp_path, sql_dir):
    rows = [
        {
            "data_source": "spider",
            "prompt": "q",
            "reward_model": {"ground_truth": "SELECT 1"},
            "extra_info": {"db_id": "shop"},
        },
        {
            "data_source": "sql",
            "prompt": "q",
            "reward_model": {"ground_truth": "SELECT 1"},
            "extra_info": {"db_path": "shop/shop.sqlite"},
        },
        {"question": "q", "answer": "SELECT 1", "data_source": "bird", "db_id": "shop"},
    ]
    path = write_jsonl(tmp_path / "sql.jsonl", rows)
    examples = load_examples(path, db_dir=sql_dir)
    expected = str((sql_dir / "shop" / "shop.sqlite").resolve())
    assert [e.extra_info["db_path"] for e in examples] == [expected] * 3
    # relative db_path resolves against the data file's folder without db_dir
    rel = write_jsonl(sql_dir / "rel.jsonl", rows[1:2])
    assert load_examples(rel)[0].extra_info["db_path"] == expected
    with pytest.raises(DataValidationError, match="no database directory"):
        load_examples(path)
    # a db_path from another machine falls back to db_id under db_dir
    moved = {**rows[0], "extra_info": {"db_path": "/elsewhere/shop.sqlite", "db_id": "shop"}}
    moved_file = write_jsonl(tmp_path / "moved.jsonl", [moved])
    assert load_examples(moved_file, db_dir=sql_dir)[0].extra_info["db_path"] == expected
    with pytest.raises(DataValidationError, match=r"db_path'.*/elsewhere/shop.sqlite"):
        load_examples(moved_file)
    with pytest.raises(DataValidationError, match="no database for 'other'"):
        load_examples(
            write_jsonl(tmp_path / "o.jsonl", [{**rows[0], "extra_info": {"db_id": "other"}}]),
            db_dir=sql_dir,
        )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_write_then_load_round_trip(tmp_path, sql_dir, suffix):
    db = str((sql_dir / "shop" / "shop.sqlite").resolve())
    examples = [
        Example("a", "plain prompt", "math", "3", {"index": "a"}),
        Example(
            "b",
            [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
            "gsm8k",
            "\\frac{1}{2}",
            {},
        ),
        Example("c", "sql prompt", "sql", "SELECT 1", {"db_path": db, "db_id": "shop"}),
    ]
    path = write_examples(examples, tmp_path / f"out{suffix}")
    loaded = load_examples(path)
    assert [e.id for e in loaded] == ["a", "b", "c"]
    assert [e.ground_truth for e in loaded] == ["3", "\\frac{1}{2}", "SELECT 1"]
    assert loaded[1].prompt == examples[1].prompt
    assert loaded[2].extra_info == {"db_path": db, "db_id": "shop"}
    if suffix == ".jsonl":
        assert loaded[0].prompt == "plain prompt"
        row = json.loads(path.read_text().splitlines()[0])
        assert row["reward_model"] == {"style": "rule", "ground_truth": "3"}
    else:  # one prompt type per Parquet column: strings became user messages
        assert loaded[0].prompt == [{"role": "user", "content": "plain prompt"}]


def test_datasets_directory(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(
        [MATH_ROW, {**MATH_ROW, "extra_info": {"split": "train", "index": 8}}]
    )
    ds.save_to_disk(str(tmp_path / "ds"))
    examples = load_examples(tmp_path / "ds")
    assert [e.id for e in examples] == ["7", "8"]
    assert examples[0].prompt == MATH_ROW["prompt"]
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match="DatasetDict"):
        load_examples(tmp_path / "dd")


def test_unsupported_format_and_missing_file(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported data format"):
        load_examples(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError):
        load_examples(tmp_path / "none.jsonl")
