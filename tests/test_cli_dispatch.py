import subprocess
import sys

from divrl.cli import main


def test_no_command_prints_help_and_returns_2(capsys):
    assert main([]) == 2
    assert "usage: divrl" in capsys.readouterr().out


def test_version_flag():
    out = subprocess.run(
        [sys.executable, "-m", "divrl.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("divrl ")


def test_train_and_presample_refuse_a_bad_config_the_same_way(capsys):
    """One config loader for both commands: the error names the command, exit status 2."""
    for command in ("train", "presample"):
        assert main([command, "train.no_such_key=1"]) == 2
        assert f"divrl {command}: unknown key 'train.no_such_key'" in capsys.readouterr().err
