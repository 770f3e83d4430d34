"""The layout of a training run directory, known in one place.

A run directory (``logging.output_dir``) holds::

    run.json                    the run's identity: run_id, created (written once)
    config.yaml                 the resolved config of the run
    history.jsonl               one record per start / resume / overwrite / finish / interrupt
    provenance.json             where each start / resume came from (divrl.provenance: the
                                commit, versions, config hash, data fingerprint, threads,
                                machine), one record per session, oldest first
    .lock                       held while a process writes the run: pid, host, since
    metrics.jsonl               one JSON record per training step
    tensorboard/                TensorBoard events (optional)
    checkpoints/step_NNNNNN/    one per saved step: ``state/`` (accelerate: model,
                                optimiser, RNG), ``scheduler.pt``, ``trainer_state.json``
                                and ``model/`` (a plain transformers directory)
    checkpoints/.tmp_step_*/    a checkpoint being written (renamed when complete)
    checkpoints/corrupt_step_*/ a checkpoint that failed to load, moved aside
    .eval_pins/<pid>@<host>-step_NNNNNN/  a checkpoint's model hard-linked by a running
                                `divrl eval --model RUN` (removed when it ends; a dead
                                process's pin is swept by :meth:`RunDir.sweep_stale_pins`)

Each checkpoint's ``trainer_state.json`` holds the ``run_id`` of the run that wrote it:
pruning deletes only the run's own checkpoints (:meth:`RunDir.own_checkpoints`).

This module sits below training and evaluation (it imports neither): both ask it where
things are.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from divrl.fileio import atomic_write_text

__all__ = ["Checkpoint", "RunDir", "RunLock", "RunLockedError"]

_STEP_DIR = re.compile(r"step_(\d+)")


@dataclass(frozen=True)
class Checkpoint:
    """One saved step of a run."""

    path: Path
    step: int

    @classmethod
    def at(cls, path: str | Path) -> Checkpoint:
        """The checkpoint directory ``path`` (its step read from a ``step_N`` name, else -1)."""
        path = Path(path)
        match = _STEP_DIR.fullmatch(path.name)
        return cls(path, int(match.group(1)) if match else -1)

    @property
    def model_dir(self) -> Path:
        """The checkpoint's transformers model directory."""
        return self.path / "model"

    @property
    def state_dir(self) -> Path:
        """accelerate's state (model, optimiser, RNG states)."""
        return self.path / "state"

    @property
    def scheduler_path(self) -> Path:
        return self.path / "scheduler.pt"

    @property
    def trainer_state_path(self) -> Path:
        return self.path / "trainer_state.json"

    def has_model(self) -> bool:
        return (self.model_dir / "config.json").is_file()

    def run_id(self) -> str | None:
        """The ``run_id`` its trainer state records (None: unreadable or not recorded)."""
        try:
            return json.loads(self.trainer_state_path.read_text()).get("run_id")
        except (OSError, ValueError, AttributeError):
            return None


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory (nothing is created until a writer asks)."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    @property
    def identity_path(self) -> Path:
        return self.root / "run.json"

    @property
    def history_path(self) -> Path:
        return self.root / "history.jsonl"

    @property
    def provenance_path(self) -> Path:
        return self.root / "provenance.json"

    def provenance(self) -> list[dict]:
        """The provenance records of the run's sessions, oldest first ([] when the run has
        none: from before they were written, or the file is unreadable)."""
        try:
            sessions = json.loads(self.provenance_path.read_text()).get("sessions")
        except (OSError, ValueError, AttributeError):
            return []
        return [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []

    def add_provenance(self, record: dict) -> None:
        """Append one session's provenance record to ``provenance.json`` (written whole)."""
        sessions = [*self.provenance(), record]
        text = json.dumps({"sessions": sessions}, indent=2, default=str) + "\n"
        atomic_write_text(self.provenance_path, text)

    @property
    def lock_path(self) -> Path:
        return self.root / ".lock"

    @property
    def pins_dir(self) -> Path:
        return self.root / PIN_DIR

    def pin_path(self, step_name: str) -> Path:
        """This process's pin of checkpoint ``step_name`` (``step_NNNNNN``)."""
        return self.pins_dir / f"{os.getpid()}@{socket.gethostname()}-{step_name}"

    def sweep_stale_pins(self) -> list[Path]:
        """Remove the pins of processes of this host that are gone (killed with SIGKILL,
        or from before pins were removed on SIGTERM): each keeps a pruned checkpoint's data
        on disk. Pins of live processes and of other hosts stay. Returns the removed ones."""
        removed = []
        for pin in sorted(self.pins_dir.glob("*-step_*")) if self.pins_dir.is_dir() else []:
            match = _PIN_NAME.fullmatch(pin.name)
            if match is None or match["host"] not in (None, socket.gethostname()):
                continue
            pid = int(match["pid"])
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(pin, ignore_errors=True)
                removed.append(pin)
        with contextlib.suppress(OSError):
            self.pins_dir.rmdir()  # once empty
        return removed

    def run_files(self) -> list[Path]:
        """The files and folders of a training run present here (a DPH reference store or
        anything else a user put in the folder is not listed)."""
        names = (
            "run.json",
            "config.yaml",
            "history.jsonl",
            "provenance.json",
            "metrics.jsonl",
            "tensorboard",
        )
        found = [self.root / n for n in names if (self.root / n).exists()]
        if self.checkpoints_dir.is_dir() and any(self.checkpoints_dir.iterdir()):
            found.append(self.checkpoints_dir)
        return found

    def run_id(self) -> str | None:
        """The id recorded in ``run.json`` (None when absent or unreadable)."""
        try:
            return json.loads(self.identity_path.read_text()).get("run_id")
        except (OSError, ValueError, AttributeError):
            return None

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Checkpoint:
        """Where the checkpoint of ``step`` is (or would be) written."""
        return Checkpoint(self.checkpoints_dir / f"step_{step:06d}", step)

    def temp_checkpoint_path(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is written before its atomic rename."""
        return self.checkpoints_dir / f".tmp_step_{step:06d}"

    def checkpoints(self) -> list[Checkpoint]:
        """Complete checkpoints, oldest step first (temp directories are not listed)."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = []
        for path in self.checkpoints_dir.iterdir():
            match = _STEP_DIR.fullmatch(path.name)
            if match and path.is_dir():
                found.append(Checkpoint(path, int(match.group(1))))
        return sorted(found, key=lambda c: c.step)

    def own_checkpoints(self, run_id: str) -> list[Checkpoint]:
        """The checkpoints written by run ``run_id``, oldest step first."""
        return [c for c in self.checkpoints() if c.run_id() == run_id]

    def corrupt_checkpoint_path(self, step: int) -> Path:
        """Where a checkpoint that failed to load is moved (not listed by checkpoints())."""
        return self.checkpoints_dir / f"corrupt_step_{step:06d}"

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint, or None."""
        ckpts = self.checkpoints()
        return ckpts[-1] if ckpts else None

    def final_model(self) -> Path | None:
        """The model directory of the newest checkpoint that holds one, or None."""
        for ckpt in reversed(self.checkpoints()):
            if ckpt.has_model():
                return ckpt.model_dir
        return None


PIN_DIR = ".eval_pins"
# <pid>-step_N (older pins) or <pid>@<host>-step_N
_PIN_NAME = re.compile(r"(?P<pid>\d+)(?:@(?P<host>.+))?-step_\w+")


class RunLockedError(RuntimeError):
    """The run directory is locked by another live process (or one on another host)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


class RunLock:
    """``.lock`` in a run directory, created exclusively, holding pid, host and start time.

    A lock left by a dead process on this host (kill -9, power loss) is stale: it is
    reported and taken over. A lock of a live process, or of another host (its pid cannot
    be checked), is refused with what it holds and how to remove it.

    Taking a lock (create, or read a stale one, unlink it and create) runs under an
    exclusive ``flock`` of the run directory, so two processes taking over the same stale
    lock cannot both win: without it, B, having read the stale lock before A replaced it,
    would unlink A's fresh lock and create its own.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.stale: dict | None = None  # the stale lock taken over, if any
        self._held = False

    def holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"pid": None, "host": None, "since": None}

    def acquire(self) -> RunLock:
        with self._guard():
            return self._acquire()

    @contextlib.contextmanager
    def _guard(self):
        """Exclusive flock of the run directory while the lock is read, taken over or made
        (flock on a directory: no extra file; released when the descriptor closes)."""
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:  # a filesystem without flock: the O_EXCL create remains
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
            yield
        finally:
            os.close(fd)

    def _acquire(self) -> RunLock:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                held = self.holder() or {}
                if self._is_stale(held):
                    self.stale = held
                    self.path.unlink(missing_ok=True)
                    continue
                raise self._locked_error(held) from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._held = True
            return self
        raise RunLockedError(f"could not take {self.path}")

    def raise_if_held(self) -> None:
        """Raise :class:`RunLockedError` when a live process holds the lock (reads only)."""
        held = self.holder()
        if held is not None and not self._held and not self._is_stale(held):
            raise self._locked_error(held)

    @staticmethod
    def _is_stale(held: dict) -> bool:
        pid, host = held.get("pid"), held.get("host")
        return host == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid)

    def _locked_error(self, held: dict) -> RunLockedError:
        since = held.get("since")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
        return RunLockedError(
            f"{self.path.parent} is in use: {self.path} is held by pid {held.get('pid')} on "
            f"host {held.get('host')} since {when}. Wait for that run to end, or, if no "
            f"process is using it (e.g. the other host is down), delete {self.path}"
        )

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._held

    def release(self) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
