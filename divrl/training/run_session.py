"""Opening a run directory for writing: nothing mixed, nothing changed behind the checkpoint.

* a new run refuses a folder that holds another run's files (``--resume`` continues it,
  ``--overwrite`` deletes it first);
* ``.lock`` (pid, host) is held while the run writes; a stale lock of a dead process is
  reported and taken over (:class:`divrl.runs.RunLock`);
* on ``--resume`` the config is compared with the run's ``config.yaml``: a change to a
  setting the checkpoint fixes (everything but :data:`FREE_ON_RESUME`) is refused unless
  ``--resume-with-changes`` lists its key; accepted changes go to ``history.jsonl``, and
  so do settings the saved config lacks (added by a newer divrl), with a warning;
* ``run.json`` (the run's id, which its checkpoints carry) and ``config.yaml`` are written
  atomically, under the lock.

:meth:`RunSession.check` only reads (every process calls it, before any model is loaded);
:meth:`RunSession.begin` and :meth:`RunSession.end` write (main process, around the loop;
:meth:`RunSession.begin_on_all` is ``begin`` as every process calls it).
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from divrl.checkpoint.resume import set_corrupt_aside
from divrl.distributed import Collective
from divrl.fileio import append_record, atomic_write_text
from divrl.runs import Checkpoint, RunDir, RunLock
from divrl.training.config import Config, dump_config
from divrl.training.metrics import truncate_metrics

__all__ = [
    "FREE_ON_RESUME",
    "RunDirError",
    "RunSession",
    "config_added",
    "config_changes",
    "config_keys",
]

logger = logging.getLogger(__name__)

#: Keys (or ``section.`` prefixes) that a resumed run may change freely: where and how it
#: logs and checkpoints, and engine settings that do not change what is sampled.
FREE_ON_RESUME = (
    "logging.",
    "checkpoint.",
    "rollout.engine_options.batch_size",
    "rollout.engine_options.gpu_memory_utilization",
)


class RunDirError(ValueError):
    """The run directory cannot be used as asked; the message says what to pass instead."""


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _mappings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Mapping[str, Any]]:
    """Every mapping inside a section (``algorithm.rehearsal_control``), by dotted key."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            if prefix:
                out[f"{prefix}{key}"] = value
            out.update(_mappings(value, f"{prefix}{key}."))
    return out


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, list]:
    """``{dotted key: [saved value, current value]}`` for every key whose value differs
    (keys absent from ``saved``, e.g. added by a newer divrl, are not changes). A mapping
    inside a section (``algorithm.rehearsal_control``, ``algorithm.loss_options``) whose
    keys differ is one change of the whole mapping: one emptied (``{}``: a controller
    switched off) or filled is a change like any other."""
    old, new = _flatten(saved), _flatten(current)
    changes = {k: [old[k], new[k]] for k in sorted(new) if k in old and old[k] != new[k]}
    old_maps, new_maps = _mappings(saved), _mappings(current)
    for key in sorted(set(old_maps) & set(new_maps)):
        a, b = dict(old_maps[key]), dict(new_maps[key])
        inside = [k for k in changes if k.startswith(f"{key}.")]
        if set(_flatten(a)) != set(_flatten(b)) and not any(
            key.startswith(f"{m}.") for m in changes
        ):
            for k in inside:
                del changes[k]
            changes[key] = [a, b]
    return dict(sorted(changes.items()))


