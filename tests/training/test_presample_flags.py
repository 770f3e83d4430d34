"""``divrl presample --model M --dataset FILE --template T [--store DIR]``: TRL-style names
for the overrides they stand for, without a config file."""

import argparse

import pytest

from divrl.cli import UsageError
from divrl.commands.presample import add_arguments, flag_overrides, next_command
from divrl.training.config import load_config


def _args(argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_flags_are_the_overrides_they_name():
    args = _args(["--model", "my/model", "--dataset", "data/mine.jsonl", "--template", "chat"])
    flag_overrides(args)
    assert args.overrides == [
        "model.path=my/model",
        "data.train_path=data/mine.jsonl",
        "data.template=chat",
        "reference.store=runs/mine/reference",  # from the dataset, not the shared runs/run
    ]
    config = load_config(None, args.overrides)
    assert (config.model.path, config.data.train_path) == ("my/model", "data/mine.jsonl")
    assert str(config.reference_store) == "runs/mine/reference"
    # the next command trains on the same store with the same settings
    assert "reference.store=runs/mine/reference" in next_command(args)


def test_a_config_or_an_explicit_place_keeps_its_store():
    args = _args(["configs/toy/dph_js.yaml", "--dataset", "d.jsonl"])
    flag_overrides(args)
    assert args.overrides == ["data.train_path=d.jsonl"]
    args = _args(["--dataset", "d.jsonl", "--store", "s"])
    flag_overrides(args)
    assert args.overrides == ["data.train_path=d.jsonl", "reference.store=s"]
    args = _args(["logging.output_dir=o", "--dataset", "d.jsonl"])
    flag_overrides(args)
    assert args.overrides == ["data.train_path=d.jsonl"]


def test_a_key_given_both_ways_is_refused():
    args = _args(["model.path=a", "--model", "b"])
    with pytest.raises(UsageError, match=r"give --model or model\.path=\.\.\., not both"):
        flag_overrides(args)
