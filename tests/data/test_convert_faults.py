"""`divrl data convert` under hostile input: it never overwrites its source or an existing
file without --overwrite, a db_id never reaches a database outside --src, and bad fields,
templates and databases are one error naming the file and the field
(docs/reliability.md, "Converters")."""

from __future__ import annotations

import json

import pytest
from test_convert_math import make_math500
from test_convert_sql import _make_db

from divrl.cli import main
from divrl.data import DataValidationError, load_examples
from divrl.data.converters import bird, get_converter, spider


def _bird(root, **row):
    _make_db(root / "dev_databases" / "concert_singer" / "concert_singer.sqlite")
    base = {"db_id": "concert_singer", "question": "How many?", "evidence": "", "SQL": "SELECT 1"}
    (root / "dev.json").write_text(json.dumps([{**base, **row}]))
    return root


def _spider(root, db_id):
    _make_db(root / "database" / "concert_singer" / "concert_singer.sqlite")
    row = {"db_id": db_id, "question": "How many?", "query": "SELECT 1"}
    (root / "dev.json").write_text(json.dumps([row]))
    return root


def _convert(capsys, *argv):
    code = main(["data", "convert", *argv])
    return code, capsys.readouterr()


# ------------------------------------------------------------------ --out


def test_out_never_replaces_the_source_file(tmp_path, capsys):
    src = make_math500(tmp_path / "m500")
    source = src / "test.jsonl"
    before = source.read_bytes()
    link = tmp_path / "link.jsonl"
    link.symlink_to(source)
    for out in (source, link, src / ".." / "m500" / "test.jsonl"):
        for extra in ((), ("--overwrite",)):
            code, cap = _convert(
                capsys, "math", "--src", str(src), "--split", "test", "--out", str(out), *extra
            )
            assert code == 2 and "a file of the benchmark's folder --src" in cap.err
    assert source.read_bytes() == before


def test_an_existing_out_needs_overwrite(tmp_path, capsys):
    src = make_math500(tmp_path / "m500")
    out = tmp_path / "rows.jsonl"
    out.write_text("my file\n")
    argv = ("math", "--src", str(src), "--split", "test", "--out", str(out))
    code, cap = _convert(capsys, *argv)
    assert code == 2 and f"--out {out} exists; pass --overwrite" in cap.err
    assert out.read_text() == "my file\n"
    code, cap = _convert(capsys, *argv, "--overwrite")
    assert code == 0 and len(load_examples(out)) == 2


# ------------------------------------------------------------------ db_id


@pytest.mark.parametrize("db_id", ["/etc/secret", "../../outside", "concert_singer/../x", ".."])
def test_a_db_id_that_is_a_path_is_refused(tmp_path, db_id):
    src = _spider(tmp_path / "spider", db_id)
    with pytest.raises(
        DataValidationError,
        match=r"row 1: field 'db_id': .*must be a database name|is not a database name",
    ):
        spider.convert(src, "dev", template=None, limit=None, seed=0)


def test_a_database_linked_from_outside_src_is_refused(tmp_path):
    outside = tmp_path / "private" / "p.sqlite"
    _make_db(outside)
    src = _spider(tmp_path / "spider", "linked")
    (src / "database" / "linked").mkdir()
    (src / "database" / "linked" / "linked.sqlite").symlink_to(outside)
    with pytest.raises(DataValidationError, match=rf"resolves to {outside}, outside --src"):
        spider.convert(src, "dev", template=None, limit=None, seed=0)
    # a link that stays inside --src is followed
    (src / "database" / "twin").mkdir()
    inside = src / "database" / "concert_singer" / "concert_singer.sqlite"
    (src / "database" / "twin" / "twin.sqlite").symlink_to(inside)
    (src / "dev.json").write_text(
        json.dumps([{"db_id": "twin", "question": "q", "query": "SELECT 1"}])
    )
    (example,) = spider.convert(src, "dev", template=None, limit=None, seed=0)
    assert example.extra_info["db_path"] == str(inside.resolve())


# ------------------------------------------------------------------ fields, templates, files


def test_bird_evidence_that_is_not_a_string_names_the_field(tmp_path):
    src = _bird(tmp_path / "bird", evidence=["a", "list"])
    with pytest.raises(
        DataValidationError, match=r"dev\.json: row 1: field 'evidence': must be a string"
    ):
        bird.convert(src, "dev", template=None, limit=None, seed=0)
    (tmp_path / "b2").mkdir()
    src = _bird(tmp_path / "b2", evidence=None)
    assert len(bird.convert(src, "dev", template=None, limit=None, seed=0)) == 1


def test_an_sql_template_with_an_unknown_field_names_the_fields(tmp_path, capsys):
    src = _bird(tmp_path / "bird")
    code, cap = _convert(
        capsys, "bird", "--src", str(src), "--split", "dev", "--out", str(tmp_path / "o.jsonl"),
        "--template", "{schema} {sql_hint}",
    )  # fmt: skip
    assert code == 2 and "dev.json" in cap.err
    assert "available fields: {schema}, {evidence}, {question}" in cap.err
    assert "Traceback" not in cap.err


def test_a_damaged_sqlite_file_names_the_row_and_the_database(tmp_path):
    src = _bird(tmp_path / "bird")
    db = src / "dev_databases" / "concert_singer" / "concert_singer.sqlite"
    data = db.read_bytes()
    db.write_bytes(data[:100] + b"\x00" * 50 + data[150:])  # the header survives
    with pytest.raises(DataValidationError, match=rf"row 1: field 'db_id': {db}: damaged"):
        bird.convert(src, "dev", template=None, limit=None, seed=0)


def test_math500_repeating_a_unique_id_gets_unique_ids(tmp_path):
    src = make_math500(tmp_path / "m500")
    rows = (src / "test.jsonl").read_text().splitlines()
    (src / "test.jsonl").write_text("\n".join([*rows, rows[0], rows[0]]) + "\n")
    ids = [e.id for e in get_converter("math").convert(src, "test")]
    assert ids == [
        "test/algebra/1.json",
        "test/algebra/2.json",
        "test/algebra/1.json#3",
        "test/algebra/1.json#4",
    ]


def test_a_non_utf8_math_line_names_the_line(tmp_path):
    src = make_math500(tmp_path / "m500")
    with (src / "test.jsonl").open("ab") as f:
        f.write(b'{"problem": "\xff", "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"test\.jsonl: line 3: invalid UTF-8 at byte column 14"):
        get_converter("math").convert(src, "test")


def test_a_non_utf8_gsm8k_line_names_the_file_and_line(tmp_path):
    src = tmp_path / "gsm8k"
    src.mkdir()
    good = json.dumps({"question": "1+1?", "answer": "2 #### 2"}).encode()
    (src / "test.jsonl").write_bytes(
        good + b"\n" + b'{"question": "caf\xe9", "answer": "#### 1"}\n'
    )
    with pytest.raises(ValueError, match=r"test\.jsonl: line 2: invalid UTF-8 at byte column 18"):
        get_converter("gsm8k").convert(src, "test")


def test_a_template_file_that_is_not_utf8_is_one_error(tmp_path, capsys):
    src = make_math500(tmp_path / "m500")
    template = tmp_path / "t.txt"
    template.write_bytes(b"{problem} caf\xe9")
    out = tmp_path / "o.jsonl"
    code, cap = _convert(
        capsys, "math", "--src", str(src), "--split", "test", "--out", str(out),
        "--template", f"@{template}",
    )  # fmt: skip
    assert code == 2 and f"--template @{template}: cannot read it as UTF-8 text" in cap.err
    assert "Traceback" not in cap.err and not out.exists()
