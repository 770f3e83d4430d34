"""The README's commands, in the README's order, on a fresh directory, produce a report of
GRPO and DPH-JS against the base model with no empty row.

The commands are read from the README's ``bash`` blocks, so the two cannot drift; every
command gets the same small-scale settings appended (:data:`TRAIN_SCALE`,
:data:`EVAL_SCALE`: a few prompts, steps and samples) and the toy world is built in a
temporary ``DIVRL_CACHE_DIR`` (the shipped base model: seconds).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: appended to every `divrl train` / `divrl presample` (same data and sampling for both, so
#: the DPH store matches the run), after the README's own overrides, so they win
TRAIN_SCALE = [
    "data.limit=24",
    "train.total_steps=2",
    "train.prompts_per_step=4",
    "train.mini_batch_size=null",  # (the presets take 16 of 32 prompts per optimiser step)
    "train.micro_batch_size=16",
    "rollout.n=4",
    "rollout.max_new_tokens=40",
    "reference.k=4",
    "reference.threshold=2",
    "reference.per_step=4",
    "logging.progress=false",
    "logging.tensorboard=false",
]
#: appended to every `divrl eval` that samples
EVAL_SCALE = ["--limit", "4", "--n", "2", "--max-new-tokens", "40", "--n-boot", "20"]
#: appended to `divrl toy build --measure`
TOY_SCALE = ["--max-prompts", "2", "--samples", "2"]
#: README lines that are not part of the sequence, by prefix (anything else fails the test)
NOT_RUN = (
    "make ",  # the demo and the test suite themselves
    "python3 -m venv",
    "pip install",
    "F=",  # `divrl score` on the fixtures: tested in tests/rewards
    "divrl score",
    "accelerate launch",  # 8 GPUs and an 8B model
    "torchrun --nproc_per_node 8",  # FSDP over 8 GPUs, a 7B model
)
RUN = ("divrl toy", "divrl train", "divrl presample", "torchrun", "divrl eval", "divrl report")
#: the README's quick try (presample, train, resume on 64 prompts): its own test, in its own
#: directory, since it trains into the same folder as the full run
QUICK_TRY = "data.limit=64"


def readme_commands(text: str) -> list[str]:
    """Every command line of the README's bash blocks, continuations joined, no comments."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(re.sub(r"\s+", " ", line))
    return commands


def readme_sequence(commands: list[str]) -> list[str]:
    """The README commands the full sequence runs, in order (the quick try has its own test)."""
    return [
        c
        for c in commands
        if c.startswith(RUN) and not c.startswith(NOT_RUN) and QUICK_TRY not in c
    ]


def _groups(preset: str) -> list[str]:
    """Lp-Reg's virtual GPUs of the authors' selection, shrunk to fit the small batch."""
    from divrl.training.config import load_config

    path = ROOT / preset
    if path.is_file() and load_config(path).algorithm.lp_reg_scope == "authors":
        return ["algorithm.lp_reg_group_size=4"]
    return []


def scaled(command: str) -> list[str]:
    """argv of ``command`` (without the program) with the small-scale settings added."""
    argv = shlex.split(command)
    if argv[0] == "torchrun":
        return [*argv, *TRAIN_SCALE]
    argv = argv[1:]
    if argv[0] in ("train", "presample"):  # after the README's overrides, before its flags
        flags = [a for a in argv[2:] if a.startswith("-")]
        return [*[a for a in argv if a not in flags], *_groups(argv[1]), *TRAIN_SCALE, *flags]
    if argv[0] == "eval" and "--reuse" not in argv:
        return [*argv, *EVAL_SCALE, "--no-progress"]
    if argv[0] == "toy":
        return [*argv, *TOY_SCALE, "--quiet"] if "--measure" in argv else [*argv, "--quiet"]
    return argv


def test_the_small_settings_win_over_the_readme_overrides():
    argv = scaled("divrl train configs/toy/lp_reg.yaml train.total_steps=100 --resume")
    assert argv[:3] == ["train", "configs/toy/lp_reg.yaml", "train.total_steps=100"]
    assert argv[-2:] == [TRAIN_SCALE[-1], "--resume"] and "train.total_steps=2" in argv


