"""Evaluating a run directory while its training goes on: the chosen checkpoint is pinned.

Training keeps ``checkpoint.keep_last`` checkpoints and deletes older ones; an evaluation
that chose ``checkpoints/step_N/model`` could see it deleted while it loads (the files
vanish one by one). :func:`pin_newest_model` hard-links the newest complete model folder of
a run into ``<run>/.eval_pins/<pid>@<host>-step_N/`` (same filesystem: no copy; a file
keeps its data while a link to it remains), checks the pin is whole, and retries on the
then-newest checkpoint when the chosen one vanished mid-way. The pin is removed when the
process exits, also when it is ended by SIGTERM or SIGHUP (a ``timeout``, a scheduler, a
closed terminal); pins of dead processes (SIGKILL) are swept by the next pin, and by
training when it prunes checkpoints or overwrites the run
(:meth:`divrl.runs.RunDir.sweep_stale_pins`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import threading
from pathlib import Path

from divrl.runs import PIN_DIR, Checkpoint, RunDir

__all__ = ["PIN_DIR", "PinError", "origin_of", "pin_newest_model"]

logger = logging.getLogger(__name__)

_TRIES = 5
_pins: dict[Path, tuple[Path, Path]] = {}  # run root -> (pinned model dir, original)
_origins: dict[str, str] = {}  # pinned model dir -> the checkpoint's model dir


class PinError(FileNotFoundError):
    """No checkpoint of the run could be pinned (each vanished or was incomplete)."""


def origin_of(path: str) -> str:
    """The checkpoint model folder a pinned folder was linked from (else ``path``)."""
    return _origins.get(str(path), str(path))


def _sweep(pins: Path) -> None:
    """Remove pins left by processes that died without cleaning up (kill -9)."""
    RunDir(pins.parent).sweep_stale_pins()


_SIGNALS = ("SIGTERM", "SIGHUP")
_handled: dict[int, object] = {}  # signal -> the handler it had before


def _remove_pins_on_signals() -> None:
    """On SIGTERM / SIGHUP (whose default ends the process without ``atexit``), remove
    this process's pins, then end as the signal would have (its default action). A signal
    with a handler of its own, or a call outside the main thread, is left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    for name in _SIGNALS:
        number = getattr(signal, name, None)
        if number is None or number in _handled or signal.getsignal(number) != signal.SIG_DFL:
            continue
        _handled[number] = signal.SIG_DFL
        signal.signal(number, _on_signal)


def _on_signal(number: int, frame) -> None:
    for pin, _ in list(_pins.values()):
        _cleanup(pin)
    signal.signal(number, _handled.get(number, signal.SIG_DFL))
    os.kill(os.getpid(), number)


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link every file of ``src`` into ``dst`` (copy where links are not possible)."""
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                os.link(Path(root) / name, dst / rel / name)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                shutil.copy2(Path(root) / name, dst / rel / name)
        dirs.sort()


def _weights(folder: Path) -> list[Path]:
    return [*folder.glob("*.safetensors"), *folder.glob("*.bin")]


def _complete(pin: Path, source: Path) -> bool:
    """The pin holds a config, weights (unless the source itself has none), every shard
    its index names, and (if the source is still there) every file of the source."""
    if not (pin / "config.json").is_file():
        return False
    if not _weights(pin) and not (source.is_dir() and not _weights(source)):
        return False  # pruned mid-way (a folder saved without weights is pinned as it is)
    for index in pin.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            return False
        if any(not (pin / s).is_file() for s in shards):
            return False
    with contextlib.suppress(OSError):
        names = {p.relative_to(source) for p in source.rglob("*") if p.is_file()}
        if names and any(not (pin / n).is_file() for n in names):
            return False
    return True


def _cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # the pins folder, once empty


def pin_newest_model(run_dir: str | Path) -> tuple[Path, Checkpoint] | None:
    """``(pinned model folder, checkpoint)`` of the newest checkpoint of ``run_dir`` that
    holds a model, pinned for this process's lifetime; None when the run has none.

    Raises:
        PinError: checkpoints were there but each vanished (or was incomplete) while it
            was being pinned, ``_TRIES`` times over.
    """
    run = RunDir(Path(run_dir).resolve())
    if run.root in _pins:
        return _pins[run.root][0], Checkpoint.at(_pins[run.root][1].parent)
    pins = run.root / PIN_DIR
    seen = []
    for _ in range(_TRIES):
        ckpt = next((c for c in reversed(run.checkpoints()) if c.has_model()), None)
        if ckpt is None:
            break
        seen.append(ckpt.path.name)
        try:
            pins.mkdir(exist_ok=True)
        except OSError as exc:  # a run folder we cannot write: loaded in place, unpinned
            logger.info("%s: cannot pin a checkpoint here (%s); loading it in place", run.root, exc)
            return ckpt.model_dir, ckpt
        _sweep(pins)
        pin = run.pin_path(ckpt.path.name)
        shutil.rmtree(pin, ignore_errors=True)
        try:
            _link_tree(ckpt.model_dir, pin)
        except FileNotFoundError:
            ok = False
        else:
            ok = _complete(pin, ckpt.model_dir)
        if ok:
            _pins[run.root] = (pin, ckpt.model_dir)
            _origins[str(pin)] = str(ckpt.model_dir)
            atexit.register(_cleanup, pin)
            _remove_pins_on_signals()
            return pin, ckpt
        logger.info("%s vanished while it was being pinned (pruned?); trying again", ckpt.path)
        _cleanup(pin)
    if not seen:
        return None
    raise PinError(
        f"{run.root}: the checkpoints {', '.join(dict.fromkeys(seen))} were deleted while "
        "being read (a training run pruning them?); pass one checkpoint folder that stays, "
        "or raise checkpoint.keep_last"
    )
