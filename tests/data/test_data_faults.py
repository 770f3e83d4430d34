"""Hostile JSONL rows (issue 18, finding 8): each is a data error naming the file, the line
(with the byte column for decoding errors) and the field, honoured by skip_invalid; numbers
keep the row's exact text."""

import json

import pytest

from divrl.data import DataValidationError, load_examples
from divrl.data.loading import MAX_JSON_DEPTH


def _row(gt="4", **extra_info) -> str:
    return json.dumps(
        {
            "data_source": "math",
            "prompt": "2+2?",
            "reward_model": {"ground_truth": gt},
            "extra_info": extra_info,
        }
    )


def _write(path, *lines: bytes | str):
    path.write_bytes(b"".join((x.encode() if isinstance(x, str) else x) + b"\n" for x in lines))
    return path


def test_invalid_utf8_names_file_line_and_byte_column(tmp_path):
    good = _row()
    bad = good.replace("2+2?", "2+2\udcff?").encode("utf-8", "surrogateescape")  # a raw 0xff
    path = _write(tmp_path / "d.jsonl", good, bad)
    with pytest.raises(DataValidationError) as err:
        load_examples(path)
    column = bad.index(b"\xff") + 1
    assert str(err.value).startswith(f"{path}: row 2: field '<row>': invalid UTF-8")
    assert f"at byte column {column}" in str(err.value)
    loaded = load_examples(path, skip_invalid=True)
    assert len(loaded) == 1 and loaded.n_skipped == 1


def test_invalid_json_reports_the_byte_column_after_multibyte_text(tmp_path):
    line = '{"prompt": "été", "x": }'  # the error is at character 24, byte 26
    assert line.encode().index(b"}") + 1 == 26
    path = _write(tmp_path / "d.jsonl", _row(), line)
    with pytest.raises(DataValidationError, match=r"row 2: .*byte column 26"):
        load_examples(path)


def test_huge_integers_keep_their_digits(tmp_path):
    big, huge = "9" * 401, "7" * 5000  # float() overflows; int() refuses > 4300 digits
    rows = [
        json.dumps({"question": "q", "answer": json.loads(big)}),
        '{"question": "q", "answer": ' + huge + ', "extra_info": {"n": ' + huge + "}}",
    ]
    loaded = load_examples(_write(tmp_path / "d.jsonl", *rows))
    assert [ex.ground_truth for ex in loaded] == [big, huge]


def test_float_ground_truths_are_the_exact_text_of_the_row(tmp_path):
    texts = ("1e300", "0.1", "2.50", "-3E-2")
    rows = ['{"question": "q", "answer": ' + t + "}" for t in texts]
    loaded = load_examples(_write(tmp_path / "d.jsonl", *rows))
    assert [ex.ground_truth for ex in loaded] == ["1e300", "0.1", "2.50", "-3E-2"]


def test_deep_nesting_is_a_row_error_naming_the_field(tmp_path):
    deep = '{"question": "q", "answer": 1, "extra_info": ' + "[" * 100_000 + "]" * 100_000 + "}"
    medium = _row(meta=json.loads("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)))
    path = _write(tmp_path / "d.jsonl", deep, medium, _row())
    with pytest.raises(DataValidationError) as err:
        load_examples(path)
    assert str(err.value).startswith(f"{path}: row 1: field 'extra_info': nested more than")
    loaded = load_examples(path, skip_invalid=True)
    assert len(loaded) == 1 and loaded.n_skipped == 2
    assert "row 2: field 'extra_info'" in loaded.errors[1]
