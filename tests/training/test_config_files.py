"""A damaged or mistyped config file is one line naming the file, the line and the fix,
never a traceback; a prompt template that does not exist is refused when the config is
read (before any model loads, and by --print-config) (docs/reliability.md, "Inputs")."""

from __future__ import annotations

import pytest

from divrl.cli import main
from divrl.training.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"train:\n  total_steps: [1\n", r"line 3, column 1: invalid YAML: .*expected ',' or ']'"),
        (b"train:\n  total_steps: 2 # caf\xe9\n", r"line 2: not UTF-8 text \(byte 0xe9\)"),
        (b"extends: 5\n", r"extends: 5 must be the path of another config file"),
        (b"? {a: 1}\n: 2\n", r"line 1, column 3: .*unhashable key \(a mapping or list used as"),
        (b"train:\n  ? [a]\n  : 1\n", r"line 2, column 5: .*unhashable key"),
        (b"a: 1\n---\nb: 2\n", r"invalid YAML: .*single document"),
    ],
    ids=["syntax", "not-utf8", "extends-int", "mapping-key", "list-key", "two-documents"],
)
def test_a_bad_config_file_is_one_error_naming_file_and_line(tmp_path, capsys, text, message):
    path = tmp_path / "c.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}")
    assert main(["train", str(path), "--print-config"]) == 2
    out = capsys.readouterr()
    assert out.err.strip().splitlines()[-1].startswith(f"divrl train: {path}")
    assert "Traceback" not in out.err


def test_a_bad_file_named_by_extends_is_named(tmp_path):
    (tmp_path / "base.yaml").write_bytes(b"train: {total_steps: \xff}\n")
    (tmp_path / "c.yaml").write_text("extends: base.yaml\n")
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'base.yaml'}: line 1: not UTF-8"):
        load_config(tmp_path / "c.yaml")


def test_an_override_that_is_not_yaml_says_to_quote_it():
    with pytest.raises(ConfigError, match=r"override 'train.total_steps=\[1'.*quote the value"):
        load_config(None, ["train.total_steps=[1"])


def test_an_unknown_template_is_refused_by_print_config(capsys):
    assert main(["train", "data.template=nope", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "data.template='nope' is not valid; choose one of" in err and "'plain'" in err
    assert load_config(None, ["data.template=r1"]).data.template == "r1"
