"""`divrl data check`: a good file gives exit 0 and its summary; each class of bad file
gives exit 2 and one line naming the problem (docs/data.md, "Checking a file")."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

import divrl
from divrl.cli import main

TOY_MODEL = str(Path(divrl.__file__).parent / "toy" / "pretrained")


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def shop(tmp_path) -> Path:
    db = tmp_path / "shop.sqlite"
    connection = sqlite3.connect(db)
    connection.execute("CREATE TABLE t (x INTEGER)")
    connection.execute("INSERT INTO t VALUES (1), (2)")
    connection.commit()
    connection.close()
    return db


def _math(i: str, question: str = "What is 3 + 4?", answer: str = "7") -> dict:
    return {"id": i, "question": question, "answer": answer}


def _sql(i: str, gold: str, db: str = "shop.sqlite") -> dict:
    return {"id": i, "question": "How many?", "answer": gold, "data_source": "sql", "db_path": db}


def _check(capsys, *argv) -> tuple[int, list[str], list[str]]:
    code = main(["data", "check", *map(str, argv)])
    captured = capsys.readouterr()
    lines = [x.strip() for x in captured.out.splitlines()]
    problems = [x for x in captured.err.splitlines() if x.startswith("divrl data check: ")]
    return code, lines, problems


def test_a_good_file_passes_with_its_summary(tmp_path, shop, capsys):
    rows = [_math("a"), _math("b", "What is 1/2 of 1?", "\\frac{1}{2}"), _sql("s", "SELECT 1")]
    data = _write(tmp_path / "good.jsonl", rows)
    code, lines, problems = _check(capsys, data, f"model.path={TOY_MODEL}")
    assert (code, problems) == (0, [])
    assert "rows: 3 read, 3 valid (math 2, sql 1)" in lines
    assert "databases: 1 found, 1 opened read-only (1 table(s))" in lines
    assert "answers: 3 of 3 usable" in lines
    assert any(
        x.startswith("over the limit: 0 of 3") and x.endswith("3 prompts would train")
        for x in lines
    )
    assert lines[-1] == "ok"


def test_without_a_model_lengths_are_said_to_be_unchecked(tmp_path, capsys):
    code, lines, _ = _check(capsys, _write(tmp_path / "d.jsonl", [_math("a")]))
    assert code == 0
    assert any(x.startswith("prompt lengths: not checked") for x in lines)
    # the loader's warnings are quiet during the check only, not for the rest of the process
    assert logging.getLogger("divrl.data.loading").level == logging.NOTSET


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([_math("a"), _math("b", answer="")], "row 2: field 'answer': empty"),
        (
            [_math("a"), {"id": "b", "question": "q", "answer": "1", "data_source": "nosuch"}],
            "row 2: field 'data_source': unknown data_source 'nosuch'",
        ),
        ([_math("a"), _math("a", "Another?")], "id 'a' is used by rows 1, 2"),
        (
            [_sql("s", "SELECT 1", db="gone.sqlite")],
            "field 'extra_info.db_path': database not found",
        ),
        (
            [_sql("s", "SELECT nope FROM missing")],
            "row id 's': ground truth 'SELECT nope FROM missing'",
        ),
    ],
    ids=["empty-answer", "unknown-source", "duplicate-id", "missing-database", "failing-gold"],
)
def test_each_bad_row_is_one_line_and_exit_2(tmp_path, shop, capsys, rows, expected):
    code, _, problems = _check(capsys, _write(tmp_path / "bad.jsonl", rows))
    assert code == 2
    assert [p for p in problems if expected in p], problems
    assert problems[-1].endswith("problem line(s)")


def test_lengths_follow_the_truncation_setting(tmp_path, capsys):
    long = "What is " + " plus ".join(["3"] * 40) + "?"
    data = _write(tmp_path / "d.jsonl", [_math("a"), _math("b", long)])
    model = f"model.path={TOY_MODEL}"
    code, lines, problems = _check(capsys, data, model, "data.max_prompt_length=32")
    assert code == 2 and any(
        "1 prompts are longer than data.max_prompt_length=32" in p for p in problems
    )
    code, lines, _ = _check(
        capsys, data, model, "data.max_prompt_length=32", "data.truncation=drop"
    )
    assert (
        code == 0
        and "over the limit: 1 of 2 (dropped, data.truncation=drop); 1 prompts would train" in lines
    )
    code, lines, _ = _check(
        capsys, data, model, "data.max_prompt_length=32", "data.truncation=left"
    )
    assert code == 0 and any(x.endswith("2 prompts would train") for x in lines)
    code, _, problems = _check(
        capsys, data, model, "data.max_prompt_length=8", "data.truncation=drop"
    )
    assert code == 2 and any("no prompt would train" in p for p in problems)


def test_a_missing_chat_template_is_a_problem_line(tmp_path, capsys):
    data = _write(tmp_path / "d.jsonl", [_math("a")])
    code, _, problems = _check(capsys, data, f"model.path={TOY_MODEL}", "data.template=chat")
    assert code == 2 and any("has no chat template" in p for p in problems)


def test_without_a_file_the_configs_train_path_is_checked(tmp_path, capsys):
    data = _write(tmp_path / "mine.jsonl", [_math("a"), {"id": "b", "question": "?"}])
    config = tmp_path / "mine.yaml"
    config.write_text(f"data:\n  train_path: {data}\n")
    code, lines, problems = _check(capsys, "--config", config)
    assert code == 2 and lines[0] == f"{data}:"
    assert "rows: 2 read, 1 valid (math 1)" in lines
    # overrides alone (no FILE) are overrides, not a file name
    code, lines, _ = _check(capsys, "--config", config, f"model.path={TOY_MODEL}")
    assert lines[0] == f"{data}:" and any(x.startswith("over the limit:") for x in lines)
    # neither a FILE nor data.train_path: one line saying what to pass
    code, _, problems = _check(capsys)
    assert code == 2 and problems == [
        "divrl data check: no file to check: name one (divrl data check FILE) or pass a "
        "--config that sets data.train_path"
    ]
