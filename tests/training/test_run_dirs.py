"""Run directories that cannot mix (issue 18, findings 1, 6, 12): a rerun in a used folder
is refused, --overwrite starts clean, pruning keeps to the run's own checkpoints, a lock
keeps two writers apart, a changed config on --resume is refused unless listed, a finished
run says so, Ctrl-C prints one line and exits 130."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from train_helpers import sevens_reward, tiny_overrides

from divrl.cli import main
from divrl.provenance import config_hash, git_state
from divrl.runs import RunDir, RunLockedError
from divrl.training import trainer as trainer_mod
from divrl.training.config import load_config
from divrl.training.run_session import RunDirError
from divrl.training.trainer import Trainer


def _steps(run):
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _ckpts(run):
    return [c.step for c in RunDir(run).checkpoints()]


def _history(run):
    return [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]


def test_a_rerun_in_a_used_folder_is_refused_and_overwrite_starts_clean(
    tiny_world, tmp_path, capsys
):
    run = tmp_path / "D"
    first = tiny_overrides(
        tiny_world,
        run,
        **{"train.total_steps": 4, "checkpoint.save_every": 1, "checkpoint.keep_last": 10},
    )
    assert main(["train", *first]) == 0
    second = tiny_overrides(
        tiny_world,
        run,
        **{
            "train.total_steps": 2,
            "train.seed": 7,
            "checkpoint.save_every": 1,
            "checkpoint.keep_last": 2,
        },
    )
    (run / "eval" / "test").mkdir(parents=True)  # the first run's divrl eval --out run/eval
    (run / "eval" / "test" / "summary.json").write_text("{}")
    capsys.readouterr()
    # the reported data loss: exit 0, its own checkpoints pruned, metrics 1,2,3,4,1,2
    assert main(["train", *second]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert "checkpoints of steps [1, 2, 3, 4]" in err and "metrics.jsonl (4 records)" in err
    assert _steps(run) == [1, 2, 3, 4] and _ckpts(run) == [1, 2, 3, 4]
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["seed"] == 0
    assert (run / "eval" / "test" / "summary.json").is_file()  # refused: nothing deleted

    assert main(["train", *second, "--overwrite"]) == 0
    assert not (run / "eval").exists()  # the replaced run's evaluation went with it
    assert _steps(run) == [1, 2] and _ckpts(run) == [1, 2]
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["seed"] == 7
    events = _history(run)
    assert [e["event"] for e in events] == ["start", "finish"]
    assert "checkpoints of steps [1, 2, 3, 4]" in events[0]["overwrote"]
    assert events[0]["overwrote"].endswith(", eval/")
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    assert {c.run_id() for c in RunDir(run).checkpoints()} == {run_id}
    assert not (run / ".lock").exists()


def test_eval_says_which_checkpoint_of_a_run_it_loads(tiny_world, tmp_path, caplog):
    from divrl.evaluation.runner import resolve_model_path

    args = tiny_overrides(
        tiny_world, tmp_path, **{"train.total_steps": 2, "checkpoint.save_every": 1}
    )
    assert main(["train", *args]) == 0
    with caplog.at_level("INFO"):
        resolved = resolve_model_path(tmp_path)
        # divrl eval resolves the model again for each eval set: it is named once
        resolve_model_path(tmp_path)
        resolve_model_path(tmp_path)
    from divrl.evaluation.pinning import origin_of

    expected = RunDir(tmp_path).checkpoint(2)
    assert origin_of(resolved) == str(expected.model_dir)  # loaded from a pin of it
    assert caplog.text.count(f"evaluating its checkpoint {expected.path}") == 1


def test_a_reference_store_in_the_folder_is_not_another_run(tiny_world, tmp_path):
    (tmp_path / "reference").mkdir()  # `divrl presample` writes here before training
    (tmp_path / "reference" / "manifest.json").write_text("{}")
    cfg = load_config(None, tiny_overrides(tiny_world, tmp_path, **{"train.total_steps": 1}))
    Trainer(cfg, reward_fn=sevens_reward).train()
    assert (tmp_path / "reference" / "manifest.json").exists()


def test_a_live_lock_is_refused_and_a_stale_one_is_taken_over(tiny_world, tmp_path, caplog):
    cfg = load_config(None, tiny_overrides(tiny_world, tmp_path, **{"train.total_steps": 1}))
    tr = Trainer(cfg, reward_fn=sevens_reward)
    lock = tmp_path / ".lock"
    host = os.uname().nodename
    lock.write_text(json.dumps({"pid": os.getppid(), "host": host, "since": 0}))
    with pytest.raises(RunLockedError, match=f"held by pid {os.getppid()} on host {host}"):
        tr.train()
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing written without the lock

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a process that wrote the lock and died (kill -9)
    lock.write_text(json.dumps({"pid": dead.pid, "host": host, "since": 0}))
    with caplog.at_level("WARNING"):
        tr.train()
    assert "stale lock of pid" in caplog.text
    assert _history(tmp_path)[0]["stale_lock"]["pid"] == dead.pid
    assert _steps(tmp_path) == [1] and not lock.exists()


def test_a_locked_folder_is_refused_before_loading(tiny_world, tmp_path):
    lock = tmp_path / ".lock"
    lock.write_text(json.dumps({"pid": os.getppid(), "host": os.uname().nodename}))
    cfg = load_config(None, tiny_overrides(tiny_world, tmp_path))
    with pytest.raises(RunLockedError, match="is in use"):
        Trainer(cfg, reward_fn=sevens_reward, overwrite=True)


def test_train_called_again_continues_its_own_run(tiny_world, tmp_path):
    cfg = load_config(None, tiny_overrides(tiny_world, tmp_path, **{"train.total_steps": 3}))
    tr = Trainer(cfg, reward_fn=sevens_reward)
    tr.train(max_steps=1)
    tr.train()
    assert _steps(tmp_path) == [1, 2, 3]
    events = [(e["event"], e["step"]) for e in _history(tmp_path)]
    assert events == [("start", 0), ("pause", 1), ("continue", 1), ("finish", 3)]


def _resumable(world, out, **extra):
    base = {"train.total_steps": 2, "checkpoint.save_every": 1, "optim.lr": 0.01}
    return load_config(None, tiny_overrides(world, out, **{**base, **extra}))


def test_resume_with_a_changed_setting_is_refused_unless_listed(tiny_world, tmp_path):
    Trainer(_resumable(tiny_world, tmp_path), reward_fn=sevens_reward).train()
    changed = _resumable(tiny_world, tmp_path, **{"optim.lr": 0.02, "train.total_steps": 3})
    with pytest.raises(RunDirError) as err:
        Trainer(changed, reward_fn=sevens_reward, resume=True)
    assert "optim.lr: 0.01 -> 0.02" in str(err.value)
    assert "--resume-with-changes optim.lr (" in str(err.value)  # extending is free
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["optim"]["lr"] == 0.01

    # logging and checkpoint settings are free; the listed keys apply from here on
    changed.logging.progress = True
    tr = Trainer(
        changed,
        reward_fn=sevens_reward,
        resume=True,
        resume_with_changes=("optim.lr", "train.total_steps"),
    )
    assert [g["lr"] for g in tr.optimizer.param_groups] == [0.02]
    history = tr.train()
    assert [h["actor/lr"] for h in history] == [0.02]
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["optim"]["lr"] == 0.02
    resume_event = _history(tmp_path)[2]
    assert resume_event["event"] == "resume" and resume_event["step"] == 2
    assert resume_event["changes"]["optim.lr"] == [0.01, 0.02]
    assert resume_event["changes"]["logging.progress"] == [False, True]
    # each session's provenance: the config it ran (hash), the same prompts, this code
    sessions = RunDir(tmp_path).provenance()
    assert [(p["event"], p["step"]) for p in sessions] == [("start", 0), ("resume", 2)]
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert sessions[1]["config_hash"] == config_hash(saved) != sessions[0]["config_hash"]
    assert sessions[0]["data"] == sessions[1]["data"] and sessions[0]["data"].startswith("sha256")
    assert sessions[1]["git"] == git_state() and sessions[1]["versions"]["torch"] == (
        __import__("torch").__version__
    )


def test_resume_on_a_finished_run_says_so(tiny_world, tmp_path, capsys):
    args = tiny_overrides(
        tiny_world, tmp_path, **{"train.total_steps": 2, "checkpoint.save_final": True}
    )
    assert main(["train", *args]) == 0
    capsys.readouterr()
    assert main(["train", *args, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "already finished at step 2 (train.total_steps=2); nothing to do" in out
    assert "resume with a larger train.total_steps=N" in out
    assert _steps(tmp_path) == [1, 2]
    # extending the finished run needs no --resume-with-changes; the change is recorded
    assert main(["train", *args, "train.total_steps=3", "--resume"]) == 0
    assert _steps(tmp_path) == [1, 2, 3]
    assert _history(tmp_path)[-2]["changes"] == {"train.total_steps": [2, 3]}
    # any other change is still refused, and so is a shorter run
    capsys.readouterr()
    assert main(["train", *args, "train.total_steps=4", "optim.lr=0.5", "--resume"]) == 2
    assert "optim.lr: 0.01 -> 0.5" in capsys.readouterr().err
    assert main(["train", *args, "train.total_steps=2", "--resume"]) == 2
    assert "train.total_steps: 3 -> 2" in capsys.readouterr().err


def test_ctrl_c_prints_one_line_and_exits_130(tiny_world, tmp_path, capsys, monkeypatch):
    real = trainer_mod.Trainer.train_step

    def interrupted_in_step_3(self):
        if self.step == 2:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", interrupted_in_step_3)
    args = tiny_overrides(tiny_world, tmp_path, **{"train.total_steps": 4})
    assert main(["train", *args, "checkpoint.save_every=2"]) == 130
    err = capsys.readouterr().err
    assert (
        err.strip().splitlines()[-1] == "divrl train: interrupted at step 2; resume with --resume"
    )
    assert "Traceback" not in err
    assert [e["event"] for e in _history(tmp_path)] == ["start", "interrupted"]
    assert not (tmp_path / ".lock").exists()
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", real)
    assert main(["train", *args, "checkpoint.save_every=2", "--resume"]) == 0
    assert _steps(tmp_path) == [1, 2, 3, 4]


def test_resume_flags_are_checked(tiny_world, tmp_path):
    cfg = load_config(None, tiny_overrides(tiny_world, tmp_path))
    with pytest.raises(RunDirError, match="exclude each other"):
        Trainer(cfg, resume=True, overwrite=True)
    with pytest.raises(RunDirError, match="unknown config key"):
        Trainer(cfg, resume=True, resume_with_changes=("optim.learning_rate",))


@pytest.mark.slow
def test_a_real_sigint_exits_130_with_one_line(tiny_world, tmp_path):
    """The signal itself, sent to a `divrl train` process mid-run (not a simulated raise)."""
    import signal
    import time

    # far more steps than can run before the signal (500 tiny steps once finished first on a
    # loaded machine, before this process saw the second metrics line)
    args = tiny_overrides(
        tiny_world, tmp_path, **{"train.total_steps": 1_000_000, "checkpoint.save_every": 1}
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    # its own process group, SIGINT at its default (an ignored SIGINT is inherited across
    # exec, and something earlier in a full pytest session can leave it ignored)
    # (stderr to a file: an undrained pipe would block the run's logging)
    err_path = tmp_path.parent / f"{tmp_path.name}_stderr.txt"
    with err_path.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "divrl.cli", "train", *args],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env=env,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # as a Ctrl-C does: the reward workers get it too
    proc.wait(timeout=120)
    err = err_path.read_text()
    assert proc.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("divrl train: interrupted at step ")
    assert last.endswith("; resume with --resume")
    assert "Traceback" not in err
    assert not (tmp_path / ".lock").exists()
    assert _history(tmp_path)[-1]["event"] == "interrupted"


def test_every_process_reads_the_lock_before_the_main_process_takes_it(tmp_path):
    """Two processes of one run (threads here, each with its own session): the slower one's
    check() used to come after the main process had taken the lock, and it refused its own
    run ('in use ... held by pid <rank 0>'); begin_on_all waits for every check first."""
    import threading
    import time

    from divrl.training.run_session import RunSession

    barrier = threading.Barrier(2, timeout=30)

    class ThreadCollective:  # all_gather_object as a collective of the two threads
        world = 2

        def all_gather_object(self, obj):
            barrier.wait()
            return [obj, obj]

    config = load_config(None, [f"logging.output_dir={tmp_path}"])
    errors: list[BaseException] = []

    def process(main_process: bool) -> None:
        try:
            session = RunSession(RunDir(tmp_path), config)
            if not main_process:
                time.sleep(0.5)  # the slow rank: loads its model later
            session.check()
            session.begin_on_all(0, ThreadCollective(), main_process)
            barrier.wait()  # both past the start before the main process ends the run
            if main_process:
                session.end("finish", 0)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=process, args=(m,)) for m in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_resume_records_settings_the_saved_config_lacks(tiny_world, tmp_path, caplog):
    # a run saved by a divrl without algorithm.rollout_is / algorithm.advantage_options
    # (both added later): its resume continues with today's values, says so and records it
    Trainer(_resumable(tiny_world, tmp_path), reward_fn=sevens_reward).train()
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    rollout_is = saved["algorithm"].pop("rollout_is")
    del saved["algorithm"]["advantage_options"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    extended = _resumable(tiny_world, tmp_path, **{"train.total_steps": 3})
    with caplog.at_level("WARNING"):
        Trainer(extended, reward_fn=sevens_reward, resume=True).train()
    resume_event = _history(tmp_path)[2]
    assert resume_event["event"] == "resume"
    assert resume_event["added"]["algorithm.rollout_is"] == rollout_is
    assert resume_event["added"]["algorithm.advantage_options.eps"] == 1e-6
    assert "algorithm.rollout_is=" in caplog.text and "has no value for" in caplog.text
    now = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert now["algorithm"]["rollout_is"] == rollout_is  # config.yaml says what runs now
