"""`divrl eval --model RUN_DIR` while training prunes checkpoints: the chosen checkpoint is
pinned (hard links), so its deletion under the loader does not matter, and a checkpoint
that vanishes while being pinned is replaced by the then-newest one
(docs/reliability.md, "Evaluation")."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import divrl.evaluation.pinning as pinning
import divrl.rollout.model_source as model_source
from divrl.evaluation.model_loading import load_model, resolve_model_path
from divrl.runs import RunDir


@pytest.fixture
def run(tmp_path, tiny_lm):
    model, tokenizer = tiny_lm
    root = tmp_path / "run"
    for step in (1, 2):
        folder = RunDir(root).checkpoint(step).model_dir
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    yield root
    for pin in list(pinning._pins):  # the pins of this process live until it exits
        pinning._cleanup(pinning._pins.pop(pin)[0])


def test_a_checkpoint_pruned_while_it_loads_is_still_loaded(run, monkeypatch):
    real = model_source.check_model_source

    def prune_then_check(path):  # training deletes the chosen checkpoint under the loader
        shutil.rmtree(RunDir(run).checkpoint(2).path)
        return real(path)

    monkeypatch.setattr(model_source, "check_model_source", prune_then_check)
    model, _ = load_model(run)
    assert model is not None
    assert pinning.origin_of(resolve_model_path(run)).endswith("step_000002/model")


def test_a_checkpoint_vanishing_while_pinned_falls_back_to_the_newest(run, monkeypatch, caplog):
    real = pinning._link_tree

    def pruned_midway(src, dst):
        if "step_000002" in str(src):
            real(src, dst)
            shutil.rmtree(src.parent)  # pruned after some files were linked
            raise FileNotFoundError(src / "model.safetensors")
        real(src, dst)

    monkeypatch.setattr(pinning, "_link_tree", pruned_midway)
    with caplog.at_level(logging.INFO):
        pinned, ckpt = pinning.pin_newest_model(run)
    assert ckpt.step == 1 and (pinned / "config.json").is_file()
    assert "vanished while it was being pinned" in caplog.text


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def test_pins_are_removed_and_dead_processes_pins_swept(run):
    pinned, _ = pinning.pin_newest_model(run)
    stale = pinned.parent / "999999999-step_000001"
    stale.mkdir()
    elsewhere = pinned.parent / f"{_dead_pid()}@another-host-step_000001"  # its pid is not ours
    elsewhere.mkdir()
    pinning._sweep(pinned.parent)
    assert not stale.exists() and pinned.exists() and elsewhere.exists()
    shutil.rmtree(elsewhere)
    pinning._cleanup(pinning._pins.pop(run.resolve())[0])
    assert not (run / pinning.PIN_DIR).exists()
    assert RunDir(run).run_files() == [run / "checkpoints"]  # a pin is not a run file


def test_a_run_folder_that_cannot_be_written_is_loaded_in_place(run, monkeypatch):
    real_mkdir = pinning.Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.name == pinning.PIN_DIR:
            raise PermissionError(13, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pinning.Path, "mkdir", read_only)
    model_dir, ckpt = pinning.pin_newest_model(run)
    assert model_dir == RunDir(run.resolve()).checkpoint(2).model_dir and ckpt.step == 2


def test_an_eval_ended_by_sigterm_removes_its_pin(run):
    """A `timeout` or a scheduler ends divrl eval with SIGTERM, whose default skips atexit:
    the pin stayed, keeping a pruned checkpoint's data on disk for good."""
    code = (
        "import sys, time\n"
        "from divrl.evaluation.pinning import pin_newest_model\n"
        f"print(pin_newest_model({str(run)!r})[0], flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pin = Path(proc.stdout.readline().strip())
    assert pin.is_dir() and pin.parent.name == pinning.PIN_DIR
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # still ended by the signal
    assert not pin.exists() and not (run / pinning.PIN_DIR).exists()


def test_pruning_and_overwrite_sweep_the_pins_of_dead_evaluations(run, tmp_path):
    """A dead evaluation's pin kept a pruned checkpoint's data alive and survived --overwrite."""
    from divrl.checkpoint.strategies import prune_checkpoints

    root = RunDir(run)
    dead = f"{_dead_pid()}@{socket.gethostname()}-step_000001"
    live = f"{os.getpid()}@{socket.gethostname()}-step_000002"
    for name in (dead, live):
        shutil.copytree(root.checkpoint(1).model_dir, root.pins_dir / name)
    prune_checkpoints(root, keep_last=1, run_id="nobody's")  # nothing of its own to prune
    assert sorted(p.name for p in root.pins_dir.iterdir()) == [live]
    shutil.copytree(root.checkpoint(1).model_dir, root.pins_dir / dead)
    from divrl.training.config import load_config
    from divrl.training.run_session import RunSession

    config = load_config(None, [f"logging.output_dir={run}"])
    session = RunSession(root, config, overwrite=True)
    session.check()
    session.begin(0)  # deletes the checkpoints, sweeps the dead pin, keeps the live one
    session.lock.release()
    assert not root.checkpoints_dir.exists() or not any(root.checkpoints_dir.iterdir())
    assert sorted(p.name for p in root.pins_dir.iterdir()) == [live]
