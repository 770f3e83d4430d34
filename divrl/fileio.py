"""Writing files so that a crash, a kill or a full disk never leaves half a file.

* :func:`atomic_write_text` / :func:`atomic_write_lines`: write a temp file (unique name)
  beside the target, fsync, rename over it (a reader sees the old file or the new one,
  never a mix);
* :func:`atomic_path`: the same for a writer that wants a path (Parquet, a library's
  ``save``): write to the yielded temp path, and it is renamed over the target (or, with
  ``replace=False``, linked to a name that must still be free) when the block ends;
* :func:`append_record`: append one whole line to a file; a failed write is cut back to the
  file's previous length, so a full disk cannot leave a torn record;
* :class:`DiskFullError`: what a failed write is re-raised as, naming the path and the free
  space on its disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = [
    "DiskFullError",
    "append_record",
    "atomic_path",
    "atomic_write_lines",
    "atomic_write_text",
    "free_bytes",
    "fsync_path",
    "write_failed",
]

_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DiskFullError(OSError):
    """A write failed for lack of space; the message names the path and the free space."""


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the disk holding ``path`` (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _human(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def write_failed(path: str | Path, exc: BaseException) -> OSError:
    """The error to raise for a failed write of ``path``: a :class:`DiskFullError` for a
    full disk (ENOSPC/EDQUOT, or torch's serializer failing with under 64 MiB free), else
    an ``OSError`` naming the path, with the free space either way."""
    free = free_bytes(path)
    full = getattr(exc, "errno", None) in _DISK_FULL_ERRNOS or (
        free is not None and free < 64 * 2**20
    )
    what = "disk full" if full else "write failed"
    message = f"{what} while writing {path}: {exc} ({_human(free)} free on that disk)"
    if full:
        return DiskFullError(errno.ENOSPC, message + "; free some space and rerun with --resume")
    return OSError(getattr(exc, "errno", None) or errno.EIO, message)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Replace ``path`` by ``text`` (UTF-8) atomically: temp file, fsync, rename."""
    return atomic_write_lines(path, (text,))


def atomic_write_lines(path: str | Path, chunks: Iterable[str], *, errors: str = "strict") -> Path:
    """Replace ``path`` by the concatenated ``chunks`` (UTF-8; e.g. JSONL lines, each with
    its newline) atomically, without holding the whole text in memory: a temp file beside
    ``path`` with a unique name (two writers of one path never share it), fsync, rename.
    On any failure the temp file is removed and ``path`` is left as it was. ``errors`` is
    the encoder's (``backslashreplace`` writes a lone surrogate as ``\\udcff``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for chunk in chunks:
                _write_all(fd, chunk.encode("utf-8", errors))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_failed(path, exc) from exc
    except BaseException:  # an encoding error, an interrupt: never leave the temp file
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def atomic_path(path: str | Path, *, replace: bool = True) -> Iterator[Path]:
    """Yield a temp path beside ``path`` to write the whole file to; when the block ends
    without an error, fsync it and rename it to ``path``. ``replace=False`` keeps a file
    that appeared at ``path`` meanwhile (a hard link, which fails on an existing name, takes
    the rename's place): ``FileExistsError``. The temp file never outlives the block."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.{secrets.token_hex(4)}{path.suffix}")
    try:
        yield tmp
        fsync_path(tmp)
        if replace:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # a filesystem without hard links
            if path.exists() or path.is_symlink():
                raise FileExistsError(path) from None
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def append_record(path: str | Path, line: str, *, fsync: bool = False) -> None:
    """Append ``line`` (one record; a newline is added) as a whole: on a failed write the
    file is cut back to its previous length before the error is raised."""
    path = Path(path)
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            _write_all(fd, data)
            if fsync:
                os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise write_failed(path, exc) from exc
    finally:
        os.close(fd)


def fsync_path(path: str | Path) -> None:
    """Flush ``path``'s data to disk (no-op when it does not exist)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
