import os
import subprocess
import sys
from pathlib import Path

import pytest

from divrl.cli import main


def test_no_command_prints_help_and_returns_2(capsys):
    assert main([]) == 2
    assert "usage: divrl" in capsys.readouterr().out


def test_version_flag():
    out = subprocess.run(
        [sys.executable, "-m", "divrl.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("divrl ")


def divrl(*args, env=None, timeout=120):
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    full_env = {**os.environ, "PYTHONPATH": str(root), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "divrl.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=root,
    )


def test_input_error_is_one_paragraph_with_exit_2_and_debug_shows_traceback(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1+1?", "data_source": "math"}\n')  # no ground_truth
    completions = tmp_path / "c.jsonl"
    completions.write_text('{"id": "0", "completion": "2"}\n')
    out = divrl("score", "--data", str(data), "--completions", str(completions))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("divrl score: ") and "ground_truth" in out.stderr
    assert "row 1" in out.stderr and "--debug" in out.stderr
    debug = divrl("--debug", "score", "--data", str(data), "--completions", str(completions))
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert "DataValidationError" in debug.stderr


def test_missing_local_model_fails_fast_without_traceback(tmp_path):
    import time

    data = tmp_path / "set.jsonl"
    data.write_text('{"prompt": "1+1?", "data_source": "math", "ground_truth": "2"}\n')
    start = time.perf_counter()
    out = divrl(
        "eval", "--model", str(tmp_path / "no_such_model"), "--data", f"s={data}",
        "--out", str(tmp_path / "ev"),
    )  # fmt: skip
    assert time.perf_counter() - start < 60
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"no local folder {tmp_path / 'no_such_model'}" in out.stderr
    # a hub id with the hub unreachable (closed local port) and not in the cache
    out = divrl(
        "eval", "--model", "someone/not-cached-model", "--data", f"s={data}",
        "--out", str(tmp_path / "ev"),
        env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")},
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "no local folder someone/not-cached-model and no network" in out.stderr
    assert not (tmp_path / "ev").exists()


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    import divrl.commands.report as report_command

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_command, "run", interrupted)
    assert main(["report", "x", "--out", "y"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "divrl report: interrupted"


def test_log_lines_print_once_and_accelerate_noise_is_dropped():
    code = (
        "import logging\n"
        "from divrl.cli import setup_logging\n"
        "setup_logging()\n"  # as divrl.cli.main does, before any library is imported
        "from huggingface_hub.utils import logging as hub_logging\n"
        "hub_logging.get_logger('huggingface_hub.file_download').warning('hub-line')\n"
        "logging.getLogger('accelerate.utils.other').warning(\n"
        "    \"Removed shared tensor {'lm_head.weight'} while saving.\")\n"
        "from accelerate import PartialState\n"
        "from accelerate.logging import get_logger\n"  # as checkpoints log it: '[RANK 0] ...'
        "PartialState(cpu=True)\n"
        "get_logger('accelerate.utils.other').warning(\n"
        "    \"Removed shared tensor {'lm_head.weight'} while saving.\", main_process_only=False)\n"
        "logging.getLogger('accelerate.utils.other').warning('other-accelerate-line')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.count("hub-line") == 1  # divrl's handler only, not the hub's too
    assert "huggingface_hub.file_download: hub-line" in out.stderr
    assert "Removed shared tensor" not in out.stderr
    assert "other-accelerate-line" in out.stderr


def test_accelerate_checkpoint_lines_are_logged_at_debug_only():
    code = (
        "import logging, sys\n"
        "from divrl.cli import setup_logging\n"
        "setup_logging(logging.DEBUG if sys.argv[1] == 'debug' else logging.INFO)\n"
        "from accelerate import PartialState\n"
        "from accelerate.logging import get_logger\n"
        "PartialState(cpu=True)\n"
        "get_logger('accelerate.accelerator').info('Saving current state to /r/state')\n"
        "get_logger('accelerate.checkpointing').info('Model weights saved in /r/m.safetensors')\n"
        "get_logger('accelerate.checkpointing').info('Random states saved in /r/rs.pkl')\n"
        "get_logger('accelerate.accelerator').info('Loading in 0 custom states')\n"
        "get_logger('accelerate.checkpointing').info('another-accelerate-info')\n"
        "get_logger('accelerate.checkpointing').warning('Model weights saved in a warning')\n"
    )
    lines = ("Saving current state to", "Model weights saved in /r", "Random states", "Loading in")
    info = subprocess.run([sys.executable, "-c", code, "info"], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert not [line for line in lines if line in info.stderr], info.stderr
    assert "another-accelerate-info" in info.stderr  # only the listed lines are demoted
    assert "WARNING" not in info.stderr and "Model weights saved in a warning" in info.stderr
    debug = subprocess.run([sys.executable, "-c", code, "debug"], capture_output=True, text=True)
    assert debug.returncode == 0, debug.stderr
    assert all(line in debug.stderr for line in lines), debug.stderr


def test_help_shows_defaults():
    eval_help = divrl("eval", "--help").stdout.split("options:", 1)[1]
    for option, default in (
        ("--temperature", "(default: 1.0)"),
        ("--batch-size", "(default: 16)"),
        ("--seed", "(default: 0)"),
        ("--n ", "(default: 16)"),
        ("--max-new-tokens", "default: 256"),
    ):
        text = " ".join(eval_help.split(option, 1)[1].split("--", 1)[0].split())
        assert default in text, (option, text)
    score_help = " ".join(divrl("score", "--help").stdout.split())
    assert "the verifier's, 5 s" in score_help and "min(8, CPU count)" in score_help
    toy_help = " ".join(divrl("toy", "build", "--help").stdout.split())
    assert "prompts measured per split (default: 256)" in toy_help
    assert "samples per prompt (Pass@k) (default: 16)" in toy_help


def test_train_and_presample_refuse_a_bad_config_the_same_way(capsys):
    """One config loader for both commands: the error names the command, exit status 2."""
    for command in ("train", "presample"):
        assert main([command, "train.no_such_key=1"]) == 2
        assert f"divrl {command}: unknown key 'train.no_such_key'" in capsys.readouterr().err


def test_threads_follow_the_cpus_and_the_local_processes_never_the_load(monkeypatch):
    """The thread count changes the order of float sums: chosen from the machine's load, the
    same command and seed logged different numbers beside a busy process."""
    import os

    from divrl.cli import choose_threads, usable_cpus

    assert choose_threads(cpus=2, local_processes=1) == 2
    assert choose_threads(cpus=16, local_processes=4) == 4  # torchrun: share them
    assert choose_threads(cpus=16, local_processes=32) == 1  # never 0
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    idle = choose_threads()
    monkeypatch.setattr(os, "getloadavg", lambda: (50.0, 50.0, 50.0), raising=False)
    assert choose_threads() == idle == usable_cpus()


def test_threads_option_env_and_omp_num_threads(monkeypatch, tmp_path, capsys):
    import torch

    from divrl.cli import configure_threads, usable_cpus

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setenv("DIVRL_THREADS", "1")
        assert configure_threads(None).startswith("1 ($DIVRL_THREADS")
        assert torch.get_num_threads() == 1
        assert configure_threads(1).startswith("1 (--threads")  # the option wins
        monkeypatch.delenv("DIVRL_THREADS")
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert configure_threads(None).endswith("(from $OMP_NUM_THREADS=1)")
        # a bad value is an input error of the command, before anything is loaded
        assert main(["eval", "--threads", "0", "--out", str(tmp_path / "o"), "--reuse"]) == 2
        assert "--threads=0: the number of threads must be from 1 to" in capsys.readouterr().err
        too_many = str(usable_cpus() + 1)
        assert main(["eval", "--threads", too_many, "--out", str(tmp_path / "o"), "--reuse"]) == 2
        assert f"--threads={too_many}: the number of threads must be" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DIVRL_THREADS", "abc"),
        ("DIVRL_THREADS", "1.5"),
        ("OMP_NUM_THREADS", "abc"),
        ("OMP_NUM_THREADS", "0"),
        ("OMP_NUM_THREADS", "-1"),
    ],
)
def test_a_thread_variable_that_is_not_a_count_is_refused(
    monkeypatch, tmp_path, capsys, name, value
):
    """DIVRL_THREADS=abc was an int() traceback; OpenMP ignores OMP_NUM_THREADS=abc/0/-1 while
    the log said the threads came from it."""
    monkeypatch.delenv("DIVRL_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(name, value)
    assert main(["eval", "--out", str(tmp_path / "o"), "--reuse"]) == 2
    err = capsys.readouterr().err
    assert f"${name}={value!r} is not a whole number of threads >= 1" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "nan"], "argument --temperature: 'nan' is not a finite number > 0"),
        (["--temperature", "inf"], "argument --temperature: 'inf' is not a finite number > 0"),
        (["--top-p", "nan"], "argument --top-p: 'nan' is not a finite number"),
        (["--seed", "-1"], "argument --seed: '-1' is not a whole number from 0 to 2147483647"),
        (["--n", "0"], "argument --n: '0' is not a whole number >= 1"),
    ],
)
def test_eval_numbers_are_checked_when_parsed_naming_the_option(tmp_path, capsys, args, message):
    """--temperature nan sampled pad tokens and exited 0; --seed -1 failed after the model
    loaded with "expected non-negative integer"."""
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--model", "toy", "--data", "toy", "--out", str(tmp_path), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_lets_idle_openmp_threads_sleep_unless_told_otherwise():
    import os

    code = (
        "import os, divrl.cli as c\n"
        "try:\n    c.main(['--version'])\nexcept SystemExit:\n    pass\n"
        "print(os.environ['OMP_WAIT_POLICY'])"
    )
    for given, want in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        if given:
            env["OMP_WAIT_POLICY"] = given
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert out.stdout.strip().splitlines()[-1] == want


def test_progress_bars_in_a_log_are_lines_without_cursor_control(tmp_path):
    import io

    from divrl.cli import LineStream

    buf = io.StringIO()
    stream = LineStream(buf)
    for text in (
        "\rscore:  0%|   | 0/4",
        "\rscore: 50%|#  | 2/4   ",
        "\x1b[A\rtrain: 1/2\x1b[B",
        "\n",
    ):
        stream.write(text)
    stream.write("a log line\n")
    assert buf.getvalue() == "score:  0%|   | 0/4\nscore: 50%|#  | 2/4\ntrain: 1/2\na log line\n"

    # a command's stderr in a pipe: the scoring bar's redraws are lines, no \r, no escapes
    fixtures = "divrl/data/fixtures"
    out = divrl(
        "score",
        "--data",
        f"{fixtures}/sql.jsonl",
        "--completions",
        f"{fixtures}/sql_completions.jsonl",
        "--out",
        str(tmp_path / "scored.jsonl"),
    )
    assert out.returncode == 0, out.stderr
    assert "scoring" in out.stderr
    assert "\r" not in out.stderr and "\x1b[" not in out.stderr


def test_every_error_has_the_one_prefix_divrl_command(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_info:  # argparse's own errors
        main(["train", "configs/toy/grpo.yaml", "--bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == "divrl train: unrecognized arguments: --bogus (see `divrl train --help`)\n"
    assert main(["data", "convert", "math", "--src", str(tmp_path / "no"), "--split", "x",
                 "--out", str(tmp_path / "o.jsonl")]) == 2  # fmt: skip
    assert capsys.readouterr().err.startswith(f"divrl data: --src {tmp_path / 'no'} is not a")


def test_third_party_progress_bars_are_off_when_stderr_is_not_a_terminal(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    load = (
        f"from transformers import AutoModelForCausalLM as M; M.from_pretrained({str(tmp_path)!r})"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    stderr = {}
    for name, pre in (
        ("plain", ""),
        ("divrl", "import divrl.cli as c; c.plain_progress_when_logged(); "),
    ):
        out = subprocess.run(
            [sys.executable, "-c", pre + load], capture_output=True, text=True, env=env, timeout=120
        )
        assert out.returncode == 0, out.stderr
        stderr[name] = out.stderr
    assert "Loading weights" in stderr["plain"]  # transformers draws it into a pipe...
    assert "Loading weights" not in stderr["divrl"]  # ... and not under divrl's commands


def test_each_test_runs_on_the_thread_count_the_suite_asks_for():
    """DIVRL_TEST_THREADS=2 make test runs the suite on two threads (1 by default)."""
    import os

    import torch

    assert torch.get_num_threads() == int(os.environ.get("DIVRL_TEST_THREADS", "1"))


def test_an_error_keeps_its_list_one_item_per_line_and_is_otherwise_one_line():
    from divrl.cli import error_paragraph

    listed = ValueError(
        "the reference store s does not match this run:\n  - data.limit: 6 vs none\n"
        "  - rollout.n:   8 vs 4\nPresample again,   or pass --allow-store-mismatch."
    )
    assert error_paragraph("train", listed).splitlines() == [
        "divrl train: the reference store s does not match this run:",
        "  - data.limit: 6 vs none",
        "  - rollout.n: 8 vs 4",
        "Presample again, or pass --allow-store-mismatch. "
        "(run `divrl --debug train ...` for the traceback)",
    ]
    wrapped = ValueError("a message\n  wrapped over\n\nthree lines")
    assert error_paragraph("eval", wrapped) == (
        "divrl eval: a message wrapped over three lines "
        "(run `divrl --debug eval ...` for the traceback)"
    )


def test_train_help_points_at_the_configuration_reference_and_print_config():
    text = " ".join(divrl("train", "--help").stdout.split())
    assert 'docs/training.md, "Configuration reference"' in text
    assert "--print-config` prints the resolved config" in text
    reference = (Path(__file__).parent.parent / "docs" / "training.md").read_text()
    assert "\n## Configuration reference\n" in reference
