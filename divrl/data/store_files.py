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
  under the lock.
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
    "replace_store_dir",
    "store_lock",
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


def check_store_target(path: str | Path, overwrite: bool = False, flag: str = "--overwrite"):
    """Raise :class:`StoreTargetError` unless ``path`` is free, an empty folder, or a
    reference store (or ``overwrite`` is set): presample replaces what is there."""
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


@contextlib.contextmanager
def store_lock(path: str | Path) -> Iterator[None]:
    """Hold the exclusive ``flock`` of ``.<name>.lock`` beside store ``path`` (waits for
    another writer of the same path; the kernel drops it when a writer dies)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.parent / f".{path.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("%s: another process writes this store; waiting for it", path)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # a filesystem without flock
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            logger.warning("%s: no file locks on this filesystem; writing unlocked", path)
        yield
    finally:
        os.close(fd)


def new_temp_dir(path: Path) -> Path:
    """A fresh, uniquely named folder beside ``path`` (same filesystem: renames work)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp", dir=path.parent))


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
    else:
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old", dir=path.parent))
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
