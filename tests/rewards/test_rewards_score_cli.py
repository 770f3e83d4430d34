import json

import pytest

from divrl.cli import main
from divrl.data import fixture_path


def test_score_command_on_fixtures(tmp_path, capsys):
    out = tmp_path / "scored.jsonl"
    rc = main(
        [
            "score",
            "--data",
            str(fixture_path("sql.jsonl")),
            "--completions",
            str(fixture_path("sql_completions.jsonl")),
            "--out",
            str(out),
            "--timeout",
            "2",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "mean score: 0.2500" in text
    assert "failures: forbidden=10, sql_error=10" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 10
    assert rows[0]["id"] == "sql-0"
    assert rows[0]["scores"] == [1.0, 0.0, 0.0, 0.0]
    assert rows[0]["reasons"] == ["correct", "wrong", "forbidden", "sql_error"]
    assert rows[0]["score"] == 0.25


def test_score_command_single_completion_and_errors(tmp_path, capsys):
    comps = tmp_path / "c.jsonl"
    comps.write_text(
        json.dumps({"id": "math-0", "completion": "\\boxed{85}"})
        + "\n"
        + json.dumps({"id": "math-1", "completion": "\\boxed{7}"})
        + "\n"
    )
    out = tmp_path / "o.jsonl"
    data = str(fixture_path("math.jsonl"))
    assert main(["score", "--data", data, "--completions", str(comps), "--out", str(out)]) == 0
    assert "mean score: 0.5000" in capsys.readouterr().out
    assert [json.loads(x)["scores"] for x in out.read_text().splitlines()] == [[1.0], [0.0]]

    # a malformed completions file: one paragraph naming file and line, exit 2, no traceback
    for text, says in (
        (json.dumps({"id": "nope", "completion": "1"}), "line 1: id 'nope' is not in"),
        ('{"id": "math-0", "completion": "caf\udce9"}', "line 1: invalid UTF-8 (byte 0xe9 at byte"),
        ("", "no rows: nothing to score"),
        (json.dumps({"id": "math-0", "completions": []}), "rows whose completion lists are all"),
        (json.dumps({"completion": "1"}), "line 1: field 'id': missing"),
        ("not json", "line 1: invalid JSON"),
        (
            json.dumps({"id": "math-0", "completion": 5}),
            "line 1: field 'completion(s)': need a string",
        ),
    ):
        comps.write_bytes((text + "\n").encode("utf-8", "surrogateescape"))
        capsys.readouterr()
        assert main(["score", "--data", data, "--completions", str(comps)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"divrl score: {comps}: {says}"), err
        assert "Traceback" not in err


def test_a_json_data_file_that_does_not_read_is_one_line(tmp_path, capsys):
    """A .json --data with bad JSON, bytes that are not UTF-8 or no list was a traceback (the
    .jsonl paths gave one line); a byte-order mark in front of the list is read."""
    rows = [json.loads(x) for x in fixture_path("math.jsonl").read_text().splitlines()[:2]]
    comps = tmp_path / "c.jsonl"
    comps.write_text(json.dumps({"id": "math-0", "completion": "\\boxed{85}"}) + "\n")
    data = tmp_path / "d.json"
    for raw, says in (
        (b"[" + json.dumps(rows[0]).encode() + b",", "invalid JSON at line 1 column"),
        (
            b'[{"prompt": "caf\xe9"}]',
            "invalid UTF-8 (invalid continuation byte) at byte 17 (line 1)",
        ),
        (
            json.dumps({"rows": rows}).encode(),
            "a .json data file must hold a JSON list of rows, not a dict",
        ),
    ):
        data.write_bytes(raw)
        assert main(["score", "--data", str(data), "--completions", str(comps)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"divrl score: {data}: {says}"), err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    data.write_bytes(b"\xef\xbb\xbf" + json.dumps(rows).encode())
    assert main(["score", "--data", str(data), "--completions", str(comps)]) == 0
    assert "mean score: 1.0000" in capsys.readouterr().out


def test_score_command_skip_invalid(tmp_path, capsys):
    from divrl.data import DataValidationError

    rows = fixture_path("math.jsonl").read_text().splitlines()[:2]
    data = tmp_path / "d.jsonl"
    data.write_text(rows[0] + "\n" + '{"question": "no answer"}\n' + rows[1] + "\n")
    comps = tmp_path / "c.jsonl"
    comps.write_text(json.dumps({"id": "math-1", "completion": "\\boxed{80}"}) + "\n")
    args = ["score", "--data", str(data), "--completions", str(comps)]
    assert main(args) == 2  # divrl.cli: one paragraph, no traceback
    assert "row 2: field 'answer'" in capsys.readouterr().err
    with pytest.raises(DataValidationError, match="row 2: field 'answer'"):
        main(["--debug", *args])
    assert main([*args, "--skip-invalid"]) == 0
    out = capsys.readouterr().out
    assert "(2 examples, 1 invalid rows skipped)" in out and "mean score: 1.0000" in out


def _math_completions(tmp_path, completion):
    comps = tmp_path / "c.jsonl"
    comps.write_text(json.dumps({"id": "math-0", "completion": completion}) + "\n")
    return comps


def test_lone_surrogate_is_written_and_scored_as_the_model_failure(tmp_path):
    comps = _math_completions(tmp_path, "\\boxed{\udcff}")
    out = tmp_path / "scored.jsonl"
    argv = ["score", "--data", str(fixture_path("math.jsonl")), "--completions", str(comps)]
    assert main([*argv, "--out", str(out)]) == 0
    row = json.loads(out.read_text(encoding="utf-8"))
    assert row["scores"] == [0.0]
    assert row["reasons"][0] in ("wrong", "no_answer")


def test_out_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    from divrl import fileio  # the command writes through divrl.fileio

    comps = _math_completions(tmp_path, "\\boxed{85}")
    out = tmp_path / "scored.jsonl"
    out.write_text("previous results\n")
    argv = ["score", "--data", str(fixture_path("math.jsonl")), "--completions", str(comps)]

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "fsync", disk_full)
    with pytest.raises(OSError, match=r"disk full while writing .*scored\.jsonl"):
        main([*argv, "--out", str(out)])
    assert out.read_text() == "previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "scored.jsonl"]
    monkeypatch.undo()
    assert main([*argv, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["scores"] == [1.0]


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_timeout_must_be_finite_and_positive(tmp_path, capsys, value):
    from divrl.rewards import compute_score

    comps = _math_completions(tmp_path, "\\boxed{85}")
    argv = ["score", "--data", str(fixture_path("math.jsonl")), "--completions", str(comps)]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--timeout", value])
    assert info.value.code == 2
    assert "finite number of seconds > 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="finite number of seconds"):
        compute_score("math", "\\boxed{1}", "1", timeout=float(value))
