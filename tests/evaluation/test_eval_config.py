"""``divrl eval --config``: the run, eval sets, template, databases and output folder come
from a training config; every input error is one line with exit code 2."""

import argparse

import pytest
import yaml

from divrl.cli import main
from divrl.commands.eval import add_arguments, apply_config


def _args(argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture
def mine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my").mkdir()
    path = tmp_path / "my" / "mine.yaml"
    data = {
        "model": {"path": "my/base"},
        "data": {"template": "r1", "db_dir": "my/db", "eval_paths": {"test": "my/test.jsonl"}},
    }
    path.write_text(yaml.safe_dump(data))
    return "my/mine.yaml"


def test_the_config_names_the_run_the_sets_and_the_settings(mine, tmp_path):
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    args = _args(["--config", mine])
    apply_config(args)
    assert (args.model, args.data, args.out) == (
        "runs/mine",
        ["test=my/test.jsonl"],
        "runs/mine/eval",
    )
    assert (args.template, args.db_dir) == ("r1", "my/db")
    # options and overrides win over the config
    args = _args(
        [
            "--config",
            mine,
            "--template",
            "plain",
            "--data",
            "x.jsonl",
            "--out",
            "o",
            "logging.output_dir=runs/other",
            "--model",
            "m",
        ]
    )
    apply_config(args)
    assert (args.template, args.data, args.out, args.model) == ("plain", ["x.jsonl"], "o", "m")
    args = _args(["--config", mine, "--base-model"])
    apply_config(args)
    assert (args.model, args.out) == ("my/base", "runs/mine/eval")
    args = _args(["--out", "o"])
    apply_config(args)
    assert args.template == "plain"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "my/mine.yaml"], "its run folder runs/mine does not exist yet"),
        (["--config", "my/mine.yaml", "data.eval_paths={}", "--model", "m"], "names no eval sets"),
        (["--config", "my/mine.yaml", "data.eval_paths=[a]"], "data.eval_paths"),
        (["--config", "my/mine.yaml", "--base-model", "--model", "m"], "not both"),
        (["--base-model", "--out", "o"], "--base-model needs --config"),
        (["--out", "o", "data.limit=3"], "need --config CONFIG"),
        (["--data", "x.jsonl"], "give --out DIR"),
        (["--config", "my/nothere.yaml"], "config file not found"),
    ],
)
def test_input_errors_are_one_line(mine, capsys, argv, message):
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