def config_added(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """``{dotted key: current value}`` for every setting ``saved`` does not have (added by
    a newer divrl since the run was saved), except those free on resume. A resumed run
    takes them at their current values; they are reported and recorded, not assumed to
    be what the run trained with before."""
    old, new = _flatten(saved), _flatten(current)
    inside_old = set(_mappings(saved))
    return {
        k: v
        for k, v in sorted(new.items())
        if k not in old and not _is_free(k) and not any(k.startswith(f"{m}.") for m in inside_old)
    }


def config_keys(config: Mapping[str, Any]) -> set[str]:
    """The dotted keys a config may be changed by (its values and its mappings)."""
    return set(_flatten(config)) | set(_mappings(config))


def _override_text(value: Any) -> str:
    """``value`` as a ``key=value`` override on the command line reads it back."""
    if value is None or isinstance(value, bool | list | dict):
        return json.dumps(value).replace(" ", "")
    return str(value)


def _is_free(key: str) -> bool:
    return any(key == f or (f.endswith(".") and key.startswith(f)) for f in FREE_ON_RESUME)


def _listed(key: str, allowed: Iterable[str]) -> bool:
    """``key`` is one of ``allowed`` or inside a mapping listed there."""
    return any(key == a or key.startswith(f"{a}.") for a in allowed)


def describe_run(run: RunDir) -> str:
    """A short account of the run files in ``run`` (for refusal messages)."""
    parts = []
    for path in run.run_files():
        if path == run.checkpoints_dir:
            steps = [c.step for c in run.checkpoints()]
            parts.append(f"checkpoints of steps {steps}" if steps else "checkpoints/")
        elif path == run.metrics_path:
            n = sum(1 for line in path.read_bytes().splitlines() if line.strip())
            parts.append(f"metrics.jsonl ({n} records)")
        else:
            parts.append(path.name)
    return ", ".join(parts)


class RunSession:
    """One process's use of a run directory (see the module docstring).

    Args:
        run: the run directory.
        config: the run's (resolved) config.
        resume: continue the run in ``run``.
        overwrite: delete the run files in ``run`` first (a DPH reference store stays).
        allowed_changes: keys that may differ from the run's config.yaml on resume.
    """

    def __init__(
        self,
        run: RunDir,
        config: Config,
        *,
        resume: bool = False,
        overwrite: bool = False,
        allowed_changes: Iterable[str] = (),
    ) -> None:
        if resume and overwrite:
            raise RunDirError("--resume and --overwrite exclude each other: choose one")
        self.run, self.config = run, config
        self.resume, self.overwrite = resume, overwrite
        self.allowed = tuple(allowed_changes)
        self.changes: dict[str, list] = {}
        #: settings the resumed run's config.yaml lacks, at the values it continues with
        self.added: dict[str, Any] = {}
        self.run_id = uuid.uuid4().hex
        self.lock = RunLock(run.lock_path)
        self.claimed = False  # begin() ran once: a later train() call continues the run
        #: divrl.provenance record of this session, added to the run's provenance.json
        self.provenance: dict[str, Any] | None = None
        if self.allowed and not resume:
            raise RunDirError("--resume-with-changes applies to --resume only")
        unknown = [k for k in self.allowed if k not in config_keys(config.to_dict())]
        if unknown:
            raise RunDirError(f"--resume-with-changes: unknown config key(s) {unknown}")

    def check(self) -> None:
        """Refuse what would mix runs or silently change a resumed one (reads only)."""
        run = self.run
        self.lock.raise_if_held()  # fail before loading models; begin() takes it for real
        if self.resume:
            self.run_id = run.run_id() or self.run_id
            if run.config_path.is_file():
                self._compare_config(yaml.safe_load(run.config_path.read_text()) or {})
        elif not self.overwrite and run.run_files():
            raise RunDirError(
                f"{run.root} already holds a run ({describe_run(run)}). Pass --resume to "
                "continue it, --overwrite to delete it and start a new run there, or set "
                "logging.output_dir to another folder"
            )

    def _compare_config(self, saved: Mapping[str, Any]) -> None:
        changes = config_changes(saved, self.config.to_dict())
        fixed = {k: v for k, v in changes.items() if not _is_free(k)}
        refused = {
            k: v
            for k, v in fixed.items()
            if not _listed(k, self.allowed) and not self._extends(k, v)
        }
        if refused:
            listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
            saved_values = " ".join(f"{k}={_override_text(a)}" for k, (a, _) in refused.items())
            raise RunDirError(
                f"--resume: the config differs from {self.run.config_path} in settings the "
                f"checkpoint fixes ({listed}). To continue the run as it was, give its values "
                f"again (add `{saved_values}` to the command, e.g. the overrides of a quick "
                "try); to apply the change from here on, pass --resume-with-changes "
                f"{','.join(refused)} (it is recorded in {self.run.history_path.name}); or "
                "start a new run in another folder"
            )
        self.changes = changes
        self.added = config_added(saved, self.config.to_dict())
        if self.added:
            listed = " ".join(f"{k}={_override_text(v)}" for k, v in self.added.items())
            logger.warning(
                "--resume: %s has no value for %d setting(s) this divrl has (added since the "
                "run was saved); the run continues with %s (recorded in %s)",
                self.run.config_path,
                len(self.added),
                listed,
                self.run.history_path.name,
            )

    def _extends(self, key: str, change: list) -> bool:
        """A finished run (its newest checkpoint at its ``train.total_steps``) may be
        extended by a larger ``train.total_steps`` without ``--resume-with-changes``."""
        old, new = change
        if key != "train.total_steps" or not isinstance(old, int) or not new > old:
            return False
        ckpts = self.run.checkpoints()
        return bool(ckpts) and ckpts[-1].step >= old

    def begin(self, step: int) -> None:
        """Take the lock and write the run's files (main process): run.json, config.yaml
        and a history record for a new run; config changes for a resumed one."""
        run = self.run
        run.root.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            event = self._claim(step)
        except BaseException:
            self.lock.release()
            raise
        if self.lock.stale is not None:
            event["stale_lock"] = self.lock.stale
            logger.warning(
                "%s: took over a stale lock of pid %s on %s (that process is gone)",
                run.root,
                self.lock.stale.get("pid"),
                self.lock.stale.get("host"),
            )
        self.record(event)
        if self.provenance is not None and event["event"] != "continue":
            run.add_provenance({"event": event["event"], "step": step, **self.provenance})

    def begin_on_all(
        self, step: int, collective: Collective, main: bool, corrupt: Sequence[Checkpoint] = ()
    ) -> None:
        """Every process calls this before the first write: the main process (``main``)
        takes the lock and writes the run's files (:meth:`begin`); on resume it cuts
        metrics.jsonl back to the checkpoint's ``step`` and moves the ``corrupt``
        checkpoints (those that failed to load) aside. Every process learns whether that
        worked, so that a refused lock stops all of them instead of leaving the others
        waiting."""
        # every process has read the lock in check() before the main process takes it
        # (a slow rank read it after and refused the run: "in use ... by pid <rank 0>")
        collective.all_gather_object(None)
        error = None
        if main:
            try:
                self.begin(step)
                if self.resume:
                    truncate_metrics(self.run.metrics_path, step)
                    set_corrupt_aside(self.run, list(corrupt))
            except Exception as exc:
                error = exc
        failed = any(collective.all_gather_object(error is not None))
        if error is not None:
            if self.lock.held:
                self.end("failed", step)
            raise error
        if failed:
            raise RuntimeError("the main process could not open the run directory (see its error)")

    def _claim(self, step: int) -> dict[str, Any]:
        run = self.run
        event: dict[str, Any] = {"event": "resume" if self.resume else "start", "step": step}
        if self.claimed:  # the same Trainer's train() called again (e.g. with max_steps)
            if run.run_id() != self.run_id:
                raise RunDirError(f"{run.root} was replaced by another run meanwhile")
            return {"event": "continue", "step": step}
        self.claimed = True
        if self.resume:
            if run.run_id() not in (None, self.run_id):
                raise RunDirError(f"{run.root} was replaced by another run while loading")
            if not run.identity_path.is_file():  # a run from before run.json existed
                self._write_identity()
            if self.changes:
                event["changes"] = self.changes
            if self.added:
                event["added"] = self.added
            if self.changes or self.added or not run.config_path.is_file():
                atomic_write_text(run.config_path, dump_config(self.config))
            return event
        present = run.run_files()
        if present and not self.overwrite:  # another run started here since check()
            raise RunDirError(f"{run.root} already holds a run ({describe_run(run)})")
        if present:
            event["overwrote"] = describe_run(run)
            # the replaced run's evaluation (divrl eval --out RUN/eval) would otherwise be
            # read by divrl report as the new run's
            if (run.root / "eval").is_dir():
                present.append(run.root / "eval")
                event["overwrote"] += ", eval/"
            logger.warning("--overwrite: deleting %s in %s", event["overwrote"], run.root)
            for path in present:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            run.sweep_stale_pins()  # a live evaluation's pin stays: it reads it
        self._write_identity()
        atomic_write_text(run.config_path, dump_config(self.config))
        return event

    def _write_identity(self) -> None:
        identity = {"run_id": self.run_id, "created": time.time(), "host": socket.gethostname()}
        atomic_write_text(self.run.identity_path, json.dumps(identity, indent=2) + "\n")

    def record(self, event: Mapping[str, Any]) -> None:
        """Append ``event`` to history.jsonl (whole record, fsynced)."""
        line = json.dumps({"time": time.time(), **event}, default=str)
        append_record(self.run.history_path, line, fsync=True)

    def end(self, event: str, step: int) -> None:
        """Record how the run ended (``finish``, ``interrupted``, ``failed``), release."""
        try:
            self.record({"event": event, "step": step})
        except OSError as exc:  # e.g. the disk is still full: keep the original error
            logger.warning("could not record %r in %s: %s", event, self.run.history_path, exc)
        finally:
            self.lock.release()