def test_every_readme_command_is_run_or_deliberately_skipped():
    commands = readme_commands((ROOT / "README.md").read_text())
    unknown = [c for c in commands if not c.startswith(RUN + NOT_RUN)]
    sequence = readme_sequence(commands)
    assert not unknown, f"README commands this test neither runs nor skips: {unknown}"
    # every command that writes (a training run, an eval, a report) has its own directory
    outputs = [output_dir(c) for c in sequence if "--reuse" not in c]  # --reuse: in place
    outputs = [o for o in outputs if o is not None]
    assert len(outputs) >= 7 and len(set(outputs)) == len(outputs), outputs


def output_dir(command: str) -> str | None:
    """Where ``command`` writes: ``--out``, a ``logging.output_dir=`` override, or its
    config's ``logging.output_dir`` (training); None for commands that write nothing."""
    from divrl.training.config import load_config

    argv = shlex.split(command)
    if "--out" in argv:
        return argv[argv.index("--out") + 1]
    if "train" not in argv or "--resume" in argv or "--overwrite" in argv:
        return None  # writes nothing, or continues / replaces a run on purpose
    override = [a.split("=", 1)[1] for a in argv if a.startswith("logging.output_dir=")]
    config = next(a for a in argv if a.endswith(".yaml"))
    return override[0] if override else load_config(ROOT / config).logging.output_dir


@pytest.mark.slow
def test_readme_sequence_produces_a_full_report(tmp_path, monkeypatch, run_in_session):
    from divrl.cli import main

    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "clone"
    work.mkdir()
    (work / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(work)
    commands = readme_commands((ROOT / "README.md").read_text())
    for command in readme_sequence(commands):
        argv = scaled(command)
        if command.startswith("torchrun"):
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            launcher = [sys.executable, "-m", "torch.distributed.run"]
            done = run_in_session([*launcher, *argv[1:]], env=env, timeout=600)
            assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        else:
            assert main(argv) == 0, command

    report = (work / "reports/toy/report.md").read_text()
    for name in ("base", "grpo", "DPH-JS"):
        assert name in report
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    # every trained model has a value in every cell of every table (the base model has no
    # training run and no retention: those cells are "-" by design)
    trained = [r for r in rows if re.search(r"\|\s*(grpo|DPH-JS)\s*\|", r)]
    assert len(trained) >= 2 * 3, report  # both models in the tables of the three eval sets
    empty = [r for r in trained if re.search(r"\|\s*-?\s*(?=\|)", r[1:])]
    assert not empty, "rows with empty cells:\n" + "\n".join(empty)
    headline = report.split("## Headline")[1].split("##")[0]
    for model in ("base", "grpo", "DPH-JS"):
        assert headline.count(f"| {model} |") == 3  # one row per eval set


@pytest.mark.slow
def test_readme_quick_try_then_resume(tmp_path, monkeypatch):
    """The quick try as the README writes it (its own data.limit, the small settings less
    the data limit), a kill after step 1 (the last checkpoint removed), then the README's
    resume line: it continues from step 1 instead of refusing a changed config."""
    from divrl.cli import main
    from divrl.runs import RunDir

    monkeypatch.setenv("DIVRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    quick = [c for c in readme_commands((ROOT / "README.md").read_text()) if QUICK_TRY in c]
    assert [shlex.split(c)[1] for c in quick] == ["presample", "train", "train"]
    assert "--resume" in quick[2] and quick[2].index("--resume") < quick[2].index(QUICK_TRY)
    small = [a for a in TRAIN_SCALE if not a.startswith("data.limit=")]
    small += ["checkpoint.save_every=1", "checkpoint.keep_last=2"]
    assert main([*shlex.split(quick[0])[1:], *small]) == 0
    assert main([*shlex.split(quick[1])[1:], *small]) == 0
    run = RunDir("runs/toy/dph_js")
    assert [c.step for c in run.checkpoints()] == [1, 2]
    import shutil

    shutil.rmtree(run.checkpoints()[-1].path)  # killed before step 2 was saved
    assert main([*shlex.split(quick[2])[1:], *small]) == 0
    assert [c.step for c in run.checkpoints()] == [1, 2]
    events = [json.loads(line)["event"] for line in run.history_path.read_text().splitlines()]
    assert "resume" in events


def test_install_lines_work_from_a_checkout():
    """divrl is not on PyPI: every `pip install` of divrl in the README and docs installs the
    checkout (`-e .`) or a git URL, except the sentence naming the future package."""
    pattern = re.compile(r"pip install[^`\n]*divrl\[")
    offenders = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in pattern.finditer(line):
                if "git+" not in line[m.start() :] and "once it is released" not in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders
