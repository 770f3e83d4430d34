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
