"""BIRD and Spider converters on tiny fixture trees in the official layouts."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from divrl.data import DataValidationError, load_examples, write_examples
from divrl.data.converters import bird, spider
from divrl.rewards import compute_score_detailed


def _make_db(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE singer(id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER);
        INSERT INTO singer VALUES (1,'Joe Sharp','Netherlands',52),(2,'Timbaland','United States',32),
            (3,'Justin','France',29),(4,'Rose','France',41);
        CREATE TABLE concert(id INTEGER, singer_id INTEGER REFERENCES singer(id), year TEXT);
        INSERT INTO concert VALUES (1,1,'2014'),(2,3,'2015');
        """
    )
    conn.commit()
    conn.close()


@pytest.fixture
def bird_tree(tmp_path):
    root = tmp_path / "bird"
    _make_db(root / "dev_databases" / "concert_singer" / "concert_singer.sqlite")
    rows = [
        {
            "question_id": 0,
            "db_id": "concert_singer",
            "question": "How many singers are from France?",
            "evidence": "France refers to country = 'France'",
            "SQL": "SELECT COUNT(*) FROM singer WHERE country = 'France'",
            "difficulty": "simple",
        },
        {
            "question_id": 1,
            "db_id": "concert_singer",
            "question": "Name the oldest singer.",
            "evidence": "",
            "SQL": "SELECT name FROM singer ORDER BY age DESC LIMIT 1",
            "difficulty": "simple",
        },
    ]
    (root / "dev.json").write_text(json.dumps(rows))
    return root


@pytest.fixture
def spider_tree(tmp_path):
    root = tmp_path / "spider"
    _make_db(root / "database" / "concert_singer" / "concert_singer.sqlite")
    rows = [
        {"db_id": "concert_singer", "question": "How many singers do we have?",
         "query": "SELECT count(*) FROM singer"},
        {"db_id": "concert_singer", "question": "Ages of singers by age.",
         "query": "SELECT age FROM singer ORDER BY age"},
        {"db_id": "concert_singer", "question": "Years of concerts.",
         "query": "SELECT year FROM concert"},
    ]  # fmt: skip
    (root / "dev.json").write_text(json.dumps(rows))
    (root / "train_spider.json").write_text(json.dumps(rows[:1]))
    return root


def test_bird_dev_rows_hold_schema_examples_evidence_and_question(bird_tree):
    examples = bird.convert(bird_tree, "dev", template=None, limit=None, seed=0)
    assert [e.data_source for e in examples] == ["bird", "bird"]
    text = examples[0].prompt[0]["content"]
    assert "CREATE TABLE singer" in text and "CREATE TABLE concert" in text
    assert "'Joe Sharp'" in text  # example values
    assert "country = 'France'" in text  # the evidence
    assert "How many singers are from France?" in text
    assert "External knowledge" not in examples[1].prompt[0]["content"]  # empty evidence
    db = examples[0].extra_info["db_path"]
    assert Path(db).is_absolute() and db.endswith("concert_singer.sqlite")
    # the gold scores itself 1 under the bird profile
    e = examples[0]
    r = compute_score_detailed(
        e.data_source, f"```sql\n{e.ground_truth}\n```", e.ground_truth, e.extra_info
    )
    assert r.reason == "correct"


def test_spider_splits_template_and_limit(spider_tree):
    dev = spider.convert(spider_tree, "dev", template=None, limit=None, seed=0)
    assert len(dev) == 3 and dev[1].ground_truth == "SELECT age FROM singer ORDER BY age"
    assert {e.data_source for e in dev} == {"spider"}
    train = spider.convert(spider_tree, "train", template="Q: {question}", limit=None, seed=0)
    assert train[0].prompt[0]["content"] == "Q: How many singers do we have?"
    two = spider.convert(spider_tree, "dev", template=None, limit=2, seed=3)
    assert len(two) == 2
    assert [e.id for e in two] == [
        e.id for e in spider.convert(spider_tree, "dev", template=None, limit=2, seed=3)
    ]


def test_converted_rows_round_trip_through_the_loader(spider_tree, tmp_path):
    examples = spider.convert(spider_tree, "dev", template=None, limit=None, seed=0)
    out = tmp_path / "spider_dev.jsonl"
    write_examples(examples, out)
    loaded = load_examples(out)
    assert [e.ground_truth for e in loaded] == [e.ground_truth for e in examples]
    assert loaded[0].extra_info["db_path"] == examples[0].extra_info["db_path"]


def test_layout_errors_name_the_file_and_field(bird_tree, spider_tree):
    with pytest.raises(FileNotFoundError, match=r"^file not found: .*train\.json") as missing:
        bird.convert(bird_tree, "train", template=None, limit=None, seed=0)
    assert "row 0" not in str(missing.value)
    rows = json.loads((bird_tree / "dev.json").read_text())
    del rows[1]["SQL"]
    (bird_tree / "dev.json").write_text(json.dumps(rows))
    with pytest.raises(DataValidationError, match=r"dev\.json: row 2: field 'SQL'"):
        bird.convert(bird_tree, "dev", template=None, limit=None, seed=0)
    rows = json.loads((spider_tree / "dev.json").read_text())
    rows[0]["db_id"] = "nowhere"
    (spider_tree / "dev.json").write_text(json.dumps(rows))
    with pytest.raises(DataValidationError, match=r"row 1: field 'db_id': no database"):
        spider.convert(spider_tree, "dev", template=None, limit=None, seed=0)
    with pytest.raises(ValueError, match="Spider split"):
        spider.convert(spider_tree, "test", template=None, limit=None, seed=0)


def test_a_non_sqlite_database_file_is_refused(bird_tree):
    db = bird_tree / "dev_databases" / "concert_singer" / "concert_singer.sqlite"
    db.write_text("root:x:0:0::/root:/bin/sh\n")
    with pytest.raises(DataValidationError, match="not an SQLite 3 database"):
        bird.convert(bird_tree, "dev", template=None, limit=None, seed=0)


def test_loader_refuses_a_non_sqlite_db_path(tmp_path):
    fake = tmp_path / "passwd.sqlite"
    fake.write_text("root:x:0:0::/root:/bin/sh\n")
    row = {"prompt": "q", "data_source": "sql", "reward_model": {"ground_truth": "SELECT 1"},
           "extra_info": {"db_path": str(fake)}}  # fmt: skip
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataValidationError, match="not an SQLite 3 database"):
        load_examples(data)


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", ["spider", "bird"])
def test_converted_sql_rows_train_two_steps(benchmark, request, tmp_path):
    """The converted file goes straight into `divrl train` (tiny model, real SQL verifier)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
    from train_helpers import build_tiny_lm, tiny_overrides

    from divrl.cli import main

    converter, tree = {"spider": spider, "bird": bird}[benchmark], f"{benchmark}_tree"
    examples = converter.convert(
        request.getfixturevalue(tree), "dev", template="Q:{question}=", limit=None, seed=0
    )
    assert {e.data_source for e in examples} == {benchmark}
    data = tmp_path / f"{benchmark}_dev.jsonl"
    write_examples(examples, data)
    world = {"model": str(build_tiny_lm(tmp_path / "model")), "data": str(data)}
    overrides = tiny_overrides(
        world, tmp_path / "run", **{"train.total_steps": 2, "train.prompts_per_step": 2}
    )
    assert main(["train", *overrides]) == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/score" in r] == [1, 2]
