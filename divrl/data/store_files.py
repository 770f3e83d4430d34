"""Writing a DPH reference store directory whole, by one writer at a time, over nothing
but an older store.

* Only a folder that is a reference store (its ``manifest.json`` a JSON object written by
  divrl, nothing beside the store's three files) or an empty folder is replaced; anything
  else at the path is refused unless ``overwrite`` is set (``divrl presample --overwrite``).
* Writers of one path take an exclusive ``flock`` of ``.<name>.lock`` beside it: a second
  writer waits for the first and then replaces its store whole, never mixing files.
* The files go to a uniquely named temp folder beside the target, are fsynced, and the
  folder is swapped in with one ``renameat2(RENAME_EXCHANGE)`` where the kernel has it (a
  reader sees the old store or the new one, never no store); elsewhere with two renames
  under the lock; a writer killed between those renames leaves the previous store in
  ``.<name>.oldXXXXXXXX/``, put back by the next writer or reader (:func:`recover_store`).
* Each writer first removes the temp folders of writers that died (:func:`sweep_leftovers`).
* Readers hold a shared lock while they open the files, so they never read the manifest of
  one store with the samples of another.
* The folder gets the permissions of any new folder under the umask.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST",
    "PROMPTS",
    "SAMPLES",
    "STORE_FILES",
    "ReferenceStoreError",
    "StoreTargetError",
    "check_store_target",
    "recover_store",
    "replace_store_dir",
    "store_lock",
    "sweep_leftovers",
]

logger = logging.getLogger(__name__)

SAMPLES, PROMPTS, MANIFEST = "samples.parquet", "prompts.parquet", "manifest.json"
STORE_FILES = frozenset({SAMPLES, PROMPTS, MANIFEST})
#: the manifest keys by which a folder is recognised as a store (older stores lack FORMAT)
FORMAT_KEY, FORMAT = "format", "divrl reference store"
_LEGACY_KEYS = ("log_prob_temperature", "sampling", "fingerprint", "stats")


class ReferenceStoreError(ValueError):
    """A reference store cannot be written or used; the message names the file and what
    to do."""


class StoreTargetError(ReferenceStoreError):
    """``reference.store`` names something that is not a reference store."""


def _is_store_manifest(path: Path) -> bool:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict):
        return False
    return manifest.get(FORMAT_KEY) == FORMAT or any(k in manifest for k in _LEGACY_KEYS)


def check_store_target(
    path: str | Path,
    overwrite: bool = False,
    flag: str = "--overwrite",
    source: dict[str, str] | None = None,
):
    """Raise :class:`StoreTargetError` unless ``path`` is free, an empty folder, or a
    reference store (or ``overwrite`` is set): presample replaces what is there.

    ``source``: ``{"train_data": path, "model": path or id}`` of the presample about to
    run; a store there presampled from other data or another model is another run's (two
    configs sharing one ``reference.store``) and is refused too, unless ``overwrite``.
    """
    path = Path(path)
    if overwrite or not (path.exists() or path.is_symlink()):
        return
    if path.is_symlink():
        raise StoreTargetError(
            f"reference.store {path} is a symbolic link (to {os.readlink(path)}); set "
            f"reference.store to the folder it points to, or pass {flag} to replace the link"
        )
    if not path.is_dir():
        raise StoreTargetError(
            f"reference.store {path} is a file, not a reference store folder: set "
            f"reference.store to another path, or pass {flag} to replace it"
        )
    entries = sorted(p.name for p in path.iterdir())
    if not entries:
        return
    others = [n for n in entries if n not in STORE_FILES]
    if not others and _is_store_manifest(path / MANIFEST):
        _refuse_another_source(path, source, flag)
        return
    what = (
        f"holds files that are not part of a reference store ({', '.join(others[:5])}"
        f"{', ...' if len(others) > 5 else ''})"
        if others
        else f"has no readable divrl {MANIFEST}"
    )
    raise StoreTargetError(
        f"reference.store {path} {what}; presample would delete them. Set reference.store "
        f"to another folder, or pass {flag} to delete that folder and write the store there"
    )


def _refuse_another_source(path: Path, source: dict[str, str] | None, flag: str) -> None:
    if source is None:
        return
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    differ = [
        f"{key} {manifest.get(key)} (this presample: {value})"
        for key, value in source.items()
        if key in manifest and not _same_source(manifest[key], value)
    ]
    if differ:
        raise StoreTargetError(
            f"reference.store {path} holds a store presampled from other inputs "
            f"({'; '.join(differ)}): another config's store, which this presample would "
            f"replace. Set reference.store to a folder of this run's own, or pass {flag} to "
            "replace it"
        )


def _same_source(recorded: Any, value: str) -> bool:
    """Two paths are one source when they name the same file; hub ids compare as text."""
    if str(recorded) == str(value):
        return True
    a, b = Path(str(recorded)).expanduser(), Path(str(value)).expanduser()
    return a.exists() and b.exists() and a.resolve() == b.resolve()


@contextlib.contextmanager
def store_lock(path: str | Path, shared: bool = False) -> Iterator[None]:
    """Hold the ``flock`` of ``.<name>.lock`` beside store ``path``: exclusive for a writer
    (waits for other writers and readers of the same path), ``shared`` for a reader (waits
    for a writer's swap, so that the three files it opens are of one store). The kernel
    drops it when a process dies. A reader that cannot create the lock file (a read-only
    folder, where nothing writes either) reads unlocked."""
    path = Path(path)
    lock = path.parent / f".{path.name}.lock"
    try:
        if not shared:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        if not shared or exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT):
            raise
        yield
        return
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("%s: another process writes this store; waiting for it", path)
            fcntl.flock(fd, mode)
        except OSError as exc:  # a filesystem without flock
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            logger.warning("%s: no file locks on this filesystem; working unlocked", path)
        yield
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask (read without changing it where ``/proc`` says it)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_temp_dir(path: Path) -> Path:
    """A fresh, uniquely named folder beside ``path`` (same filesystem: renames work), with
    the permissions of any new folder under the umask (``mkdtemp`` makes it 0700, which the
    store kept once swapped in)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.{_TMP}", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


_TMP, _OLD = "tmp", "old"


def _leftovers(path: Path, kind: str) -> list[Path]:
    """Folders named as :func:`new_temp_dir` (``kind`` tmp) or the fallback swap (``kind``
    old) name them for store ``path``: ``.<name>.<kind>`` and mkdtemp's 8 characters."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.{kind}[a-z0-9_]{{8}}")
    if not path.parent.is_dir():
        return []
    return sorted(
        p
        for p in path.parent.iterdir()
        if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
    )


def recover_store(path: Path, lock: bool = False) -> Path | None:
    """Put back the previous store when a writer died between the two renames of the
    fallback swap (no store at ``path``, the previous one in ``.<name>.oldXXXXXXXX/``).
    Call under :func:`store_lock`, or with ``lock=True`` (a reader: it takes the lock only
    when there is something to put back, and where it cannot, a read-only folder, leaves
    it for its error message to name). Returns the folder it came from, or None."""
    if path.exists() or path.is_symlink() or not _leftovers(path, _OLD):
        return None
    if lock:
        with contextlib.suppress(OSError), store_lock(path):
            return recover_store(path)
        return None
    for old in _leftovers(path, _OLD):
        previous = old / path.name
        if _is_store_manifest(previous / MANIFEST):
            os.replace(previous, path)
            logger.warning(
                "%s: a writer was stopped while replacing this store; the previous store was "
                "put back from %s",
                path,
                old,
            )
            _remove(old)
            return old
    return None


def sweep_leftovers(path: Path) -> list[Path]:
    """Remove what writers of ``path`` that died left beside it (their temp folders, and
    the fallback swap's old folders once the previous store is back). Call under the
    exclusive :func:`store_lock`: no live writer then owns such a folder."""
    recover_store(path)
    removed = [p for kind in (_TMP, _OLD) for p in _leftovers(path, kind)]
    for folder in removed:
        _remove(folder)
    if removed:
        logger.info("%s: removed %d folder(s) left by interrupted writers", path, len(removed))
    return removed


def _fsync_tree(folder: Path) -> None:
    for name in os.listdir(folder):
        fd = os.open(folder / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False where that is not available."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"could not swap {a} and {b}: {os.strerror(err)}")


def replace_store_dir(tmp: Path, path: Path) -> None:
    """Put the complete folder ``tmp`` at ``path`` (call under :func:`store_lock`)."""
    _fsync_tree(tmp)
    if not (path.exists() or path.is_symlink()):
        os.replace(tmp, path)
    elif path.is_dir() and not path.is_symlink() and _exchange(tmp, path):
        _remove(tmp)  # now the old store
    else:  # a kill between these renames is undone by recover_store
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.{_OLD}", dir=path.parent))
        os.replace(path, old / path.name)
        os.replace(tmp, path)
        _remove(old)
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def manifest_text(manifest: dict[str, Any]) -> str:
    return json.dumps({FORMAT_KEY: FORMAT, **manifest}, indent=2, sort_keys=True) + "\n"
